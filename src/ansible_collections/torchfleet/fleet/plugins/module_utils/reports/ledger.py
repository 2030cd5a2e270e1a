"""The fleet's ledger: what happened to each host in every preflight and run, kept across runs
(issue 60; docs/ledger.md). A decaying score per host orders the spares and quarantines the
lemons; `torchfleet hosts` shows and edits it; a Prometheus textfile exports it.

This module is the ledger's policy: what a report says of each host (and what is the shared
cause's, no host's), the score, the decision to quarantine. How it is kept (engines, schema,
migrations, transactions) is reports/ledger_store.py's.

Fail open: no method raises (ledger_store.Store): a ledger that cannot be used turns the Fleet
off after one sentence in `warnings`; the run never pays for it. Reports come from other hosts'
bytes: every field is checked before it is used.
"""
from __future__ import annotations

import calendar
import dataclasses
import json
import math
import os
import time
from collections import Counter

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import ledger_store
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import rundir
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.goodput import finite
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.ledger_store import (
    HOSTS, INCIDENTS, PENDING, TEXT_MAX, _bulk, _count, _set_host, _text, _took_part, actions_of, add_actions,
    add_events, drained_since, events_since, host_states, incident_rows, kinds_since, load_settings,
    lock_decisions, newest_incidents, prune, quarantine_end, runs_since, save_settings, settle_drains)

# The key a host is kept under: node3, NODE3 and node3.cluster.example are one host
# (ledger_store.canonical_host; docs/ledger.md "Which host").
_host = ledger_store.canonical_host
# A run's key in the ledger: its run_id, and after RUN_KEY_SEP the token of its run directory
# (memory.run_token), so that a run_id used again by another controller with the same
# fleet_db is another run, not a second strike of the first. What people read is the run_id.
RUN_KEY_SEP = "@"
# A controller's clock further than this from the PostgreSQL server's is said (its report's
# times are moved onto the server's clock all the same).
SKEW_S = 30.0

CHECK_ID = "fleet.ledger"
NOW_ENV = "TORCHFLEET_LEDGER_NOW"

# What an incident says about its host (docs/ledger.md "The score"). A host's score adds, for
# each attempt of each run it took part in, the weight of that attempt's heaviest incident (one
# failure seen as culprit, lost and drained is one failure; a host lost in ten attempts is ten),
# each halved every half_life_h from when it happened. A rank's own exit (or OOM kill) in
# several attempts of one run is one strike: the same script failing the same way each time
# with restart_on=any says the script, not the host.
WEIGHTS = {
    "culprit": 1.0,     # the first failure's host (not a consequence, not run-wide)
    "hardware": 1.5,    # a fatal hardware event (Xid 79, an uncorrectable AER, a GPU reset)
    "drained": 1.5,     # drained for one (the same evidence)
    "lost": 1.0,        # stopped answering during a run
    "hang": 1.0,        # the rank a hang's collective waited for
    "straggler": 0.5,   # the others waited for it
    "restart": 0.5,     # left behind by a restart
    "check": 0.5,       # a failed check of its own (fewer than most hosts'), an error
    "warning": 0.0,     # a health warning, a hardware warning: its history, never its score
}
# A culprit whose failure is not its alone (other hosts failed on their own too: the script,
# not the host) or the workload's memory (the OOM killer) says less.
SHARED_CULPRIT = 0.25
KINDS = tuple(WEIGHTS)
# The check each kind is reported under (last_incident's check).
KIND_CHECK = {"hardware": "run.hardware", "drained": "run.hardware", "lost": "host.lost",
              "hang": "run.hang", "straggler": "run.straggler", "restart": "run.restart"}
# Checks that are the ledger's own, or that another kind already records (run.oom: the
# culprit's, a quarter: the workload's memory).
# host.skipped: a host left out is recorded by what left it out (its own failed check, its
# quarantine), not again for being left out.
NOT_INCIDENTS = ("host.quarantined", "host.skipped", CHECK_ID, "run.exit", "host.lost",
                 "run.hang", "run.hardware", "run.straggler", "run.restart", "run.oom")
# Which failed checks are recorded against their host: one rule for every check, by design,
# not by its name. A failure most hosts of one check share (at least half of the hosts checked,
# and at least 2) is the shared cause's, the input, the controller, the network between: it is
# recorded once, as a fleet event naming the cause, and is no strike against any host (six
# preflights with a wrong nproc_per_node failing gpu.count everywhere quarantine nobody). A
# failure fewer share singles its hosts out. The same holds for a run's own failures (a
# script failing on most hosts, a fatal hardware event on most hosts, a hang's missing ranks).
SHARED_MIN = 2
SHARED_CAUSE = "a shared cause (the input, the controller, the network between)"
# Hosts lost at one moment: LOST_TOGETHER or more hosts of one run lost within lost_after_s of
# each other (a top-of-rack switch, a PDU, the master's NIC) are one shared event, whatever
# their share; a host lost alone, or beside one other, still counts.
LOST_TOGETHER = 3
LOST_AFTER_S = float(defaults.default("lost_after_s"))
LOST_CAUSE = "a shared cause (a switch, a PDU, the master's NIC, the network between)"
SHARED_HOSTS_MAX = 64   # a fleet event names this many of its hosts (it counts them all)
# The circuit breaker (docs/ledger.md): torchfleet quarantines or drains on its own at most
# quarantine_max_fraction of a group's hosts within quarantine_h; past it, none of them.
BREAKER_CHECK = "fleet.breaker"
AUTO_REASON = "score "  # how the ledger's own quarantines begin (by hand: the user's reason)
# What another job or process holds (gpu.busy, port.in_use) and the controller's input never
# say anything of a host, however few hosts fail them.
NEVER_THE_HOSTS = ("gpu.busy", "port.in_use", "run_id.used", "world.size")
NEVER_PREFIXES = ("input.",)
# A worker's failure of these is the master's when most workers failed one (reports/spares.py).
MASTER_BOUND = ("port.blocked", "port.ephemeral", "nic.route")
# The first failure's reason (runstate.py) and the check it is reported under (as
# runstate.check_of says it; any other reason of a host is run.exit).
REASON_CHECK = {"lost": "host.lost", "hung": "run.hang", "hardware": "run.hardware",
                "oom": "run.oom", "straggler": "run.straggler"}
