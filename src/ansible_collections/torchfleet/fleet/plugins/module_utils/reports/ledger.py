"""The fleet's ledger: what happened to each host in every preflight and run, kept across runs
(issue 60; docs/ledger.md). A decaying score per host orders the spares and quarantines the
lemons; `torchfleet hosts` shows and edits it; a Prometheus textfile exports it.

One schema for SQLite (the default: fleet.db in the runs root, WAL mode and a busy timeout, so
several controllers on one machine write at once) and PostgreSQL (fleet_db=postgresql://...,
controllers on several login nodes), through SQLAlchemy Core. The controller's side only.

Fail open: no method raises. A ledger that is missing its driver, locked past its timeout,
corrupt or of a newer schema turns the Fleet off after one sentence in `warnings` (the
fleet.ledger check's message: the ledger, what failed, the fix); the run never pays for it.
Reports come from other hosts' bytes: every field is checked before it is used.
"""
from __future__ import annotations

import json
import math
import os
import re
import tempfile
import time
from collections import Counter

try:
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql as sa_postgresql
    from sqlalchemy.dialects import sqlite as sa_sqlite
    from sqlalchemy.pool import SingletonThreadPool
    HAS_SQLALCHEMY = True
    IMPORT_ERROR = ""
except ImportError as exc:  # a controller without it: a warning, never a failure
    sa = sa_postgresql = sa_sqlite = SingletonThreadPool = None
    HAS_SQLALCHEMY = False
    IMPORT_ERROR = str(exc)

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.goodput import finite

CHECK_ID = "fleet.ledger"
SCHEMA_VERSION = 1
NOW_ENV = "TORCHFLEET_LEDGER_NOW"

