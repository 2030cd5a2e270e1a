"""A run's status at a glance, from the master's record as one look read it (status.yml,
`torchfleet status ID`): the run's phase, attempt and elapsed time, and per host its state,
ranks alive, last line, when the master last heard from it and its hardware (the newest event
it reported: a warning such as clocks held down, or a fatal one; and how many more warnings
it had than the record holds).

The record comes from another host: every field is checked here, never assumed (a missing or
garbled field reads as unknown, and nothing raises).
"""
from __future__ import annotations

from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import goodput
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.summary import timeline
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import straggle
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.runstate import (
    dropped, failure_text, more_warnings)
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.table import render

LINE_MAX = 120


_num = goodput.finite  # (a 400-digit int or 1e999 from the record is no time: None)


def _text(value, limit=LINE_MAX):
    return value[-limit:] if isinstance(value, str) else ""


def view(record, now, attempt=0):
    """{run_id, phase, final, attempt, elapsed_s, failure (words), stragglers (words; or why
    none are watched), hosts: [{host, state,
    ranks_alive, last_line, last_heard_s, hardware}]} of a record read at `now` (the master's
    clock); hardware: how many events the host reported and the newest in words."""
    record = record if isinstance(record, dict) else {}
    hardware = hardware_by_host(record.get("events"), dropped(record))
    now = _num(now)
    started = _num(record.get("started"))
    hosts = []
    for h in record.get("hosts") if isinstance(record.get("hosts"), list) else []:
        if not isinstance(h, dict):
            continue
        seen = _num(h.get("last_seen"))
        alive = h.get("alive")
        hosts.append({
            "host": _text(h.get("host"), 255),
            "state": _text(h.get("state"), 32) or "unknown",
            "ranks_alive": alive if isinstance(alive, int) and not isinstance(alive, bool) else 0,
            "last_line": _text(h.get("last_line")),
            "last_heard_s": round(now - seen, 1) if now is not None and seen is not None
            else None,
            "hardware": hardware.get(_text(h.get("host"), 255), "")})
    failure = record.get("failure")
    try:
        words = failure_text(failure)[:1000] if isinstance(failure, dict) else ""
    except (TypeError, ValueError, KeyError, AttributeError):  # a garbled failure
        words = _text(failure.get("detail"), 1000) or "unreadable"
    return {"run_id": _text(record.get("run_id"), 64), "phase": _text(record.get("phase"), 32)
            or "unknown", "final": record.get("final") is True, "attempt": attempt,
            "elapsed_s": round(now - started, 1) if now is not None and started is not None
            else None,
            "failure": words, "stragglers": stragglers(record),
            "goodput": live_goodput(record, now, attempt),
            "hosts": hosts}


def live_goodput(record, now, attempt=0):
    """The goodput line of a run that goes on, from its master's record alone (its clock, as
    `now`): this attempt from its agents' start (the controller's plays before it are not in
    the record: the report's figure counts them)."""
    if now is None or not isinstance(attempt, int) or isinstance(attempt, bool):
        return ""
    record = dict(record, clock=None)  # every time is the master's, and so is now
    g = goodput.goodput(timeline({"attempts": [{"attempt": attempt}]}, {attempt: record}, now))
    return goodput.line(g) + ("" if attempt == 0 else " (attempt %d, from its start)" % attempt)


def stragglers(record):
    """The stragglers of the master's last judgement in words; or why none are watched, or
    hosts not compared."""
    watch = record.get("straggle") if isinstance(record.get("straggle"), dict) else {}
    return straggle.unwatched(watch) + straggle.blind(watch) + [
        straggle.words(s) for s in straggle.read(record.get("stragglers")) if s["active"]]


def report_stragglers(report):
    """A gathered report's stragglers in words (every one the run had), or why none were
    watched."""
    watch = report.get("straggle") if isinstance(report.get("straggle"), dict) else {}
    if watch.get("watched") is False:
        return [str(watch.get("why") or "not watched")[:300]]
    return straggle.blind(watch) + [straggle.words(s) for s in straggle.read(
        report.get("stragglers"))]


def hardware_by_host(events, more=None):
    """{host: how many hardware events it reported, and the newest in words} of a record's
    `events` or a report's `hardware`; more: {host: warnings the record does not hold}
    (runstate.dropped, a report's `hardware_dropped`), said as "and N more warnings"."""
    mine = {}
    for e in events if isinstance(events, list) else []:
        if isinstance(e, dict) and isinstance(e.get("host"), str):
            mine.setdefault(e["host"], []).append(e)
    more = more if isinstance(more, dict) else {}
    out = {}
    for host in list(mine) + [h for h in more if h not in mine and isinstance(h, str)]:
        found = mine.get(host, [])
        n = more.get(host)
        n = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0
        words = "%d event%s, last: %s%s" % (
            len(found), "" if len(found) == 1 else "s",
            "FATAL " if found[-1].get("fatal") is True else "",
            _text(found[-1].get("what") or found[-1].get("line"), 80)) if found else ""
        out[host] = ", ".join(w for w in (words, more_warnings(n)) if w)
    return out


def text(v):
    """The view as people read it: one line for the run, one row per host."""
    elapsed = "%.0f s" % v["elapsed_s"] if v["elapsed_s"] is not None else "-"
    head = "run %s  %s%s  attempt %d  elapsed %s" % (
        v["run_id"], v["phase"], " (final)" if v["final"] else "", v["attempt"], elapsed)
    if v["failure"]:
        head += "\nfirst failure: %s" % v["failure"]
    if v.get("goodput"):
        head += "\n%s" % v["goodput"]
    for words in v.get("stragglers") or []:
        head += "\nstraggler%s: %s" % ("s" if words.startswith(("not watched", "blind")) else "",
                                       words)
    rows = [(h["host"], h["state"], h["ranks_alive"],
             "-" if h["last_heard_s"] is None else "%.0f s ago" % h["last_heard_s"],
             h["hardware"] or "-", h["last_line"]) for h in v["hosts"]]
    columns = ("HOST", "STATE", "RANKS ALIVE", "LAST HEARD", "HARDWARE", "LAST LINE")
    return head + "\n" + render(columns, rows)