# A culprit's failures of these are its script's own doing (its exit, its memory).
SCRIPT_CHECKS = ("run.exit", "run.oom")
RUN_WIDE = ("hung", "timeout", "controller_lost", "stopped_by_user")
HISTORY_S = 7 * 86400.0  # the history line's window
EVENTS_MAX = 100         # fleet events a listing shows
DECAYED_OUT = 20         # half-lives past which an incident no longer counts (2**-20)


def now():
    """time.time(), or TORCHFLEET_LEDGER_NOW (epoch seconds) when set: the tests' clock."""
    value = os.environ.get(NOW_ENV, "")
    try:
        at = float(value) if value else None
    except ValueError:
        at = None
    return at if at is not None and math.isfinite(at) else time.time()


def _list(value):
    return value if isinstance(value, list) else []


def _dict(value):
    return value if isinstance(value, dict) else {}


def shown(run_key):
    """The run_id of a run's key in the ledger (RUN_KEY_SEP)."""
    return run_key.split(RUN_KEY_SEP, 1)[0] if isinstance(run_key, str) else run_key


def _int(value, default=0):
    return value if isinstance(value, int) and not isinstance(value, bool) \
        and -(1 << 31) < value < (1 << 31) else default


def iso(at):
    return None if at is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def hw_label(kind, code):
    """An event's class and code as people say it: Xid 79, aer fatal, mlx5 health."""
    kind = _text(kind, 32) or "event"
    code = _text(code if isinstance(code, str) else str(code) if finite(code) is not None
                 else "", 64)
    return ("Xid" if kind == "xid" else kind) + (" " + code if code else "")


# ---- What a report says about each host ----

@dataclasses.dataclass
class Found:
    """What one report says: `incidents` {key: incident} against single hosts, `hosts` that
    took part, and `shared`: the fleet events, failures most hosts shared (each a dict of
    attempt, check, hosts, what, at), recorded once and against no host."""
    incidents: dict = dataclasses.field(default_factory=dict)
    hosts: list = dataclasses.field(default_factory=list)
    shared: list = dataclasses.field(default_factory=list)
    # {attempt: when its failure happened (epoch s) or None}
    moments: dict = dataclasses.field(default_factory=dict)
    checked: dict = dataclasses.field(default_factory=dict)  # {attempt: the hosts it had}
    # The run's own lost_after_s (train.json's settings), the default where it says none.
    lost_after_s: float = LOST_AFTER_S


def shared(failed_by, checked):
    """Whether a failure of `failed_by` of the `checked` hosts is the shared cause's: most of
    them, at least half and at least 2 (1 of 2 still singles a host out)."""
    return failed_by >= SHARED_MIN and failed_by * 2 >= checked


def breaker_limit(group_size, fraction, whole=False):
    """How many of a group's `group_size` hosts torchfleet may quarantine or drain on its own
    (within quarantine_h): quarantine_max_fraction of them, rounded down, at least one; a
    fraction of 1 or more, all (the breaker off). A quarantine never takes the whole group (a
    fleet of one host is never quarantined on its own: nothing tells its fault from a shared
    cause); a drain may (`whole`: one run's hosts are not the fleet, and a host whose GPU
    fell off the bus is drained alone)."""
    fraction = finite(fraction)
    fraction = defaults.default("quarantine_max_fraction") if fraction is None else fraction
    size = max(int(group_size), 0)
    if fraction >= 1:
        return size
    limit = max(1, int(math.floor(size * max(fraction, 0.0) + 1e-9)))
    return limit if whole else min(limit, max(size - 1, 0))


def breaker_words(hosts, group_size, fraction, verb, held=0):
    """The circuit breaker's one sentence: what it kept from being done, and why."""
    return ("fleet-wide cause suspected: %d host%s (%s) of %d would be %s%s, past "
            "quarantine_max_fraction %g: none is; look for what they share (a switch, a "
            "rack's power, the input, a driver roll-out)" % (
                len(hosts), "" if len(hosts) == 1 else "s",
                ", ".join(sorted(hosts)[:8]) + (", ..." if len(hosts) > 8 else ""),
                group_size, verb, " beside %d already" % held if held else "", fraction))


def _epoch(value):
    """A report's time: epoch seconds, or train.json's ISO 8601 UTC; None when neither."""
    if isinstance(value, str) and len(value) == 20:
        try:
            return float(calendar.timegm(time.strptime(value, "%Y-%m-%dT%H:%M:%SZ")))
        except ValueError:
            return None
    return finite(value) if not isinstance(value, bool) else None


def _incident(found, host, attempt, kind, detail="", check="", weight=None, info="", at=None):
    host = _host(host)
    if not host or host == "controller":
        return
    detail = _text(detail, 120)
    key = (host, attempt, kind, detail)
    at = _epoch(at)
    if at is None:
        at = found.moments.get(attempt)
    before = found.incidents.get(key)
    if before is not None and before["at"] is not None and (at is None or before["at"] <= at):
        at = before["at"]  # the same incident seen twice: its first time
    found.incidents[key] = {
        "host": host, "attempt": attempt, "kind": kind, "detail": detail,
        "check_id": _text(check or KIND_CHECK.get(kind) or detail, 64),
        "weight": WEIGHTS[kind] if weight is None else weight, "info": _text(info, TEXT_MAX),
        "at": at}