# What an incident says about its host (docs/ledger.md "The score"). A host's score adds, for
# each run it took part in, the weight of that run's heaviest incident (one failure seen as
# culprit, lost and drained is one failure; a script failing the same way in every attempt of
# one run is one strike, not one a restart), halved every half_life_h.
WEIGHTS = {
    "culprit": 1.0,     # the first failure's host (not a consequence, not run-wide)
    "hardware": 1.5,    # a fatal hardware event (Xid 79, an uncorrectable AER, a GPU reset)
    "drained": 1.5,     # drained for one (the same evidence)
    "lost": 1.0,        # stopped answering during a run
    "hang": 1.0,        # the rank a hang's collective waited for
    "straggler": 0.5,   # the others waited for it
    "restart": 0.5,     # left behind by a restart
    "check": 0.5,       # a failed health check of its own (HOST_HEALTH), an error
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
# Which failed checks are recorded against their host. Its health always (its GPUs, fabric
# links, disk, clock, speed, reachability); what another job or process holds (gpu.busy,
# port.in_use) and the controller's input never; any other (script.missing, code.sync,
# data.missing, env.nccl, version.*, nccl.transport, ...) only where it singles hosts out:
# failed by fewer than half the hosts checked. Failed everywhere it is the user's input, code
# or environment: six runs with a typo must not quarantine the fleet.
HOST_HEALTH_PREFIXES = ("gpu.", "cpu.")
HOST_HEALTH = ("host.unreachable", "host.disk", "host.clock", "node.slow", "link.slow",
               "nic.missing", "rdma.down", "rdma.rate")
NEVER_THE_HOSTS = ("gpu.busy", "port.in_use", "run_id.used", "world.size")
NEVER_PREFIXES = ("input.",)
# A worker's failure of these is the master's when most workers failed one (reports/spares.py).
MASTER_BOUND = ("port.blocked", "port.ephemeral", "nic.route")
# The first failure's reason (runstate.py) and the check it is reported under (as
# summary.check_of says it; any other reason of a host is run.exit).
REASON_CHECK = {"lost": "host.lost", "hung": "run.hang", "hardware": "run.hardware",
                "oom": "run.oom", "straggler": "run.straggler"}
RUN_WIDE = ("hung", "timeout", "controller_lost", "stopped_by_user")
HISTORY_S = 7 * 86400.0  # the history line's window
DECAYED_OUT = 20         # half-lives past which an incident no longer counts (2**-20)
HOST_MAX, TEXT_MAX = 255, 500
IN_MAX = 64              # more hosts than this: read them all, not an IN list of each


def now():
    """time.time(), or TORCHFLEET_LEDGER_NOW (epoch seconds) when set: the tests' clock."""
    value = os.environ.get(NOW_ENV, "")
    try:
        at = float(value) if value else None
    except ValueError:
        at = None
    return at if at is not None and math.isfinite(at) else time.time()


def _text(value, limit=HOST_MAX):
    """A report's string, bounded and storable by both engines (no NUL, no lone surrogate)."""
    if not isinstance(value, str):
        return ""
    if len(value) <= limit and value.isascii() and "\x00" not in value:
        return value  # the common case, 512 times a run
    value = value[:4 * limit].replace("\x00", "")
    return value.encode("utf-8", "backslashreplace").decode("utf-8")[:limit]


def _list(value):
    return value if isinstance(value, list) else []


def _dict(value):
    return value if isinstance(value, dict) else {}


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

def _incident(out, host, attempt, kind, detail="", check="", weight=None, info=""):
    host = _text(host)
    if not host or host == "controller":
        return
    detail = _text(detail, 120)
    out[(host, attempt, kind, detail)] = {
        "host": host, "attempt": attempt, "kind": kind, "detail": detail,
        "check_id": _text(check or KIND_CHECK.get(kind) or detail, 64),
        "weight": WEIGHTS[kind] if weight is None else weight, "info": _text(info, TEXT_MAX)}


def _failure_incidents(out, failure, attempt, outcomes):
    """The first failure's culprit (an attempt's record failure, or train.json's first_failure:
    both carry host, reason (or failure), consequence, collective)."""
    failure = _dict(failure)
    reason = _text(failure.get("reason") if "failure" not in failure else failure.get("failure"),
                   32)
    if reason == "hung":  # a run-wide failure: the ranks its collective waited for are named
        # (missing: never joined; a mismatch, ranks calling different collectives at one
        # point, is the program's, not a host's)
        found = _dict(failure.get("collective"))
        for m in _list(found.get("missing")):
            _incident(out, _dict(m).get("host"), attempt, "hang", info="collective #%s"
                      % _int(_dict(found).get("seq"), -1))
        return
    host = _text(failure.get("host"))
    if not host or reason in RUN_WIDE or failure.get("consequence") is True:
        return
    # (not_started beside other failed hosts: the master or the network, not this host)
    # (rank 0 runs what no other rank does, logging, evaluation, saving: its own exit, alone,
    # says least of its host)
    own_exit = reason in ("failed", "")
    others_failed = any(o == "failed" and h != host for h, o in outcomes.items())
    shared = reason == "oom" or (own_exit and _int(failure.get("rank"), -1) == 0) \
        or ((own_exit or reason == "not_started") and others_failed)
    _incident(out, host, attempt, "culprit", REASON_CHECK.get(reason, "run.exit"),
              weight=SHARED_CULPRIT if shared else None,
              info=failure.get("reason") if isinstance(failure.get("reason"), str) else "")


def run_incidents(report):
    """{key: incident} of a train.json / collective.json dict, and the hosts that took part."""
    out = {}
    rows = [_dict(h) for h in _list(report.get("hosts"))]
    hosts = [_text(h.get("host")) for h in rows]
    attempts = [_dict(a) for a in _list(report.get("attempts"))]
    last = _int(attempts[-1].get("attempt")) if attempts else 0
    for a in attempts:
        n = _int(a.get("attempt"))
        hosts += [_text(h) for h in _list(a.get("hosts"))]
        outcomes = {_text(h): _text(o, 32) for h, o in _dict(a.get("outcomes")).items()}
        _failure_incidents(out, a.get("failure"), n, outcomes)
        for h, o in outcomes.items():
            if o == "lost":
                _incident(out, h, n, "lost")
        for d in _list(a.get("drain")):
            _incident(out, _dict(d).get("host"), n, "drained", _dict(d).get("reason"),
                      info=_dict(d).get("evidence"))
        for r in _list(a.get("replaced")):
            r = _dict(r)
            _incident(out, r.get("host"), n, "restart", info=r.get("reason"))
    outcomes = {_text(h.get("host")): _text(h.get("outcome"), 32) for h in rows}
    _failure_incidents(out, report.get("first_failure"), last, outcomes)
    for h, o in outcomes.items():
        if o == "lost":
            _incident(out, h, last, "lost")
    for e in _list(report.get("hardware")):
        e = _dict(e)
        kind = _text(e.get("kind"), 32)
        fatal = e.get("fatal") is True and kind != "oom"
        _incident(out, e.get("host"), last, "hardware", hw_label(kind, e.get("code")),
                  weight=None if fatal else WEIGHTS["warning"],
                  info=e.get("line") or e.get("what"))
    for d in _list(report.get("drain")):
        d = _dict(d)
        _incident(out, d.get("host"), last, "drained", d.get("reason"), info=d.get("evidence"))
    for s in _list(report.get("stragglers")):
        _incident(out, _dict(s).get("host"), last, "straggler")
    _check_incidents(out, report, last, hosts)
    return out, hosts


def _check_incidents(out, report, attempt, hosts, master_bound_ok=True):
    checks = [_dict(c) for c in _list(report.get("checks"))]
    failing = {}
    for c in checks:
        if c.get("ok") is False:
            failing.setdefault(_text(c.get("id"), 64), set()).add(_text(c.get("host")))
    checked = max(len({h for h in hosts if h}), 1)
    for c in checks:
        cid = _text(c.get("id"), 64)
        if c.get("ok") is not False or not cid or cid in NOT_INCIDENTS \
                or not says_of_host(cid, len(failing.get(cid, ())), checked):
            continue
        if not master_bound_ok and cid in MASTER_BOUND:
            continue
        error = c.get("severity") == "error"
        _incident(out, c.get("host"), attempt, "check" if error else "warning", cid,
                  info=c.get("detail"))


def says_of_host(cid, failed_by, checked):
    """Whether check `cid`, failed by `failed_by` of the `checked` hosts, says something of the
    hosts that failed it (HOST_HEALTH above)."""
    if cid in NEVER_THE_HOSTS or cid.startswith(NEVER_PREFIXES):
        return False
    if cid in HOST_HEALTH or cid.startswith(HOST_HEALTH_PREFIXES):
        return True
    return failed_by * 2 < checked


def preflight_incidents(report):
    """{key: incident} of a preflight.json dict, and the hosts it checked. When most workers
    failed a check bound to the master's ports, none of them is blamed for it."""
    out = {}
    rows = [_dict(h) for h in _list(report.get("hosts"))]
    hosts = [_text(h.get("host")) for h in rows]
    hosts += [_text(h) for h in _list(_dict(report.get("spares")).get("candidates"))]
    workers = [h for h in hosts[1:] if h]
    bound = {_text(_dict(c).get("host")) for c in _list(report.get("checks"))
             if _dict(c).get("ok") is False and _dict(c).get("id") in MASTER_BOUND}
    _check_incidents(out, report, 0, hosts, master_bound_ok=len(bound & set(workers)) * 2
                     <= len(set(workers)))
    return out, hosts


# ---- The schema ----

if HAS_SQLALCHEMY:
    METADATA = sa.MetaData()
    META = sa.Table(
        "ledger_meta", METADATA,
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(255), nullable=False))
    # Who took part in which run: one row a run (its hosts a JSON list), and each host's
    # count in ledger_hosts.runs: a row per host and run would be 512,000 rows to count at
    # 512 hosts x 1,000 runs (bench ledger).
    RUNS = sa.Table(
        "ledger_runs", METADATA,
        sa.Column("run_id", sa.String(HOST_MAX), primary_key=True),
        sa.Column("phase", sa.String(16), nullable=False),  # the first one recorded
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("hosts", sa.Text, nullable=False),
        sa.Index("ix_ledger_runs_at", "at"))
    INCIDENTS = sa.Table(
        "ledger_incidents", METADATA,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("host", sa.String(HOST_MAX), nullable=False),
        sa.Column("run_id", sa.String(HOST_MAX), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("detail", sa.String(120), nullable=False),
        sa.Column("check_id", sa.String(64), nullable=False),
        sa.Column("weight", sa.Float, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("info", sa.String(TEXT_MAX), nullable=False),
        # The finisher and a later attach writing the same run count once.
        sa.UniqueConstraint("run_id", "phase", "attempt", "host", "kind", "detail",
                            name="uq_ledger_incident"),
        sa.Index("ix_ledger_incidents_host_at", "host", "at"),
        sa.Index("ix_ledger_incidents_at", "at"))
    HOSTS = sa.Table(  # quarantine and release, per host
        "ledger_hosts", METADATA,
        sa.Column("host", sa.String(HOST_MAX), primary_key=True),
        sa.Column("runs", sa.Integer, nullable=False, default=0),
        sa.Column("quarantined_until", sa.Float, nullable=True),
        sa.Column("reason", sa.String(TEXT_MAX), nullable=False, default=""),
        sa.Column("released_at", sa.Float, nullable=True),  # incidents before it: forgiven
        sa.Column("updated", sa.Float, nullable=False))
    # Each version's step from the one before (run in order, in one transaction, under the
    # ledger's write lock); a later version adds a step here, never edits one.
    MIGRATIONS = {1: lambda conn: METADATA.create_all(conn, tables=[META, RUNS, INCIDENTS,
                                                                    HOSTS])}


class NewerSchema(Exception):
    pass


def describe(fleet_db):
    """The ledger as a sentence names it: the path, or the URL without its password."""
    return re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", fleet_db)


def _url(fleet_db, runs_root):
    """(SQLAlchemy URL, path or None) of fleet_db: a postgresql:// URL (psycopg 3 unless a
    driver is named), else a SQLite path, relative to runs_root when relative."""
    if re.match(r"^postgres(ql)?(\+\w+)?://", fleet_db):
        url = re.sub(r"^postgres(ql)?://", "postgresql+psycopg://", fleet_db)
        return url, None
    path = os.path.join(runs_root or ".", os.path.expanduser(fleet_db))
    return "sqlite:///" + os.path.abspath(path), os.path.abspath(path)


class Fleet:
    """The ledger as the controller uses it. fleet_db: "" (off: every method does nothing and
    returns empty), a SQLite path or a postgresql:// URL. Never raises; `warnings` holds the
    fleet.ledger sentences (one per Fleet: the first failure turns it off)."""

    def __init__(self, fleet_db=defaults.FLEET_DB, runs_root="",
                 half_life_h=defaults.default("ledger_half_life_h"),
                 quarantine_score=defaults.default("quarantine_score"),
                 quarantine_h=defaults.default("quarantine_h"),
                 timeout_s=defaults.LEDGER_TIMEOUT_S, create=True):
        self.fleet_db = fleet_db if isinstance(fleet_db, str) else ""
        self.runs_root = runs_root if isinstance(runs_root, str) else ""
        self.half_life_s = max(float(finite(half_life_h) or 168.0), 1e-3) * 3600.0
        self.quarantine_score = float(finite(quarantine_score) or 2.5)
        self.quarantine_s = max(float(finite(quarantine_h) or 0.0), 0.0) * 3600.0
        self.timeout_s = max(float(finite(timeout_s) or defaults.LEDGER_TIMEOUT_S), 0.001)
        self.create = create
        self.warnings = []
        self.where = _url(self.fleet_db, self.runs_root)[1] or describe(self.fleet_db) \
            if self.fleet_db else ""
        self._engine = None
        self._off = not self.fleet_db

    # ---- fail open ----

    @property
    def on(self):
        return not self._off

    def _fail(self, what, fix):
        if not self.warnings:
            self.warnings.append("the fleet's ledger %s %s: %s; the run goes on without it"
                                 % (self.where, what, fix))
        self._off = True
        self.close()

    def _failed(self, exc):
        """The sentence of an exception while using the ledger."""
        text = " ".join(str(getattr(exc, "orig", None) or exc).split())[:300]
        low = text.lower()
        if isinstance(exc, NewerSchema):
            self._fail("has schema version %s, newer than this torchfleet's (%d)"
                       % (text, SCHEMA_VERSION), "upgrade torchfleet on this controller, or "
                       "point fleet_db at another ledger")
        elif "locked" in low or "busy" in low or "lock timeout" in low or \
                "canceling statement" in low:
            self._fail("stayed locked past its %g s timeout (%s)" % (self.timeout_s, text),
                       "another controller holds it: look for a stuck torchfleet process")
        elif "not a database" in low or "malformed" in low or "corrupt" in low:
            self._fail("is corrupt (%s)" % text, "move it aside (mv %s %s.corrupt): a new "
                       "ledger starts at the next run, without the history" % (
                           self.where, self.where))
        elif "unable to open" in low or "permission" in low or "read-only" in low or \
                "readonly" in low:
            self._fail("cannot be opened for writing (%s)" % text, "make its directory "
                       "writable by the controller's user, or set fleet_db to another path")
        elif "connect" in low or "connection" in low or "could not translate" in low:
            self._fail("cannot be reached (%s)" % text, "check that the PostgreSQL server "
                       "runs and fleet_db's host, port, user and database")
        else:
            self._fail("failed (%s: %s)" % (type(exc).__name__, text),
                       "report it with the message; set fleet_db='' to run without a ledger")

    def _ready(self):
        """The engine, its schema current, or None (off, or this was the failure)."""
        if self._off:
            return None
        if self._engine is not None:
            return self._engine
        if not HAS_SQLALCHEMY:
            self._fail("needs SQLAlchemy 2 in the controller's Python (%s)" % IMPORT_ERROR,
                       "pip install 'sqlalchemy>=2' (and 'psycopg[binary]' for PostgreSQL), "
                       "or set fleet_db='' to run without a ledger")
            return None
        try:
            url, path = _url(self.fleet_db, self.runs_root)
            if path is not None:
                if not self.create and not os.path.exists(path):
                    self._fail("does not exist", "it is written at every preflight's and "
                               "run's end; or give --fleet-db")
                    return None
                os.makedirs(os.path.dirname(path), exist_ok=True)
                # One connection kept for the Fleet's life: the last one to close a WAL
                # database checkpoints it (12 ms a write at 512 hosts).
                engine = sa.create_engine(url, poolclass=SingletonThreadPool,
                                          connect_args={"timeout": self.timeout_s,
                                                        "isolation_level": None,
                                                        "check_same_thread": False})
                sa.event.listen(engine, "connect", _sqlite_connect)
                sa.event.listen(engine, "begin", _sqlite_begin)
            else:
                ms = int(self.timeout_s * 1000)
                engine = sa.create_engine(url, pool_size=1, max_overflow=2, connect_args={
                    "connect_timeout": max(1, int(self.timeout_s)),
                    "options": "-c lock_timeout=%d -c statement_timeout=%d" % (ms, 6 * ms)})
            self._engine = engine
            self._migrate()
            return self._engine
        except Exception as exc:  # fail open: any failure is one warning
            self._failed(exc)
            return None

    def _migrate(self):
        with self._write() as conn:
            if conn.dialect.name == "postgresql":  # one controller migrates at a time
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(6060)"))
            version = 0
            if sa.inspect(conn).has_table(META.name):
                found = conn.execute(sa.select(META.c.value).where(
                    META.c.key == "schema_version")).scalar()
                version = int(found) if found and str(found).isdigit() else 0
            if version > SCHEMA_VERSION:
                raise NewerSchema(str(version))
            for step in range(version + 1, SCHEMA_VERSION + 1):
                MIGRATIONS[step](conn)
            if version < SCHEMA_VERSION:
                conn.execute(META.delete().where(META.c.key == "schema_version"))
                conn.execute(META.insert().values(key="schema_version",
                                                  value=str(SCHEMA_VERSION)))

    def _write(self):
        """A transaction that takes the write lock first (SQLite: BEGIN IMMEDIATE, so a writer
        waits for another's commit within the busy timeout instead of failing at its first
        write)."""
        return _Tx(self._engine, True)

    def _read(self):
        return _Tx(self._engine, False)

    def close(self):
        if self._engine is not None:
            try:
                self._engine.dispose()
            except Exception:
                pass
            self._engine = None

    def _guard(self, call, empty):
        if self._ready() is None:
            return empty
        try:
            return call()
        except Exception as exc:
            self._failed(exc)
            return empty

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
        if self._off or not isinstance(report, dict):
            return []
        try:
            run_id = _text(report.get("run_id"))
            phase = "preflight" if which == "preflight" else (
                _text(report.get("kind"), 16) or "train")
            found, hosts = run_incidents(report) if which == "run" \
                else preflight_incidents(report)
        except Exception as exc:  # a report no check foresaw: its record is still written
            self._fail("could not read the report (%s: %s)" % (type(exc).__name__, exc),
                       "report it with the run's %s.json" % which)
            return []
        if not run_id:
            return []
        at = _clock(at)
        return self._guard(lambda: self._write_record(run_id, phase, found, hosts, at), [])

    def _write_record(self, run_id, phase, found, hosts, at):
        hosts = [h for h in dict.fromkeys(hosts) if h and h != "controller"]
        rows = [dict(i, run_id=run_id, phase=phase, at=at) for i in found.values()]
        with self._write() as conn:
            if hosts:
                _took_part(conn, run_id, phase, hosts, at)
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
                state = self._states(conn, [host]).get(host) or {}
                if (state.get("quarantined_until") or 0.0) > at:
                    continue
                score, history = self._score(conn, [host], at, state_of={host: state})[host]
                if score >= self.quarantine_score and self.quarantine_s > 0:
                    reason = "score %.2f >= quarantine_score %g: %s" % (
                        score, self.quarantine_score, history)
                    until = at + self.quarantine_s
                    _set_host(conn, host, at, quarantined_until=until, reason=reason[:TEXT_MAX])
                    out.append({"host": host, "until": until, "reason": reason})
            return out

    def quarantine(self, host, hours, reason="", now=None):
        """Quarantines host for hours (from now); True when written."""
        host, at, hours = _text(host), _clock(now), finite(hours)
        if not host or hours is None or hours <= 0:
            return False

        def write():
            with self._write() as conn:
                _set_host(conn, host, at, quarantined_until=at + hours * 3600.0,
                          reason=_text(reason, TEXT_MAX) or "quarantined by hand")
            return True
        return self._guard(write, False)

    def release(self, host, now=None):
        """Ends host's quarantine; its incidents so far no longer count toward its score."""
        host, at = _text(host), _clock(now)
        if not host:
            return False

        def write():
            with self._write() as conn:
                _set_host(conn, host, at, quarantined_until=None, reason="released",
                          released_at=at)
            return True
        return self._guard(write, False)

    # ---- reads ----

    def _states(self, conn, hosts=None):
        q = sa.select(HOSTS)
        if hosts is not None and len(hosts) <= IN_MAX:
            q = q.where(HOSTS.c.host.in_(hosts))
        return {r.host: r._asdict() for r in conn.execute(q)}

    def _score(self, conn, hosts, at, state_of=None, window_s=HISTORY_S):
        """{host: (score, history line)} of these hosts (None: every host with an incident)."""
        horizon = at - DECAYED_OUT * self.half_life_s
        q = sa.select(INCIDENTS.c.host, INCIDENTS.c.run_id, INCIDENTS.c.phase,
                      INCIDENTS.c.attempt, INCIDENTS.c.kind, INCIDENTS.c.detail,
                      INCIDENTS.c.weight, INCIDENTS.c.at).where(
            INCIDENTS.c.at >= min(horizon, at - window_s))
        if hosts is not None and len(hosts) <= IN_MAX:
            q = q.where(INCIDENTS.c.host.in_(hosts))
        state_of = state_of if state_of is not None else self._states(conn, hosts)
        groups, labels = {}, {}
        wanted = None if hosts is None else set(hosts)
        for r in conn.execute(q):
            if wanted is not None and r.host not in wanted:
                continue
            released = (state_of.get(r.host) or {}).get("released_at")
            if released is not None and r.at <= released:
                continue
            if r.at >= horizon:
                key = (r.host, r.run_id)
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
        """{host: {"score", "quarantined_until" (epoch s or None), "reason", "history"}}."""
        hosts = [h for h in (_text(h) for h in _list(hosts)) if h]
        empty = {h: {"score": 0.0, "quarantined_until": None, "reason": "", "history": ""}
                 for h in hosts}
        if not hosts:
            return empty
        at = _clock(now)

        def read():
            with self._read() as conn:
                states = self._states(conn, hosts)
                scores = self._score(conn, hosts, at, state_of=states)
            out = {}
            for h in hosts:
                until = (states.get(h) or {}).get("quarantined_until")
                live = until is not None and until > at
                out[h] = {"score": scores[h][0], "quarantined_until": until if live else None,
                          "reason": (states.get(h) or {}).get("reason", "") if live else "",
                          "history": scores[h][1]}
            return out
        return self._guard(read, empty)

    def hosts(self, since_s=None, now=None):
        """Every host the ledger knows, worst first: [{"host", "runs", "incidents": {kind:
        count}, "score", "quarantined_until" (ISO 8601 or None), "reason", "history",
        "last_incident": {"run_id", "check", "at"} or None}] (counts since since_s ago)."""
        at = _clock(now)
        since = finite(since_s)
        start = at - since if since is not None and since > 0 else None

        def read():
            with self._read() as conn:
                states = self._states(conn)
                if start is None:
                    runs = {h: s["runs"] for h, s in states.items()}
                else:
                    runs = Counter()
                    for (listed,) in conn.execute(sa.select(RUNS.c.hosts).where(
                            RUNS.c.at >= start)):
                        runs.update(_hosts_of(listed))
                q = sa.select(INCIDENTS.c.host, INCIDENTS.c.kind, sa.func.count(),
                              sa.func.max(INCIDENTS.c.at)).group_by(
                    INCIDENTS.c.host, INCIDENTS.c.kind)
                if start is not None:
                    q = q.where(INCIDENTS.c.at >= start)
                kinds, newest = {}, {}
                for host, kind, n, last in conn.execute(q):
                    kinds.setdefault(host, {})[kind] = n
                    newest[host] = max(newest.get(host, last), last)
                last = {}
                if newest:  # each host's newest rows, found by the (host, at) index
                    top = sa.select(INCIDENTS.c.host, sa.func.max(INCIDENTS.c.at).label("m")) \
                        .group_by(INCIDENTS.c.host).subquery()
                    q = sa.select(INCIDENTS.c.host, INCIDENTS.c.run_id, INCIDENTS.c.check_id,
                                  INCIDENTS.c.at, INCIDENTS.c.weight).join(top, sa.and_(
                                      INCIDENTS.c.host == top.c.host, INCIDENTS.c.at == top.c.m))
                    for r in conn.execute(q):
                        if r.at == newest.get(r.host) and (
                                r.host not in last or r.weight > last[r.host][1]):
                            last[r.host] = ({"run_id": r.run_id, "check": r.check_id,
                                             "at": iso(r.at)}, r.weight)
                scores = self._score(conn, None, at, state_of=states)
            out = []
            for host in sorted(set(states) | set(kinds) | set(scores)):
                state = states.get(host) or {}
                until = state.get("quarantined_until")
                live = until is not None and until > at
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

    def textfile(self, path, now=None):
        """node-exporter's textfile collector: each host's score, incidents by kind, runs and
        quarantine, written atomically (a temporary file renamed). True when written."""
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


class _Tx:
    """A connection with its transaction: committed at the end, rolled back on an exception."""

    def __init__(self, engine, write):
        self.engine, self.write = engine, write

    def __enter__(self):
        self.conn = self.engine.connect()
        if self.write:
            self.conn = self.conn.execution_options(ledger_write=True)
        self.tx = self.conn.begin()
        return self.conn

    def __exit__(self, kind, exc, tb):
        try:
            if kind is None:
                self.tx.commit()
            else:
                self.tx.rollback()
        finally:
            self.conn.close()
        return False


def _sqlite_connect(dbapi_conn, _record):
    cur = dbapi_conn.cursor()
    try:
        # WAL: readers never wait for the writer; the mode is kept in the file.
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")  # durable at each WAL checkpoint
    finally:
        cur.close()


def _sqlite_begin(conn):
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("ledger_write")
                         else "BEGIN")


def _insert_ignore(conn, table):
    dialect = sa_postgresql if conn.dialect.name == "postgresql" else sa_sqlite
    return dialect.insert(table).on_conflict_do_nothing()


def _bulk(conn, table, rows):
    """Insert-or-ignore many rows through the driver's executemany (psycopg pipelines it):
    SQLAlchemy's own parameter processing took longer than SQLite's writes at 512 rows, and
    compiling one statement of 512 VALUES longer still."""
    if not rows:
        return
    keys = list(rows[0])
    compiled = _insert_ignore(conn, table).compile(dialect=conn.dialect, column_keys=keys)
    if compiled.positional:
        params = [tuple(r[k] for k in compiled.positiontup) for r in rows]
    else:
        params = [{k: r[k] for k in keys} for r in rows]
    conn.exec_driver_sql(str(compiled), params)


def _hosts_of(text):
    try:
        listed = json.loads(text)
    except ValueError:
        return []
    return [h for h in listed if isinstance(h, str)] if isinstance(listed, list) else []


def _took_part(conn, run_id, phase, hosts, at):
    """The run's row and its hosts' counts; a run recorded again (the finisher and an attach,
    the train after its preflight) counts only the hosts it had not named."""
    # (RETURNING, not rowcount: psycopg's is -1 for an INSERT ... ON CONFLICT DO NOTHING.)
    inserted = conn.execute(_insert_ignore(conn, RUNS).values(
        run_id=run_id, phase=phase, at=at, hosts=json.dumps(hosts)).returning(
        RUNS.c.run_id)).first()
    if inserted is None:
        q = sa.select(RUNS.c.hosts).where(RUNS.c.run_id == run_id)
        if conn.dialect.name == "postgresql":
            q = q.with_for_update()
        known = set(_hosts_of(conn.execute(q).scalar() or "[]"))
        new = [h for h in hosts if h not in known]
        if not new:
            return
        conn.execute(RUNS.update().where(RUNS.c.run_id == run_id).values(
            hosts=json.dumps(sorted(known) + new)))
        hosts = new
    if conn.dialect.name == "postgresql":  # one statement, not a pipeline of 512
        named = sa.func.unnest(sa.bindparam("hosts", type_=sa_postgresql.ARRAY(sa.String))) \
            .column_valued("h")
        conn.execute(sa_postgresql.insert(HOSTS).from_select(
            ["host", "runs", "reason", "updated"],
            sa.select(named, sa.literal(0), sa.literal(""), sa.literal(at, sa.Float)))
            .on_conflict_do_nothing(), {"hosts": hosts})
    else:
        _bulk(conn, HOSTS, [{"host": h, "runs": 0, "reason": "", "updated": at} for h in hosts])
    conn.execute(HOSTS.update().where(HOSTS.c.host.in_(sa.bindparam("hosts", expanding=True)))
                 .values(runs=HOSTS.c.runs + 1), {"hosts": hosts})


def _count(conn, run_id, phase):
    return conn.execute(sa.select(sa.func.count()).select_from(INCIDENTS).where(
        INCIDENTS.c.run_id == run_id, INCIDENTS.c.phase == phase)).scalar()


def _set_host(conn, host, at, **values):
    values["updated"] = at
    conn.execute(_insert_ignore(conn, HOSTS).values(host=host, runs=0, reason="", updated=at))
    conn.execute(HOSTS.update().where(HOSTS.c.host == host).values(**values))


def _clock(at):
    at = finite(at)
    return now() if at is None else at


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
    metric("torchfleet_host_incidents_total", "counter", "Incidents of the host, by kind.",
           [((("host", h["host"]), ("kind", k)), n) for h in listed
            for k, n in sorted(h["incidents"].items())])
    lines.append("# HELP torchfleet_ledger_updated_seconds When the textfile was written.")
    lines.append("# TYPE torchfleet_ledger_updated_seconds gauge")
    lines.append("torchfleet_ledger_updated_seconds %s" % repr(float(at)))
    return "\n".join(lines) + "\n"


def _write_atomic(path, text):
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".torchfleet-", suffix=".prom.tmp", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # node-exporter runs as its own user
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def as_json(listed):
    return json.dumps(listed, indent=2)
