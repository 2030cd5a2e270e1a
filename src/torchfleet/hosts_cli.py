"""torchfleet hosts: the fleet's ledger per host (runs, incidents by kind, score, quarantine, the
last incident), and its two edits: release HOST, quarantine HOST --hours N (docs/ledger.md)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

from ansible_collections.torchfleet.fleet.plugins.inventory import slurm
from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import goodput, ledger, ledger_store
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.table import render
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.runstate import action


def sqlite_path(fleet_db: str, runs_root: str) -> str | None:
    """The file of a SQLite ledger (None for a PostgreSQL URL): the runs' own, fleet.db on a
    network filesystem falling back to this controller's (ledger_store.sqlite_file)."""
    return ledger_store.sqlite_file(fleet_db, runs_root)[0]


def open_fleet(fleet_db: str | None, runs_root: str) -> Any:
    """The ledger, never created here (a wrong directory must not make an empty one and say
    done), scoring with the fleet's settings as its last preflight or run kept them: the
    half-life and threshold the runs use, not this command's defaults."""
    fleet = ledger.Fleet(fleet_db or defaults.FLEET_DB, runs_root, create=False)
    fleet.adopt_settings()
    return fleet


def missing(fleet_db: str | None, runs_root: str) -> str:
    """A sentence when the SQLite ledger does not exist, else ''."""
    path = sqlite_path(fleet_db or defaults.FLEET_DB, runs_root)
    if path is None or os.path.exists(path):
        return ""
    return "no fleet ledger at %s: give --runs-root (the directory that holds the runs and " \
        "fleet.db) or --fleet-db where it is; a ledger is written at every preflight's and " \
        "run's end" % path


def nothing_yet(where: str, as_json: bool) -> int:
    """`torchfleet hosts` of a fleet with no ledger yet (no preflight or run has ended): said
    in one line, and success (a monitoring job's listing is not an error); --json: []."""
    said = "no ledger at %s yet: nothing recorded" % where
    if as_json:
        print(said, file=sys.stderr)
        print("[]")
    else:
        print(said)
    return 0


def unknown(fleet: Any, host: str) -> str:
    """A sentence when the ledger has no such host (a misspelt name), else ''."""
    if fleet.known(host) or fleet.warnings:
        return ""
    return "no host %s in the fleet's ledger %s: check its name (torchfleet hosts lists " \
        "them)" % (host, fleet.where)


def textfile(fleet: Any) -> str:
    """After a release or quarantine: the Prometheus textfile the fleet's settings name,
    rewritten (else it says quarantined until the next run); what is said of it."""
    if not fleet.textfile_path:
        return ""
    if fleet.textfile():
        return "; %s rewritten" % fleet.textfile_path
    fleet.notes.extend(w for w in fleet.warnings if w not in fleet.notes)
    del fleet.warnings[:]  # (the ledger was changed: the textfile is a note, not a failure)
    return "; %s could not be rewritten" % fleet.textfile_path


def hosts_text(listed: list[dict[str, Any]], where: str, since_s: float | None,
               events: list[dict[str, Any]] | None = None) -> str:
    """The table people read, worst first; then the fleet events given (Fleet.events())."""
    since = " in the last %s" % goodput.duration(since_s) if since_s else ""
    if not listed:
        return "\n".join(["no host in the fleet's ledger %s%s" % (where, since)]
                         + ([events_text(events)] if events else []))
    rows = []
    for h in listed:
        last = h["last_incident"] or {}
        rows.append((h["host"], h["runs"], ", ".join(
            "%s %d" % (k, n) for k, n in sorted(h["incidents"].items(), key=lambda kv: -kv[1]))
            or "-", "%.2f" % h["score"], h["quarantined_until"] or "-",
            "%s %s (%s)" % (last["at"], last["check"], last["run_id"]) if last else "-"))
    quarantined = [h for h in listed if h["quarantined_until"]]
    lines = ["fleet's ledger %s: %d host%s%s, %d quarantined" % (
        where, len(listed), "" if len(listed) == 1 else "s", since, len(quarantined)),
        render(["HOST", "RUNS", "INCIDENTS", "SCORE", "QUARANTINED UNTIL", "LAST INCIDENT"],
               rows)]
    lines += ["%s: %s" % (h["host"], h["reason"]) for h in quarantined if h["reason"]]
    if events:
        lines.append(events_text(events))
    return "\n".join(lines)