def _failure_incidents(found, failure, attempt, outcomes):
    """The first failure's culprit (an attempt's record failure, or train.json's first_failure:
    both carry host, reason (or failure), consequence, collective)."""
    failure = _dict(failure)
    reason = _text(failure.get("reason") if "failure" not in failure else failure.get("failure"),
                   32)
    if reason == "hung":  # a run-wide failure: the ranks its collective waited for are named
        # (missing: never joined; a mismatch, ranks calling different collectives at one
        # point, is the program's, not a host's)
        col = _dict(failure.get("collective"))
        for m in _list(col.get("missing")):
            _incident(found, _dict(m).get("host"), attempt, "hang", info="collective #%s"
                      % _int(col.get("seq"), -1))
        return
    host = _host(failure.get("host"))
    if not host or reason in RUN_WIDE or failure.get("consequence") is True:
        return
    own_exit = reason in ("failed", "")
    failed = sorted(h for h, o in outcomes.items() if o == "failed")
    if (own_exit or reason == "not_started") and shared(len(failed), len(outcomes)):
        # Most hosts' ranks failed on their own (not_started: never reached the master): the
        # script, its input or the master; which host was first is chance.
        _shared_event(found, attempt, "run.exit", failed, len(outcomes))
        return
    # (not_started beside other failed hosts: the master or the network, not this host)
    # (rank 0 runs what no other rank does, logging, evaluation, saving: its own exit, alone,
    # says least of its host)
    others_failed = any(h != host for h in failed)
    less = reason == "oom" or (own_exit and _int(failure.get("rank"), -1) == 0) \
        or ((own_exit or reason == "not_started") and others_failed)
    _incident(found, host, attempt, "culprit", REASON_CHECK.get(reason, "run.exit"),
              weight=SHARED_CULPRIT if less else None,
              info=failure.get("reason") if isinstance(failure.get("reason"), str) else "")


def _shared_event(found, attempt, check, hosts, checked, what=None):
    if any(e["attempt"] == attempt and e["check"] == check for e in found.shared):
        return  # (an attempt's failure and train.json's first_failure: one failure)
    hosts = sorted(set(hosts))
    found.shared.append({
        "attempt": attempt, "check": check, "hosts": hosts[:SHARED_HOSTS_MAX],
        "what": _text(what or "%s failed on %d of %d hosts: %s" % (
            check, len(hosts), checked, SHARED_CAUSE), TEXT_MAX),
        "at": found.moments.get(attempt)})


def _moments(report, attempts, last):
    """{attempt: when its failure happened}: goodput's failures (train.json's timeline, on
    the controller's clock; None where an attempt has none)."""
    known = {}
    for f in _list(_dict(report.get("goodput")).get("failures")):
        n, at = _dict(f).get("attempt"), _epoch(_dict(f).get("at"))
        if isinstance(n, int) and not isinstance(n, bool) and at is not None:
            known.setdefault(n, at)
    return {n: known.get(n) for n in {_int(a.get("attempt")) for a in attempts} | {last}}


def run_incidents(report):
    """Found of a train.json / collective.json dict."""
    found = Found()
    said = finite(_dict(report.get("settings")).get("lost_after_s"))
    if said is not None and said > 0:
        found.lost_after_s = said
    rows = [_dict(h) for h in _list(report.get("hosts"))]
    hosts = [_host(h.get("host")) for h in rows]
    attempts = [_dict(a) for a in _list(report.get("attempts"))]
    last = _int(attempts[-1].get("attempt")) if attempts else 0
    found.moments = _moments(report, attempts, last)
    for a in attempts:
        n = _int(a.get("attempt"))
        had = [_host(h) for h in _list(a.get("hosts"))]
        hosts += had
        found.checked.setdefault(n, set()).update(h for h in had if h)
        outcomes = {_host(h): _text(o, 32) for h, o in _dict(a.get("outcomes")).items()}
        _failure_incidents(found, a.get("failure"), n, outcomes)
        for h, o in outcomes.items():
            if o == "lost":
                _incident(found, h, n, "lost")
        for d in _list(a.get("drain")):
            _incident(found, _dict(d).get("host"), n, "drained", _dict(d).get("reason"),
                      info=_dict(d).get("evidence"))
        for r in _list(a.get("replaced")):
            r = _dict(r)
            # (reported under what left it behind: a host lost with others, no strike either)
            _incident(found, r.get("host"), n, "restart", check=r.get("reason"),
                      info=r.get("reason"))
    outcomes = {_host(h.get("host")): _text(h.get("outcome"), 32) for h in rows}
    _failure_incidents(found, report.get("first_failure"), last, outcomes)
    for h, o in outcomes.items():
        if o == "lost":
            _incident(found, h, last, "lost")
    first_fatal = {}
    for e in _list(report.get("hardware")):
        e = _dict(e)
        kind = _text(e.get("kind"), 32)
        fatal = e.get("fatal") is True and kind != "oom"
        _incident(found, e.get("host"), last, "hardware", hw_label(kind, e.get("code")),
                  weight=None if fatal else WEIGHTS["warning"],
                  info=e.get("line") or e.get("what"), at=e.get("at"))
        at = _epoch(e.get("at"))
        if fatal and at is not None:
            host = _host(e.get("host"))
            first_fatal[host] = min(first_fatal.get(host, at), at)
    for d in _list(report.get("drain")):
        d = _dict(d)
        _incident(found, d.get("host"), last, "drained", d.get("reason"), info=d.get("evidence"),
                  at=first_fatal.get(_host(d.get("host"))))
    for s in _list(report.get("stragglers")):
        _incident(found, _dict(s).get("host"), last, "straggler", at=_dict(s).get("last_seen"))
    _check_incidents(found, report, last, hosts)
    found.hosts = hosts
    found.checked.setdefault(last, set()).update(h for h in (
        _host(h.get("host")) for h in rows) if h)
    _singled_out(found, hosts)
    return found


