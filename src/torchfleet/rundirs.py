"""Runs by their id on the controller: the list under runs/, a run's status, and a rank's log
once the run was gathered. What the hosts say of a live run comes from the playbooks
(status.yml, logs.yml) through the API; this module reads only the controller's files."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ansible_collections.torchfleet.fleet.plugins.module_utils.run import detach, ranklog
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import RUN_ID

KINDS = detach.KINDS


@dataclass(frozen=True)
class HostStatus:
    host: str
    state: str
    ranks_alive: int
    last_line: str
    last_heard_s: float | None
    hardware: str = ""  # how many hardware events it reported, and the newest in words


@dataclass
class RunStatus:
    """A run at a glance: from the master's record (source "master") while it goes on, from its
    report (source "report") once it was gathered."""

    run_id: str
    kind: str
    phase: str
    final: bool
    attempt: int
    elapsed_s: float | None
    failure: str
    hosts: list[HostStatus] = field(default_factory=list)
    source: str = "master"
    verdict: str = ""
    # The stragglers named (from the master: those of its last judgement; from a report: every
    # one the run had), in words; or why none were watched.
    stragglers: list[str] = field(default_factory=list)
    # Goodput in one line (from the report's goodput; of a run that goes on, its attempt so far).
    goodput: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunListing:
    """One run under runs/: its phase as the controller knows it without asking a host
    (ok / failed from its report, detached when it runs on its hosts alone, preflight when only
    preflight ran)."""

    run_id: str
    kind: str
    phase: str
    verdict: str


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def report_of(run_dir: Path) -> tuple[str, dict]:
    """(kind, report) of a gathered run; ("", {}) when there is none."""
    for kind in KINDS:
        data = _read(run_dir / ("%s.json" % kind))
        if data:
            return kind, data
    return "", {}


def listing(run_dir: Path) -> RunListing | None:
    kind, report = report_of(run_dir)
    if report:
        return RunListing(run_dir.name, kind, "ok" if report.get("ok") else
                          str(report.get("phase") or "failed"), str(report.get("verdict", "")))
    record = _read(run_dir / detach.RECORD)
    if record:
        return RunListing(run_dir.name, str(record.get("kind", "")), "detached",
                          "runs on its hosts: torchfleet status %s" % run_dir.name)
    pre = _read(run_dir / "preflight.json")
    if pre:
        return RunListing(run_dir.name, "preflight", "ok" if pre.get("ok") else "failed",
                          str(pre.get("verdict", "")))
    return None


def list_runs(root: Path) -> list[RunListing]:
    """Every run under root, oldest first (run ids start with their UTC start time)."""
    if not root.is_dir():
        return []
    found = []
    for entry in sorted(root.iterdir()):
        if entry.is_dir() and not entry.is_symlink() and RUN_ID.match(entry.name):
            item = listing(entry)
            if item is not None:
                found.append(item)
    return found


def from_view(kind: str, view: dict) -> RunStatus:
    """The master's record as module_utils/reports/status.py's view made it (already checked there)."""
    return RunStatus(run_id=view["run_id"], kind=kind, phase=view["phase"], final=view["final"],
                     attempt=view["attempt"], elapsed_s=view["elapsed_s"],
                     failure=view["failure"], hosts=[HostStatus(**h) for h in view["hosts"]],
                     stragglers=list(view["stragglers"]), goodput=str(view.get("goodput") or ""))


def from_report(run_id: str, kind: str, report: dict) -> RunStatus:
    """A gathered run's status: its report's hosts and verdict."""
    from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import goodput
    from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import status as view

    hardware = view.hardware_by_host(report.get("hardware"), report.get("hardware_dropped"))
    hosts = [HostStatus(host=str(h.get("host", "")), state=str(h.get("outcome", "")),
                        ranks_alive=0, last_line="", last_heard_s=None,
                        hardware=hardware.get(str(h.get("host")), ""))
             for h in report.get("hosts", []) if isinstance(h, dict)]
    attempts = report.get("attempts") or []
    first = report.get("first_failure") or {}
    return RunStatus(run_id=run_id, kind=kind, phase=str(report.get("phase") or (
        "succeeded" if report.get("ok") else "failed")), final=True,
        attempt=max(0, len(attempts) - 1), elapsed_s=max(
            [h.get("duration_s") or 0 for h in report.get("hosts", []) if isinstance(h, dict)],
            default=None),
        failure=str(first.get("reason", "")) if isinstance(first, dict) else "",
        hosts=hosts, source="report", verdict=str(report.get("verdict", "")),
        stragglers=view.report_stragglers(report),
        goodput=goodput.line(report["goodput"]) if isinstance(report.get("goodput"), dict) else "")


def text(status: RunStatus) -> str:
    from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import status as view

    body = view.text({"run_id": status.run_id, "phase": status.phase, "final": status.final,
                      "attempt": status.attempt, "elapsed_s": status.elapsed_s,
                      "failure": status.failure, "stragglers": status.stragglers,
                      "goodput": status.goodput, "hosts": [asdict(h) for h in status.hosts]})
    return body + ("\n" + status.verdict if status.verdict else "")


def gathered_log(run_dir: Path, report: dict, rank: int | None, host: str | None,
                 tail: int) -> str:
    """A rank's log from the gathered copy (runs/<id>/logs/<host>), by the report's ranks."""
    ranks = [r for r in report.get("ranks", []) if isinstance(r, dict)]
    hosts = {str(h.get("host")): h for h in report.get("hosts", []) if isinstance(h, dict)}
    if host is not None and host not in hosts:
        raise ValueError("run %s has no host %s; its hosts: %s" % (
            run_dir.name, host, ", ".join(list(hosts)[:8])))
    chosen = [r for r in ranks if (rank is None or r.get("rank") == rank)
              and (host is None or r.get("host") == host)]
    if not chosen:
        raise ValueError("run %s has no rank %s%s; its ranks: 0 to %d" % (
            run_dir.name, rank, "" if host is None else " on %s" % host, len(ranks) - 1))
    pick = min(chosen, key=lambda r: r["rank"] if isinstance(r.get("rank"), int) else 0)
    where = str(pick.get("host"))
    logs = hosts.get(where, {}).get("logs") or str(run_dir / "logs" / where)
    answer = ranklog.read({"run_dir": logs, "local_rank": int(pick.get("local_rank") or 0),
                           "offsets": {}, "tail": tail, "max_bytes": ranklog.MAX_BYTES,
                           "wait_s": 0})
    return "".join(answer["streams"][s]["text"] for s in ranklog.STREAMS)
