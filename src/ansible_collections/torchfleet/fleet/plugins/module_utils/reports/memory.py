"""The fleet's memory as preflight and the run's end use it (DESIGN.md "The fleet's memory"):
the ledger (reports/ledger.py) opened beside the run's directory, what it holds said as check
records and table lines, and what a report adds to it.

The ledger lives in the runs root: the parent of the run's directory (runs_root/<run_id>; with
`run_dir` set, that directory's parent), so preflight, the run's end and an attach of a
detached run find the same one. It never fails a run: what cannot be done is a fleet.ledger
warning, once.
"""
from __future__ import annotations

import os
import uuid

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import ledger, ledger_store
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import rundir
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.records import (
    CONTROLLER, ERROR, WARNING, check)
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.runstate import action

# The modules' options for the ledger (preflight_checks adds `quarantine`, what it decides).
# fleet_db has no default here: the plays pass the variable (its default, fleet.db); a module
# called without it (the unit tests' thousand reports) writes no ledger.
SPEC = dict(
    # no_log: a postgresql:// URL may carry its password (mask_fleet_db keeps the rest of
    # the output readable).
    fleet_db=dict(type="str", no_log=True),
    ledger_half_life_h=dict(type="float", default=defaults.default("ledger_half_life_h")),
    quarantine_score=dict(type="float", default=defaults.default("quarantine_score")),
    quarantine_h=dict(type="float", default=defaults.default("quarantine_h")),
    ledger_keep_days=dict(type="int", default=defaults.default("ledger_keep_days")),
    quarantine_max_fraction=dict(type="float",
                                 default=defaults.default("quarantine_max_fraction")),
    # observe: the ledger records and scores, and quarantines (drains, leaves out) nobody.
    actions=dict(type="str", default=defaults.default("actions"),
                 choices=["enforce", "observe"]),
    ledger_textfile=dict(type="str", default=defaults.default("ledger_textfile")),
    # A restart's re-check reads the ledger (its spares healthiest first, a quarantined one left
    # out) from the run's runs root, and writes nothing: the run's end records the attempt.
    ledger_root=dict(type="str"),
    ledger_record=dict(type="bool", default=True),
)
# Checks that are the ledger's own words, not the host's: recording them would feed a
# quarantine from itself.
OWN = ("host.quarantined", "fleet.ledger", ledger.BREAKER_CHECK)


def root_of(run_dir):
    """The runs root the ledger's relative path is read from: the run directory's parent."""
    return os.path.dirname(os.path.abspath(run_dir)) if run_dir else ""


def mask_fleet_db(module):
    """fleet_db is no_log, and Ansible masks a no_log value wherever it appears in the output:
    every "fleet.db" of every sentence. Masked instead: the URL's password alone (the
    invocation shows the URL with ******** for it; nothing is logged of it either way)."""
    fleet_db = module.params.get("fleet_db")
    if fleet_db:
        module.no_log_values.discard(fleet_db)
        if ledger_store.password_of(fleet_db):
            module.no_log_values.add(ledger_store.password_of(fleet_db))


# The run directory's token (ledger.RUN_KEY_SEP): written by the first of the run's reports to
# reach the ledger, read by the others (its preflight, its end, an attach), so a run_id used
# again elsewhere with the same fleet_db is another run.
RUN_TOKEN = "ledger.key"


def run_token(run_dir, create):
    path = os.path.join(run_dir, RUN_TOKEN)
    for _try in range(2):
        found = rundir.read_json(path, max_bytes=4096)
        if isinstance(found, dict) and isinstance(found.get("token"), str) \
                and found["token"].isalnum():
            return found["token"]
        if not create or os.path.exists(path):
            return ""
        try:
            os.makedirs(run_dir, mode=0o750, exist_ok=True)
            rundir.create_json(path, {"token": uuid.uuid4().hex[:12]})
        except FileExistsError:
            continue  # another writer's: read it
        except OSError:
            return ""
    return ""