def _check_incidents(found, report, attempt, hosts, master_bound_ok=True):
    for c in (_dict(c) for c in _list(report.get("checks"))):
        cid = _text(c.get("id"), 64)
        if c.get("ok") is not False or not cid or cid in NOT_INCIDENTS \
                or cid in NEVER_THE_HOSTS or cid.startswith(NEVER_PREFIXES):
            continue
        if not master_bound_ok and cid in MASTER_BOUND:
            continue
        error = c.get("severity") == "error"
        _incident(found, c.get("host"), attempt, "check" if error else "warning", cid,
                  info=c.get("detail"))


def _lost_moments(found):
    """{attempt: the first attempt of its moment}: attempts whose losses happened within
    lost_after_s of each other (each attempt's hosts are lost at its failure's moment: the
    first loss ends it); an attempt of unknown time is a moment of its own."""
    dated = sorted((at, n) for n, at in found.moments.items() if at is not None)
    out = {n: n for n, at in found.moments.items() if at is None}
    first, before = None, None
    for at, n in dated:
        if before is None or at - before > found.lost_after_s:
            first = n
        out[n], before = first, at
    return out


def _singled_out(found, hosts):
    """Drops what most hosts of one check (each attempt's), or of one moment, shared: a
    failure of the shared cause's, recorded once in found.shared, no strike against any host."""
    everyone = {h for h in hosts if h}
    moment = _lost_moments(found)
    groups = {}
    for key, i in found.incidents.items():
        check = i["check_id"]
        # One moment's losses together (across attempts, when they were that close).
        when = moment.get(i["attempt"], i["attempt"]) if check == "host.lost" else i["attempt"]
        groups.setdefault((when, check, i["weight"] > 0), []).append(key)
    for (when, check, weighs), keys in sorted(groups.items(), key=lambda g: (g[0][0], g[0][1])):
        if not weighs:
            continue  # warnings: a host's history, never its score, whoever shares them
        named = {found.incidents[k]["host"] for k in keys}
        attempts = {found.incidents[k]["attempt"] for k in keys}
        checked = set().union(*(found.checked.get(n) or everyone for n in attempts))
        if check == "host.lost" and len(named) >= LOST_TOGETHER:
            _shared_event(found, when, check, named, len(checked), what=(
                "host.lost: %d hosts lost within lost_after_s (%g s) of each other: %s"
                % (len(named), found.lost_after_s, LOST_CAUSE)))
        elif shared(len(named), len(checked)):
            _shared_event(found, when, check, named, len(checked))
        else:
            continue
        for k in keys:
            del found.incidents[k]


def preflight_incidents(report):
    """Found of a preflight.json dict. When most workers failed a check bound to the master's
    ports, none of them is blamed for it."""
    found = Found()
    rows = [_dict(h) for h in _list(report.get("hosts"))]
    hosts = [_host(h.get("host")) for h in rows]
    hosts += [_host(h) for h in _list(_dict(report.get("spares")).get("candidates"))]
    workers = [h for h in hosts[1:] if h]
    bound = {_host(_dict(c).get("host")) for c in _list(report.get("checks"))
             if _dict(c).get("ok") is False and _dict(c).get("id") in MASTER_BOUND}
    found.moments = {0: None}
    _check_incidents(found, report, 0, hosts, master_bound_ok=len(bound & set(workers)) * 2
                     <= len(set(workers)))
    found.hosts = hosts
    _singled_out(found, hosts)
    return found