SCONTROL_TIMEOUT_S = 30  # slurmctld answers in well under a second when it answers at all


def undrain(host: str) -> tuple[str, bool | None]:
    """After `torchfleet hosts release HOST`: resume HOST's Slurm node when torchfleet drained
    it (reports/slurm_drain.py's reason begins "torchfleet "), and only such a node: one an administrator
    drained stays drained. Returns (what was done or why not, True resumed / False refused /
    None nothing to do): no scontrol, no such node, or a node not drained."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return "", None
    try:
        shown = subprocess.run([scontrol, "-o", "show", "node", host], capture_output=True,
                               text=True, timeout=SCONTROL_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return "", None
    node = slurm.fields(shown.stdout) if shown.returncode == 0 else {}
    if "DRAIN" not in node.get("State", ""):
        return "", None
    if not node.get("Reason", "").startswith("torchfleet"):
        return ("%s stays drained in Slurm: its drain is not torchfleet's (Reason=%s...); "
                "resume it there once mended" % (host, node.get("Reason", "")), None)
    argv = [scontrol, "update", "nodename=%s" % host, "state=resume"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True,
                              timeout=SCONTROL_TIMEOUT_S, stdin=subprocess.DEVNULL)
        err = done.stderr.strip() if done.returncode != 0 else ""
    except (OSError, subprocess.TimeoutExpired) as exc:
        err = str(exc)
    if not err:
        return "%s resumed in Slurm (torchfleet had drained it)" % host, True
    return ("%s stays drained in Slurm: %s; as a Slurm administrator: %s"
            % (host, err[:200], " ".join(["scontrol"] + argv[1:])), False)


def release_audit(host: str, resumed: str, ok: bool | None) -> tuple[str, str, list[dict]]:
    """(run_id, phase, actions) of a release by hand for the ledger's audit: the release, and
    the resume of its Slurm node where one was asked (done or refused)."""
    now = time.time()
    out = [action("release", host, "host.quarantined", now, "torchfleet hosts release", True)]
    if ok is not None:
        out.append(action("undrain", host, "run.hardware", now, resumed, ok))
    return "release-%s-%d" % (host, int(now)), "hosts", out


def host_text(host: str, row: dict[str, Any] | None, history: dict[str, Any]) -> str:
    """`torchfleet hosts HOST`: the host's line of the table, its incidents and what
    torchfleet did to it on its own, or would have (the audit), newest first."""
    if row is None and not history["incidents"] and not history["actions"]:
        return "%s: nothing in the fleet's ledger" % host
    lines = ["%s: score %.2f, %s" % (host, (row or {}).get("score") or 0.0, (
        "quarantined until %s (%s)" % (row["quarantined_until"], row["reason"])
        if row and row["quarantined_until"] else "not quarantined"))]
    if row and row.get("history"):
        lines.append(row["history"])
    lines.append("incidents:" if history["incidents"] else "incidents: none")
    lines += ["  %s %s attempt %d: %s %s (weighs %g)" % (
        i["at"], i["run_id"], i["attempt"], i["kind"], i["detail"], i["weight"])
        for i in history["incidents"]]
    lines.append("actions (what torchfleet did on its own; not done: observe or the breaker):"
                 if history["actions"] else "actions: none")
    lines += ["  %s %s: %s %s (%s): %s" % (
        a["at"], a["run_id"], a["action"], "done" if a["done"] else "not done", a["check"],
        a["why"]) for a in history["actions"]]
    return "\n".join(lines)


def events_text(events: list[dict[str, Any]]) -> str:
    """The failures most hosts shared, newest first: no strike against any host."""
    return "\n".join(["fleet events (a shared cause, no strike against any host):"] + [
        "%s %s: %s" % (e["at"], e["run_id"], e["what"]) for e in events])


def as_json(listed: list[dict[str, Any]]) -> str:
    return json.dumps(listed, indent=2)