def open_fleet(params, run_dir):
    """The ledger of the fleet (off, every call a no-op, without a run directory or with
    fleet_db=''), in ledger_root when given, else beside the run's directory."""
    root = params.get("ledger_root") or root_of(run_dir)
    textfile = params.get("ledger_textfile") or ""
    fleet = ledger.Fleet((params.get("fleet_db") or "") if run_dir else "", root,
                         half_life_h=params["ledger_half_life_h"],
                         quarantine_score=params["quarantine_score"],
                         quarantine_h=params["quarantine_h"],
                         quarantine_max_fraction=params["quarantine_max_fraction"],
                         observe=params.get("actions") == "observe",
                         keep_days=params.get("ledger_keep_days",
                                              defaults.default("ledger_keep_days")),
                         textfile_path=os.path.join(root_of(run_dir), textfile)
                         if textfile and run_dir else "")
    if fleet.on and run_dir:
        fleet.run_token = run_token(run_dir, create=bool(params.get("ledger_record", True)))
    return fleet


iso = ledger.iso


def quarantined(health, now):
    """{host: its health} of the hosts quarantined at `now`."""
    return {h: v for h, v in health.items()
            if v.get("quarantined_until") and v["quarantined_until"] > now}


def why_held(host, state):
    """A quarantined host's evidence: until when, the ledger's reason and its history."""
    said = "quarantined by the fleet's ledger until %s" % iso(state["quarantined_until"])
    if state.get("reason"):
        said += " (%s)" % state["reason"]
    return said + ("; " + state["history"] if state.get("history") else "")


def quarantine_checks(used, left_out, health, now, strict=False):
    """host.quarantined of each quarantined host: one left out (a spare took its place) is a
    warning; one the run uses anyway (no healthy spare left) a warning, an error when
    `strict`."""
    held = quarantined(health, now)
    out = [check("host.quarantined", h, False, why_held(h, held[h]) + "; not used: a spare "
                 "takes its place", "mend %s, then `torchfleet hosts release %s`" % (h, h), WARNING)
           for h in left_out if h in held]
    out += [check("host.quarantined", h, False, why_held(h, held[h]) + "; %s: no healthy spare "
                  "is left to take its place" % ("refused" if strict else "used anyway"),
                  "mend %s, then `torchfleet hosts release %s`; or add spares (-e spares=K)%s"
                  % (h, h, "" if not strict else "; quarantine=warn uses it anyway"),
                  ERROR if strict else WARNING)
            for h in used if h in held]
    return out


def ledger_checks(fleet, said=(), strict=False, unread=None):
    """fleet.ledger: the ledger's warnings, unless preflight `said` one already (a run is
    warned once); fleet.breaker: the quarantines the circuit breaker kept from being done.
    `strict` (quarantine=strict): a ledger that could not be read is an error, since no
    quarantine could be enforced without it; `unread`: the warnings as health() left them
    (None: all). What failed after the hosts' health was read (a record, the audit, the
    textfile) cannot have hidden a quarantine: a warning, strict or not."""
    gate = [w for w in fleet.warnings if strict and (unread is None or w in unread)]
    errors = [check("fleet.ledger", CONTROLLER, False, w + "; quarantine=strict refuses to "
                    "run without knowing which hosts are quarantined", "as it says; "
                    "quarantine=warn runs without the ledger", ERROR) for w in gate]
    return errors + ([] if said and not errors else [
        check("fleet.ledger", CONTROLLER, False, w, "as it says; fleet_db='' runs without the "
              "ledger", WARNING) for w in fleet.warnings + fleet.notes if w not in gate]) + \
        breaker_checks(fleet.breaker)


def breaker_checks(sentence):
    """fleet.breaker, a warning, when the circuit breaker tripped (its sentence)."""
    return [check(ledger.BREAKER_CHECK, CONTROLLER, False, sentence,
                  "find the cause the hosts share; a host that is itself at fault: torchfleet "
                  "hosts quarantine HOST --hours N", WARNING)] if sentence else []


def history_lines(health, hosts, now):
    """The table's lines of the hosts with a history ("node3: 3 incidents in 7 days: ...")."""
    held = quarantined(health, now)
    lines = ["%s: %s%s" % (h, health[h]["history"] or "no incident",
                           "; quarantined until %s" % iso(held[h]["quarantined_until"])
                           if h in held else "")
             for h in hosts if h in health and (health[h].get("history") or h in held)]
    return "fleet history (the ledger):\n" + "\n".join(lines) if lines else ""