class Fleet(ledger_store.Store):
    """The ledger as the controller uses it. fleet_db: "" (off: every method does nothing and
    returns empty), a SQLite path or a postgresql:// URL. Never raises; `warnings` holds the
    fleet.ledger sentences (one per Fleet: the first failure turns it off)."""

    def __init__(self, fleet_db=defaults.FLEET_DB, runs_root="",
                 half_life_h=defaults.default("ledger_half_life_h"),
                 quarantine_score=defaults.default("quarantine_score"),
                 quarantine_h=defaults.default("quarantine_h"),
                 quarantine_max_fraction=defaults.default("quarantine_max_fraction"),
                 timeout_s=defaults.LEDGER_TIMEOUT_S, create=True, observe=False,
                 keep_days=defaults.default("ledger_keep_days"), textfile_path=""):
        # Kept in the ledger at each write (torchfleet hosts scores with them).
        self.settings = {"ledger_half_life_h": half_life_h, "quarantine_score": quarantine_score,
                         "quarantine_h": quarantine_h,
                         "quarantine_max_fraction": quarantine_max_fraction,
                         "ledger_keep_days": keep_days, "ledger_textfile": textfile_path}
        self._apply(self.settings)
        # What this controller's runs add under (memory.run_token: the run directory's).
        self.run_token = ""
        self.shared = []  # the last report's fleet events (failures most hosts shared)
        self.breaker = ""  # the last report's circuit breaker sentence, when it tripped
        # actions=observe: incidents recorded and scored, no quarantine made; `would` holds
        # the last report's quarantines not made (by observe or the breaker).
        self.observe, self.would = bool(observe), []
        # The time health() read the ledger at (on PostgreSQL the server's clock): what its
        # quarantines are live at, for whoever judges them after (memory.quarantined).
        self.read_at = None
        super().__init__(fleet_db, runs_root, timeout_s=timeout_s, create=create)

    def _apply(self, settings):
        self.half_life_s = max(float(finite(settings["ledger_half_life_h"]) or 168.0),
                               1e-3) * 3600.0
        self.quarantine_score = float(finite(settings["quarantine_score"]) or 2.5)
        self.quarantine_s = max(float(finite(settings["quarantine_h"]) or 0.0), 0.0) * 3600.0
        fraction = finite(settings["quarantine_max_fraction"])
        self.max_fraction = defaults.default("quarantine_max_fraction") if fraction is None \
            else max(fraction, 0.0)
        keep = finite(settings["ledger_keep_days"])
        self.keep_s = keep * 86400.0 if keep is not None and keep > 0 else None
        path = settings["ledger_textfile"]
        self.textfile_path = path if isinstance(path, str) else ""

    def adopt_settings(self):
        """Scores with the fleet's settings as its last preflight or run kept them in the
        ledger (torchfleet hosts: not this command's defaults). The settings kept."""
        def read():
            with self._read() as conn:
                return load_settings(conn)
        kept = self._guard(read, {})
        if kept:
            self.settings = dict(self.settings, **{k: v for k, v in kept.items()
                                                   if k in self.settings})
            self._apply(self.settings)
        return kept

    def _at(self, conn, at, given):
        """The time of this transaction: `at` when the caller gave one (the tests' clock),
        else on PostgreSQL the server's, every controller's one clock; a controller's clock
        further than SKEW_S from it is said once."""
        if given:
            return at
        server = self.server_now(conn)
        if server is None:
            return at
        if abs(at - server) > SKEW_S and not self.notes:
            self.notes.append(
                "the fleet's ledger %s: this controller's clock is %.0f s %s of the database "
                "server's; the ledger dates what it records by the server's clock: set up NTP "
                "(chrony) on the controller" % (
                    self.where, abs(at - server), "ahead" if at > server else "behind"))
        return server

    # ---- writes ----

    def record_run(self, report, now=None):
        """Writes train.json's dict (the judge's decision): one row per host and incident, and
        the hosts that took part; then quarantines the hosts whose score passed
        quarantine_score. Returns the newly quarantined: [{"host", "until", "reason"}]."""
        return self._record(report, "run", now)

    def record_preflight(self, report, now=None):
        """The same for preflight.json's dict."""
        return self._record(report, "preflight", now)

    def _record(self, report, which, at):
        self.shared, self.breaker, self.would = [], "", []
        if self._off or not isinstance(report, dict):
            return []
        try:
            run_id = _text(report.get("run_id"))
            phase = "preflight" if which == "preflight" else (
                _text(report.get("kind"), 16) or "train")
            found = run_incidents(report) if which == "run" else preflight_incidents(report)
        except Exception as exc:  # a report no check foresaw: its record is still written
            self._fail("could not read the report (%s: %s)" % (type(exc).__name__, exc),
                       "report it with the run's %s.json" % which)
            return []
        if not run_id:
            return []
        if self.run_token:
            run_id = _text(run_id + RUN_KEY_SEP + self.run_token)
        given, at = _given(at), _clock(at)
        return self._guard(lambda: self._write_record(run_id, phase, found, at, given), [])

    def _write_record(self, run_id, phase, found, mine, given):
        hosts = [h for h in dict.fromkeys(found.hosts) if h and h != "controller"]
        weighs = any(i["weight"] > 0 for i in found.incidents.values())
        with self._write() as conn:
            if weighs:  # it may quarantine: one decision at a time
                lock_decisions(conn)
            # The report's times are this controller's clock: moved onto the server's.
            at = self._at(conn, mine, given)
            shift = at - mine
            # Each incident dated when it happened (its event's, its attempt's failure's
            # time), never after the report: a clock ahead is the report's time.
            rows = [dict(i, run_id=run_id, phase=phase,
                         at=at if i["at"] is None else min(i["at"] + shift, at))
                    for i in found.incidents.values()]
            self.shared = [dict(e, at=at if e["at"] is None else min(e["at"] + shift, at))
                           for e in found.shared]
            if self.keep_s is not None:  # ledger_keep_days: what is older goes
                prune(conn, at - self.keep_s)
            # Incidents dated after now (written while this clock, or SQLite's controller's,
            # was ahead, and it stepped back since) are dated now: else they would weigh in
            # full, undecayed, until real time caught up (_score counts no negative age).
            conn.execute(INCIDENTS.update().where(INCIDENTS.c.at > at).values(at=at))
            # So are quarantines written after now (quarantine_end): their end moves back by
            # as much, for every reader from now on.
            conn.execute(HOSTS.update().where(HOSTS.c.updated > at).values(
                quarantined_until=HOSTS.c.quarantined_until - (HOSTS.c.updated - at), updated=at))
            save_settings(conn, self.settings)
            if hosts:
                _took_part(conn, run_id, phase, hosts, at)
            add_events(conn, run_id, phase, self.shared)
            touched = set()
            if rows:
                before = _count(conn, run_id, phase)
                _bulk(conn, INCIDENTS, rows)
                if _count(conn, run_id, phase) != before:  # new rows: their hosts' scores
                    # (a warning's weighs nothing: it cannot bring a quarantine, and a report
                    # warning of every host costs no read of every host's history)
                    touched = {r["host"] for r in rows if r["weight"] > 0}
            out = []
            for host in sorted(touched):
                state = host_states(conn, [host]).get(host) or {}
                if (quarantine_end(state, at) or 0.0) > at:
                    continue
                score, history = self._score(conn, [host], at, state_of={host: state})[host]
                if score >= self.quarantine_score and self.quarantine_s > 0:
                    reason = "%s%.2f >= quarantine_score %g: %s" % (
                        AUTO_REASON, score, self.quarantine_score, history)
                    out.append({"host": host, "until": at + self.quarantine_s,
                                "reason": reason})
            # The breaker is judged in observe too: the audit says what it would have held.
            if out and (self._trips(conn, hosts, out, run_id, phase, at, rows) or self.observe):
                self.would = out
                return []
            for q in out:
                _set_host(conn, q["host"], at, quarantined_until=q["until"],
                          reason=q["reason"][:TEXT_MAX])
            return out

    def _trips(self, conn, group, newly, run_id, phase, at, rows):
        """The circuit breaker, inside the decision's transaction: every host held in the
        ledger's own quarantine now (not only this report's: the hosts a quarantine left out
        of the next run still count), with those it would add, past breaker_limit of the
        group, the hosts the ledger saw in the last quarantine_h with this report's. Past it
        none is quarantined; those hosts' incidents of this report's checks in the last
        HISTORY_S weigh nothing from now on (the shared cause's, as under the evidence rule: a
        driver roll-out's strikes would otherwise wait for any small incident to finish the
        quarantine), and one fleet event says so."""
        held = {h for h, st in host_states(conn).items()
                if (quarantine_end(st, at) or 0.0) > at
                and str(st.get("reason") or "").startswith(AUTO_REASON)}
        seen = set(group) | set(runs_since(conn, at - max(self.quarantine_s, 3600.0)))
        would = held | {q["host"] for q in newly}
        if len(would) <= breaker_limit(len(seen), self.max_fraction):
            return False
        named = [q["host"] for q in newly]
        checks = sorted({r["check_id"] for r in rows if r["host"] in named and r["weight"] > 0})
        conn.execute(INCIDENTS.update().where(
            INCIDENTS.c.host.in_(named), INCIDENTS.c.check_id.in_(checks),
            INCIDENTS.c.at >= at - HISTORY_S).values(weight=0.0))
        self.breaker = breaker_words([q["host"] for q in newly], len(seen),
                                     self.max_fraction, "quarantined",
                                     len(held - {q["host"] for q in newly}))
        event = {"attempt": -1, "check": BREAKER_CHECK,  # (the report's, no attempt's)
                 "hosts": sorted(q["host"] for q in newly)[:SHARED_HOSTS_MAX],
                 "what": _text(self.breaker, TEXT_MAX), "at": at}
        add_events(conn, run_id, phase, [event])
        self.shared.append(event)
        return True

    def record_actions(self, run_id, phase, actions, now=None):
        """The report's audit (train.json's `actions`, already checked: runstate's
        checked_actions and action()), each dated by its own `at` (ISO 8601; the report's time
        where it has none). True when written."""
        run_id, at = self._audit_key(run_id), _clock(now)
        # (Stored as given, bounded, NUL and surrogates made safe: a kernel line is a host's.)
        rows = [{"action": _text(a.get("action"), 16), "host": _host(a.get("host")) or "",
                 "check": _text(a.get("check"), 64), "why": _text(a.get("why"), TEXT_MAX),
                 "done": a.get("done") is True, "at": _epoch(a.get("at")) or at}
                for a in actions if isinstance(a, dict)]
        if not run_id or not rows:
            return False

        def write():
            with self._write() as conn:
                add_actions(conn, run_id, _text(phase, 16) or "train", rows)
            return True
        return self._guard(write, False)

    def _audit_key(self, run_id):
        """The run's key in the audit (its run_id, with the run's token when it has one)."""
        run_id = _text(run_id)
        return _text(run_id + RUN_KEY_SEP + self.run_token) if run_id and self.run_token \
            else run_id

    def decide_drains(self, run_id, phase, decide, write=True, now=None):
        """The drain breaker's decision, one controller's at a time: under the decision lock,
        decide(held, seen) (summary.drain_breaker's, with drains()'s history, pending drains
        included) returns the drains to do ([{"host", "reason"}]), recorded in the same
        transaction as pending (an audit drain, not done, why PENDING) when `write`, so that
        another controller deciding while this one's scontrol runs counts them (ten runs' ends
        under one cause each see the others' drains). settle_drains() records Slurm's answer.
        Without a ledger, decide(set(), set())."""
        run_id, at = self._audit_key(run_id), _clock(now)
        start = at - max(self.quarantine_s, 3600.0)  # (the quarantine breaker's window)
        phase = _text(phase, 16) or "train"

        def write_():
            with self._write() as conn:
                lock_decisions(conn)
                todo = decide(drained_since(conn, start), set(runs_since(conn, start)))
                if write and run_id:
                    add_actions(conn, run_id, phase, [
                        {"action": "drain", "host": _host(d["host"]), "at": at, "done": False,
                         "check": _text(d.get("reason"), 64), "why": PENDING} for d in todo])
                return todo
        decided = self._guard(write_, None)
        return decide(set(), set()) if decided is None else decided

    def settle_drains(self, run_id, phase, drains):
        """Slurm's answer to the drains decide_drains() recorded as pending: each of `drains`
        (the audit's, action()'s) sets its row's done and why. True when written."""
        run_id, phase = self._audit_key(run_id), _text(phase, 16) or "train"
        rows = [{"host": _host(a.get("host")), "check": _text(a.get("check"), 64),
                 "why": _text(a.get("why"), TEXT_MAX), "done": a.get("done") is True}
                for a in drains if isinstance(a, dict) and a.get("action") == "drain"]
        if not run_id or not rows:
            return False

        def write():
            with self._write() as conn:
                settle_drains(conn, run_id, phase, rows)
            return True
        return self._guard(write, False)

    def drains(self, now=None):
        """The drain breaker's history (reports/summary.py drain_breaker): (the hosts torchfleet
        drained in Slurm within the last quarantine_h, by its audit's drains done or pending;
        the hosts
        the ledger saw in that time, the group they are a share of). Empty without a ledger."""
        at = _clock(now)
        start = at - max(self.quarantine_s, 3600.0)  # (the quarantine breaker's window)

        def read():
            with self._read() as conn:
                return drained_since(conn, start), set(runs_since(conn, start))
        return self._guard(read, (set(), set()))

    def history(self, host, since_s=None, now=None, limit=EVENTS_MAX):
        """One host's history, newest first: {"incidents": [{"run_id", "phase", "attempt",
        "kind", "detail", "weight", "at"}], "actions": [{"run_id", "action", "check", "why",
        "done", "at"}]} (at: ISO 8601), since since_s ago (None: the score's window)."""
        host, at, given = _host(host), _clock(now), _given(now)
        since = finite(since_s)

        def read():
            with self._read() as conn:
                now_ = self._at(conn, at, given)
                start = now_ - since if since is not None and since > 0 else \
                    now_ - DECAYED_OUT * self.half_life_s
                found = sorted(incident_rows(conn, [host], start), key=lambda r: -r.at)[:limit]
                acts = actions_of(conn, host, start, limit)
            return {"incidents": [{"run_id": shown(r.run_id), "phase": r.phase, "attempt": r.attempt,
                                   "kind": r.kind, "detail": r.detail, "weight": r.weight,
                                   "at": iso(r.at)} for r in found],
                    "actions": [{"run_id": shown(a["run_id"]), "action": a["action"],
                                 "check": a["check_id"], "why": a["why"],
                                 "done": bool(a["done"]), "at": iso(a["at"])} for a in acts]}
        return self._guard(read, {"incidents": [], "actions": []})

    def known(self, host):
        """Whether the ledger has a row of host (under its canonical_host key)."""
        key = _host(host)

        def read():
            with self._read() as conn:
                return key in host_states(conn, [key])
        return bool(key) and self._guard(read, False)

    def quarantine(self, host, hours, reason="", now=None):
        """Quarantines host for hours (from now); True when written."""
        host, at, hours, given = _host(host), _clock(now), finite(hours), _given(now)
        if not host or hours is None or hours <= 0:
            return False

        def write():
            with self._write() as conn:
                lock_decisions(conn)
                now_ = self._at(conn, at, given)
                _set_host(conn, host, now_, quarantined_until=now_ + hours * 3600.0,
                          reason=_text(reason, TEXT_MAX) or "quarantined by hand")
            return True
        return self._guard(write, False)

    def release(self, host, now=None):
        """Ends host's quarantine; its incidents so far no longer count toward its score."""
        host, at, given = _host(host), _clock(now), _given(now)
        if not host:
            return False

        def write():
            with self._write() as conn:
                lock_decisions(conn)
                now_ = self._at(conn, at, given)
                _set_host(conn, host, now_, quarantined_until=None, reason="released",
                          released_at=now_)
            return True
        return self._guard(write, False)

    # ---- reads ----

    def _score(self, conn, hosts, at, state_of=None, window_s=HISTORY_S):
        """{host: (score, history line)} of these hosts (None: every host with an incident)."""
        horizon = at - DECAYED_OUT * self.half_life_s
        state_of = state_of if state_of is not None else host_states(conn, hosts)
        groups, labels = {}, {}
        for r in incident_rows(conn, hosts, min(horizon, at - window_s)):
            released = (state_of.get(r.host) or {}).get("released_at")
            if released is not None and r.at <= released:
                continue
            if r.at >= horizon:
                # Each attempt's heaviest; a rank's own exit once a run (the WEIGHTS' comment).
                key = (r.host, r.run_id,
                       None if r.kind == "culprit" and r.detail in SCRIPT_CHECKS else r.attempt)
                weight = r.weight * 0.5 ** (max(at - r.at, 0.0) / self.half_life_s)
                groups[key] = max(groups.get(key, 0.0), weight)
            if r.at >= at - window_s and r.weight > WEIGHTS["warning"]:
                labels.setdefault(r.host, []).append((r.run_id, label(r.kind, r.detail)))
        out = {h: [0.0, ""] for h in (hosts or [])}
        for key, weight in groups.items():
            out.setdefault(key[0], [0.0, ""])[0] += weight
        for host, found in labels.items():
            out.setdefault(host, [0.0, ""])[1] = history(found, window_s)
        return {h: (round(s, 4), line) for h, (s, line) in out.items()}

    def health(self, hosts, now=None):
        """{host: {"score", "quarantined_until" (epoch s or None), "reason", "history"}},
        as of `now`; None: the ledger's clock (on PostgreSQL the server's), kept in
        read_at."""
        # Asked by the inventory's names, kept under their canonical_host keys.
        names = {h: _host(h) for h in (_text(h) for h in _list(hosts)) if h}
        keys = [k for k in dict.fromkeys(names.values()) if k]
        empty = {h: {"score": 0.0, "quarantined_until": None, "reason": "", "history": ""}
                 for h in names}
        if not keys:
            return empty
        at, given = _clock(now), _given(now)

        def read():
            with self._read() as conn:
                now_ = self.read_at = self._at(conn, at, given)
                states = host_states(conn, keys)
                scores = self._score(conn, keys, now_, state_of=states)
            out = {}
            for h, k in names.items():
                until = quarantine_end(states.get(k), now_)
                live = until is not None and until > now_
                out[h] = {"score": scores[k][0] if k else 0.0,
                          "quarantined_until": until if live else None,
                          "reason": (states.get(k) or {}).get("reason", "") if live else "",
                          "history": scores[k][1] if k else ""}
            return out
        return self._guard(read, empty)

    def hosts(self, since_s=None, now=None):
        """Every host the ledger knows, worst first: [{"host", "runs", "incidents": {kind:
        count}, "score", "quarantined_until" (ISO 8601 or None), "reason", "history",
        "last_incident": {"run_id", "check", "at"} or None}] (counts since since_s ago)."""
        at, given = _clock(now), _given(now)
        since = finite(since_s)

        def read():
            with self._read() as conn:
                now_ = self._at(conn, at, given)
                start = now_ - since if since is not None and since > 0 else None
                states = host_states(conn)
                if start is None:
                    runs = {h: s["runs"] for h, s in states.items()}
                else:
                    runs = runs_since(conn, start)
                kinds, newest = kinds_since(conn, start)
                last = {}
                if newest:
                    for r in newest_incidents(conn):
                        if r.at == newest.get(r.host) and (
                                r.host not in last or r.weight > last[r.host][1]):
                            last[r.host] = ({"run_id": shown(r.run_id), "check": r.check_id,
                                             "at": iso(r.at)}, r.weight)
                scores = self._score(conn, None, now_, state_of=states)
            out = []
            for host in sorted(set(states) | set(kinds) | set(scores)):
                state = states.get(host) or {}
                until = quarantine_end(state, now_)
                live = until is not None and until > now_
                score, line = scores.get(host, (0.0, ""))
                out.append({"host": host, "runs": runs.get(host, 0),
                            "incidents": kinds.get(host, {}), "score": score,
                            "quarantined_until": iso(until) if live else None,
                            "reason": state.get("reason", "") if live else "",
                            "history": line,
                            "last_incident": (last.get(host) or (None,))[0]})
            out.sort(key=lambda h: (-h["score"], h["host"]))
            return out
        return self._guard(read, [])

    def events(self, since_s=None, now=None, limit=EVENTS_MAX):
        """The fleet events, failures most hosts shared (no host's strike), newest first:
        [{"run_id", "phase", "attempt", "check", "hosts", "what", "at" (ISO 8601)}]."""
        at, given = _clock(now), _given(now)
        since = finite(since_s)

        def read():
            with self._read() as conn:
                now_ = self._at(conn, at, given)
                found = events_since(conn, now_ - since if since is not None and since > 0
                                     else None, limit)
            return [{"run_id": shown(e["run_id"]), "phase": e["phase"], "attempt": e["attempt"],
                     "check": e["check_id"], "hosts": e["hosts"], "what": e["what"],
                     "at": iso(e["at"])} for e in found]
        return self._guard(read, [])

    def textfile(self, path=None, now=None):
        """node-exporter's textfile collector: each host's score, incidents by kind, runs and
        quarantine, written atomically (a temporary file, synced, renamed). path None: the
        one the fleet's settings name (torchfleet hosts after a release). True when
        written."""
        path = self.textfile_path if path is None else path
        if not path or self._off:
            return False
        listed = self.hosts(now=now)
        if self._off:
            return False
        try:
            _write_atomic(path, prometheus(listed, _clock(now)))
            return True
        except Exception as exc:  # the dashboards miss one update, the run goes on
            if not self.warnings:
                self.warnings.append("the fleet's ledger could not write its textfile %s (%s):"
                                     " make its directory writable by the controller's user, "
                                     "or set ledger_textfile to another path" % (path, exc))
            return False


def _clock(at):
    at = finite(at)
    return now() if at is None else at


def _given(at):
    """Whether the time is the caller's (an argument, or the tests' TORCHFLEET_LEDGER_NOW),
    not this controller's clock."""
    return finite(at) is not None or bool(os.environ.get(NOW_ENV))


# What a history line calls a failure the host caused, by its check: the words a lost host's
# own incident uses, so "lost" is said once for the one failure.
CULPRIT_SAID = {"run.exit": "its rank exited", "run.oom": "OOM kill", "host.lost": "lost",
                "run.hang": "hang", "run.hardware": "hardware", "run.straggler": "straggler"}


def label(kind, detail):
    if kind == "culprit":
        return CULPRIT_SAID.get(detail, detail or "failed the run")
    if kind == "hardware":
        return detail or "hardware"
    if kind in ("check", "warning"):
        return detail or kind
    return {"hang": "hang", "drained": "drained", "restart": "restarted without it"}.get(
        kind, kind)


def history(found, window_s=HISTORY_S):
    """"3 incidents in 7 days: Xid 79 x2, lost x1": failures (runs with an incident; `found`:
    (run_id, what) pairs) and what they were, most frequent first."""
    failures = len({run for run, _what in found})
    if not failures:
        return ""
    counts = Counter(what for (_run, what) in set(found))  # once per run each
    days = window_s / 86400.0
    return "%d incident%s in %s: %s" % (
        failures, "" if failures == 1 else "s",
        "%g day%s" % (days, "" if days == 1 else "s"),
        ", ".join("%s x%d" % (what, n) for what, n in counts.most_common(4)))