def report_entry(health, hosts, now):
    """The report's `fleet`: {host: {score, history, quarantined_until (ISO 8601 or None)}}
    of the hosts with a history or a quarantine (none without a ledger)."""
    held = quarantined(health, now)
    return {h: {"score": round(float(health[h].get("score") or 0.0), 3),
                "history": health[h].get("history") or "",
                "quarantined_until": iso(held[h]["quarantined_until"]) if h in held else None}
            for h in hosts if h in health and (health[h].get("history") or h in held)}


def newly_text(newly):
    """The lines of the hosts this report quarantined."""
    return "\n".join("quarantined now: %s until %s (%s)" % (
        q["host"], iso(q["until"]), q["reason"]) for q in newly)


def for_ledger(report):
    """The report as the ledger records it: without the ledger's own checks."""
    return dict(report, checks=[c for c in report.get("checks") or [] if c["id"] not in OWN])


def record(fleet, kind, report, now=None):
    """The report written into the ledger (record_preflight / record_run); the hosts it newly
    quarantined. The ledger says its own failures (fleet.warnings); anything else it raises is
    one more warning, never the run's end nor the loss of its report."""
    try:
        write = fleet.record_preflight if kind == "preflight" else fleet.record_run
        return write(for_ledger(report), now=now) or []
    except Exception as e:  # pylint: disable=broad-except  # fail open (issue 60 item 5)
        fleet.warnings.append("the fleet's ledger could not record the %s: %s: %s"
                              % (kind, type(e).__name__, e))
        return []


def audit(fleet, kind, run_id, newly, at, before=(), after=(), write=True):
    """A report's `actions` (train.json's, collective.json's and preflight.json's, built here
    alone; docs/outputs.md): `before` (what the run or preflight did, or would have), the
    quarantines recording the report made (done) and those actions=observe or the circuit
    breaker kept from being made (fleet.would, not done), then `after` (the drains); written
    into the ledger's audit (`torchfleet hosts HOST`) when `write`."""
    out = list(before)
    out += [action("quarantine", q["host"], "host.quarantined", at, q["reason"], True)
            for q in newly]
    out += [action("quarantine", q["host"], "host.quarantined", at, q["reason"], False)
            for q in fleet.would]
    out += list(after)
    if write and out:
        record_actions(fleet, kind, run_id, out)
    return out


def record_actions(fleet, kind, run_id, actions, now=None):
    """The report's audit written into the ledger (`torchfleet hosts HOST` reads it); what
    cannot be is one more warning, as record()."""
    try:
        fleet.record_actions(run_id, kind, actions, now=now)
    except Exception as e:  # pylint: disable=broad-except  # fail open, as record()
        fleet.warnings.append("the fleet's ledger could not record the %s's actions: %s: %s"
                              % (kind, type(e).__name__, e))


def read_at(fleet, now):
    """The time health() read the ledger at (on PostgreSQL the server's clock), else `now`:
    the time its quarantines are judged at (quarantined())."""
    at = getattr(fleet, "read_at", None)
    return now if at is None else at


def health(fleet, hosts, now=None):
    """fleet.health(hosts), or none (a warning) when it fails unforeseen. now None: the
    ledger's clock (Fleet.health; read_at() gives it)."""
    try:
        return fleet.health(list(hosts), now=now) or {}
    except Exception as e:  # pylint: disable=broad-except  # fail open, as record()
        fleet.warnings.append("the fleet's ledger could not be read: %s: %s"
                              % (type(e).__name__, e))
        return {}


def textfile(fleet, params, run_dir, now=None):
    """The node-exporter textfile, when ledger_textfile is set (relative: in the runs root)."""
    path = params.get("ledger_textfile") or ""
    if not (path and run_dir):
        return
    try:
        fleet.textfile(os.path.join(root_of(run_dir), path), now=now)
    except Exception as e:  # pylint: disable=broad-except  # fail open, as record()
        fleet.warnings.append("the fleet's ledger could not write %s: %s: %s"
                              % (path, type(e).__name__, e))