def _escape(value):
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def prometheus(listed, at):
    """The textfile's text (Prometheus exposition format)."""
    lines = []

    def metric(name, kind, text, samples):
        lines.extend(["# HELP %s %s" % (name, text), "# TYPE %s %s" % (name, kind)])
        lines.extend("%s{%s} %s" % (name, ",".join('%s="%s"' % (k, _escape(str(v)))
                                                   for k, v in labels), repr(float(value)))
                     for labels, value in samples)

    metric("torchfleet_host_score", "gauge", "The fleet ledger's decaying score of the host.",
           [((("host", h["host"]),), h["score"]) for h in listed])
    metric("torchfleet_host_quarantined", "gauge", "1 while the ledger quarantines the host.",
           [((("host", h["host"]),), 1 if h["quarantined_until"] else 0) for h in listed])
    metric("torchfleet_host_runs_total", "counter", "Preflights and runs the host took part in.",
           [((("host", h["host"]),), h["runs"]) for h in listed])
    metric("torchfleet_host_quarantined_until_seconds", "gauge", "When the host's quarantine "
           "ends (epoch s; 0: none): compare with time(), the textfile is as of its writing.",
           [((("host", h["host"]),), _epoch(h["quarantined_until"]) or 0)
            for h in listed])
    # Only what weighs on the score: an alert on incidents_total never fires on a warning
    # (a throttling GPU's, a failed warning check's), counted apart.
    metric("torchfleet_host_incidents_total", "counter", "Incidents of the host that weigh on "
           "its score, by kind.",
           [((("host", h["host"]), ("kind", k)), n) for h in listed
            for k, n in sorted(h["incidents"].items()) if k != "warning"])
    metric("torchfleet_host_warnings_total", "counter", "Warnings of the host (its history, "
           "never its score).",
           [((("host", h["host"]),), h["incidents"]["warning"]) for h in listed
            if h["incidents"].get("warning")])
    lines.append("# HELP torchfleet_ledger_updated_seconds When the textfile was written.")
    lines.append("# TYPE torchfleet_ledger_updated_seconds gauge")
    lines.append("torchfleet_ledger_updated_seconds %s" % repr(float(at)))
    return "\n".join(lines) + "\n"


def _write_atomic(path, text):
    # node-exporter runs as its own user: readable by all; synced, as a crash must not leave it half.
    rundir.replace_text(path, text, mode=0o644, sync=True)


def as_json(listed):
    return json.dumps(listed, indent=2)
