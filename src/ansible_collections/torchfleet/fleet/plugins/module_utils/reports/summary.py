"""The end of a launched run, decided on the controller: per host and rank what happened,
the first failure with its log tail, and for the collective test the busbw table.

Input is the run's state record (run_state.json, runstate.py: what the master's agent decided)
and what rank_results brought back per host; output is train.json / collective.json (same
shape as preflight.json: ok, run_id, hosts, checks) and the tables printed at the end of the
play.
"""
from __future__ import annotations

import glob
import itertools
import os
import re
import statistics
import time

from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.torchfleet.fleet.plugins.module_utils.host import kmsg, nccl_log
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import fabric, goodput, isolate, ledger, ledger_store, memory, slurm_drain
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import flight, straggle
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.stacks import FAULTHANDLER_FRAME
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.records import ERROR, WARNING, check, failed
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.report import point_link, prune_runs, verdict, write_report
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import (
    STACK_DUMP, TORCHRUN_LOG, failed_ranks, read_json, tail)
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.runstate import (
    CONTROLLER_LOST, HANG, HARDWARE, HW_REASONS, LOST, STATE_FILE, STOPPED_BY_USER, STRAGGLER,
    SUCCEEDED, TIMEOUT, UNKNOWN, action, check_of, checked_actions, collective_words, drains,
    dropped, evidence, failure_text, host_rows, more_warnings, oom_victim)
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.table import render, spread, spread_of
from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults

# Failures of the whole run rather than of a host (a hang is named per host: run.hang).
RUN_WIDE = {
    TIMEOUT: "raise job_timeout_s if the run needs longer",
    CONTROLLER_LOST: "the play was interrupted or the controller lost the master; run again",
    STOPPED_BY_USER: "start it again when you want it to run",
}

ARGUMENT_SPEC = dict(
    kind=dict(type="str", required=True, choices=["train", "collective"]),
    run_id=dict(type="str", required=True),
    hosts=dict(type="list", elements="str", required=True),
    state=dict(type="dict"),
    ranks=dict(type="dict", default={}),
    world_size=dict(type="int", required=True),
    settings=dict(type="dict", default={}),
    run_dir=dict(type="str", default=defaults.default("run_dir")),
    attempt_dir=dict(type="str", default=""),
    attempts=dict(type="list", elements="dict", default=[]),
    restarts=dict(type="list", elements="dict", default=[]),
    # The controller's clock (epoch seconds): started (the run's first play), launched
    # ({attempt: its launch play's start}), attempts (every attempt: attempt, dir): goodput.
    times=dict(type="dict", default={}),
    runs_root=dict(type="str", default=""),
    keep_runs=dict(type="int", default=defaults.default("keep_runs")),
    expect_results=dict(type="bool", default=True),
    tail_lines=dict(type="int", default=15),
    isolate=dict(type="dict", default={}, options=dict(
        threshold=dict(type="float", default=0.5),
        floor_gbs=dict(type="float", default=0.0),
        nics=dict(type="dict", default={}),
    )),
    # Whether to drain in Slurm (reports/slurm_drain.py: the audit's drains are done or not as
    # Slurm answered), each host's Slurm node name ({host: node}) and scontrol command (each
    # host's in slurm_scontrols, {host: command}; slurm_scontrol where none).
    slurm_drain=dict(type="bool", default=defaults.default("slurm_drain")),
    slurm_nodes=dict(type="dict", default={}),
    slurm_scontrol=dict(type="str", default="scontrol"),
    slurm_scontrols=dict(type="dict", default={}),
    # The fleet's ledger (reports/memory.py), and what preflight said of it already.
    ledger_said=dict(type="list", elements="str", default=[]),
    **memory.SPEC
)


def _tail(path, lines):
    return tail(path, lines, max_bytes=1 << 20)  # torchrun's failure summary ends its log


def _rank_log(run_dir, host, local_rank, lines):
    """Last lines of a rank's stderr (else stdout) from the logs gathered on the controller."""
    base = os.path.join(run_dir, "logs", host)
    attempts = sorted((d for d in os.listdir(base) if d.startswith("attempt_")),
                      key=lambda d: int(d.split("_")[1])) if os.path.isdir(base) else []
    for name in ("stderr.log", "stdout.log"):
        for attempt in reversed(attempts):
            text = _tail(os.path.join(base, attempt, str(local_rank), name), lines)
            if text.strip():
                return text
    return _tail(os.path.join(base, "torchrun.log"), lines)


def frames_of(dump_lines):
    """The frames of a stack dump, innermost first, as 'func (file:line)': py-spy's or
    faulthandler's."""
    found = []
    for line in dump_lines:
        m = FAULTHANDLER_FRAME.match(line)
        if m:
            found.append("%s (%s:%s)" % (m.group(3), os.path.basename(m.group(1)), m.group(2)))
        elif line.startswith("    "):
            found.append(line.strip())
    return found


THREAD_HEAD = re.compile(r"^(Current thread|Thread) ")
# Frames of torch's own wrappers around a collective: the rank's own code is the next one out.
LIBRARY_FRAME = re.compile(r"[(/](distributed_c10d|c10d_logger|threading)\.py:|[(/]torch/")


def main_frames(dump_lines):
    """The frames of the rank's main thread in a dump of every thread (py-spy names it
    MainThread; faulthandler names none: the thread whose outermost frame is a module's), the
    watcher thread of the run's sitecustomize left out."""
    blocks, block = [], []
    for line in dump_lines:
        if THREAD_HEAD.match(line):
            blocks.append(block)
            block = [line]
        else:
            block.append(line)
    threads = [(b[0] if b else "", frames_of(b)) for b in blocks + [block]]
    threads = [(head, frames) for head, frames in threads if frames]
    threads = [t for t in threads if not any("sitecustomize" in f for f in t[1])] or threads
    for head, frames in threads:
        if "MainThread" in head:
            return frames
    for _head, frames in threads:
        if "<module>" in frames[-1]:
            return frames
    return threads[0][1] if threads else []


def stack_path(run_dir, host, local_rank):
    found = sorted(glob.glob(os.path.join(run_dir, "logs", host, "attempt_*", str(local_rank),
                                          STACK_DUMP)))
    return found[-1] if found else None


def where(run_dir, host, local_rank):
    """The innermost frame of a rank's own code in its gathered stack ('' without one)."""
    path = stack_path(run_dir, host, local_rank)
    frames = main_frames(_tail(path, 200).splitlines()) if path else []
    own = [f for f in frames if not LIBRARY_FRAME.search(f)]
    return (own or frames or [""])[0]


def stacks(run_dir, hosts, frames=4):
    """Where each hung rank is: its dump's innermost frames, from the gathered logs; a dump
    that could not be taken says why."""
    lines = []
    for host in hosts:
        for path in sorted(glob.glob(os.path.join(run_dir, "logs", host, "attempt_*", "*",
                                                  STACK_DUMP))):
            text = _tail(path, 200).splitlines()
            who = text[0].lstrip("# ") if text and text[0].startswith("#") else (
                "local rank " + os.path.basename(os.path.dirname(path)))
            where = main_frames(text)[:frames]
            lines.append("%s %s: %s" % (host, who, " <- ".join(where) or " ".join(text[1:])[:200]))
    return "\n".join(lines)


def hang_detail(abort, host):
    """run.hang of one host: the ranks of this host the recording names, else the hang's
    words."""
    found = (abort or {}).get("collective") or {}
    mine = ["rank %d never joined collective #%d" % (m["rank"], found["seq"])
            for m in found.get("missing") or [] if m["host"] == host]
    mine += ["rank %d called %s at collective #%d" % (m["rank"], m["op"], found["seq"])
             for m in found.get("mismatch") or [] if m["host"] == host]
    if mine:
        return "; ".join(mine) + "; stacks in py-spy-dump.txt"
    if found.get("missing") or found.get("mismatch"):
        return "its ranks waited in collective #%d (%s) for the ranks named; stacks in " \
            "py-spy-dump.txt" % (found["seq"], found["op"] or "op unknown")
    if flight.all_in(found):
        return "its ranks waited in collective #%d (%s), which every rank joined and none " \
            "completed; stacks in py-spy-dump.txt" % (found["seq"], found["op"] or "op unknown")
    return "%s; stacks in py-spy-dump.txt" % ((abort or {}).get("detail") or
                                              "no progress for hang_timeout_s")


def first_failure(record, run_dir, lines):
    """The run's first failure as the master's record judged it (runstate.py decides; this only
    adds what a person reads next): the tail of that rank's log, or on a hang where every rank
    was stuck. None when the run did not fail."""
    failure = record.get("failure")
    if not failure:
        return None
    host, local_rank = failure.get("host"), failure.get("local_rank")
    found = failure.get("collective")
    whole = failure["reason"] in HW_REASONS  # its words name the host themselves
    # (Under a hardware cause where the other ranks were is a consequence: left out.)
    extra = "" if failure.get("stalled") or failure["reason"] == STRAGGLER or whole \
        else collective_words(failure)
    reason = failure.get("detail") or failure["reason"]
    if whole:
        reason = failure_text(failure)
        if failure["reason"] == HARDWARE and flight.text(found):
            reason += "; the ranks were at " + flight.text(found)  # a hang's finding, kept
    out = {"host": host, "node_rank": failure.get("node_rank"), "rank": failure.get("rank"),
           "local_rank": local_rank, "exit_code": failure.get("exitcode"),
           "consequence": bool(failure.get("consequence")), "failure": failure["reason"],
           "reason": reason + ("; " + extra if extra else ""), "collective": found,
           "event": failure.get("event"), "names_host": whole}
    if whole:
        # The event's own line, the device and the rank it hit: not the abort's tracebacks
        # (the rank log's tail, torchrun's SIGTERM), which are its consequences.
        out["event"] = dict(failure.get("event") or {}, died=failure.get("died"))
        out["tail"] = "\n".join("%s: %s" % row for row in evidence(
            failure.get("event"), failure.get("rank"), failure.get("died")))
        return out
    if failure["reason"] == HANG:
        reason = out["reason"]
        named = (found or {}).get("missing") or (found or {}).get("mismatch") or []
        first = {h["host"]: h["ranks"][0] for h in record.get("hosts") or []}
        if named and named[0]["host"] in first:
            at = where(run_dir, named[0]["host"], named[0]["rank"] - first[named[0]["host"]])
            reason += "; it is in %s" % at if at else ""
        elif flight.all_in(found):  # where the first few ranks wait (4,096 would be a page)
            at = ("%s rank %d is in %s" % (h["host"], rank, spot)
                  for h in record.get("hosts") or [] if h.get("ranks")
                  for rank in range(h["ranks"][0], h["ranks"][1] + 1)
                  for spot in [where(run_dir, h["host"], rank - h["ranks"][0])] if spot)
            reason += "".join("; " + a for a in itertools.islice(at, 3))  # stacks read: 3
        elif found and found.get("note"):
            reason += " (%s)" % found["note"]
        out.update(reason=reason + "; stacks:",
                   tail=stacks(run_dir, [h["host"] for h in record.get("hosts") or []]))
    elif host and local_rank is not None:
        out["tail"] = _rank_log(run_dir, host, local_rank, lines)
    elif host:
        out["tail"] = _tail(os.path.join(run_dir, "logs", host, TORCHRUN_LOG), lines)
    else:
        out["tail"] = ""
    return out


def _count(value):
    """A record's count, a non-negative int (0 for anything else)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def hardware_checks(record, hosts):
    """What the record's hardware events say per host: run.hardware (fatal: an error, "and N
    more fatal events" past the ones shown and the ones the master did not keep; else a
    warning that never fails a run, "and N more warnings" past the ones shown and the ones
    not kept; and a warning where the GPUs were not wholly watched: the watch's gpu_error),
    run.oom (a fatal OOM kill: the run's), host.kmsg (the kernel log could not be read, or
    its ring overran and records were lost unread: warnings), and `drain`: each host with a fatal hardware event, its first event's line as
    evidence. Returns {"checks", "drain", "hardware", "hardware_dropped"} (hardware: every
    event, as the record dated it; hardware_dropped: {host: warnings not kept})."""
    events = [e for e in record.get("events") or [] if isinstance(e, dict)
              and e.get("host") in hosts]
    more = {h: n for h, n in dropped(record).items() if h in hosts}
    checks, drain = [], []
    for host in hosts:
        mine = [e for e in events if e["host"] == host]
        fatal = [e for e in mine if drains(e)]
        rec = next((h for h in record.get("hosts") or [] if isinstance(h, dict)
                    and h.get("host") == host), None) or {}
        if fatal:
            drain.append({"host": host, "reason": "run.hardware",
                          "evidence": fatal[0].get("line") or fatal[0].get("what")})
            # Past the four shown: the others kept, and those the master did not keep
            # (fatal_more: past FATAL_PER_HOST or FATAL_PER_MESSAGE, none earlier).
            untold = max(0, len(fatal) - 4) + max(0, _count(rec.get("fatal_more")))
            checks.append(check("run.hardware", host, False, "; ".join(
                ["%s%s" % (e.get("what") or e.get("line"), " (rank %d)" % e["rank"]
                           if e.get("rank") is not None else "") for e in fatal[:4]]
                + (["and %d more fatal event%s" % (untold, "" if untold == 1 else "s")]
                   if untold else [])),
                "drain %s and look at the device named: the run's other failures follow "
                "from it" % host))
        warned = [e for e in mine if not e.get("fatal")]
        untold = max(0, len(warned) - 4) + more.get(host, 0)
        if warned or untold:
            checks.append(check("run.hardware", host, False, "; ".join(
                ["%s%s" % (e.get("what") or e.get("line"), " (%d times)" % e["count"]
                           if (e.get("count") or 1) > 1 else "") for e in warned[:4]]
                + ([more_warnings(untold)] if untold else [])),
                "watch %s: warnings do not fail a run" % host, severity=WARNING))
        for e in mine:
            if e.get("kind") == "oom" and e.get("fatal") is True:
                checks.append(check("run.oom", host, False, "%s was %s" % (
                    oom_victim(e.get("rank"), e.get("pid")), e.get("what")), "give the ranks "
                    "more memory, or use less: the kernel's OOM killer ended it (%s)"
                    % (e.get("line") or "")[:200]))
        watch = rec.get("watch") if isinstance(rec.get("watch"), dict) else None
        if watch and watch.get("kmsg_error"):
            checks.append(check("host.kmsg", host, False, watch["kmsg_error"], kmsg.FIX,
                                severity=WARNING))
        how = str((watch or {}).get("kmsg") or "")
        if kmsg.OVERRAN in how:  # read, not wholly: the records the ring overwrote unread
            checks.append(check("host.kmsg", host, False, "%s: %s" % (
                how.split(" (", 1)[0], how[how.find(kmsg.OVERRAN):].rstrip(")")),
                "the kernel printed faster than the watch read it: look for the flood in "
                "the host's kernel log (corrected PCIe AER errors of a kernel without AER's "
                "rate limit, a NIC's link messages); a fatal line among the lost is not seen",
                severity=WARNING))
        if watch and watch.get("gpu_error"):  # why NVML or nvidia-smi is not (wholly) read
            checks.append(check("run.hardware", host, False, "the GPUs were not wholly "
                                "watched: %s" % watch["gpu_error"],
                                "install nvidia-ml-py in the agents' Python, or fix what the "
                                "message names: Xids still come from the kernel log",
                                severity=WARNING))
        if watch and watch.get("watch_error"):  # the watch's own crash, not the log's
            checks.append(check("run.hardware", host, False, watch["watch_error"],
                                "a fault of torchfleet's hardware watch: its other sources "
                                "went on; report it with the agent's log", severity=WARNING))
    return {"checks": checks, "drain": drain, "hardware": events, "hardware_dropped": more}


def straggler_checks(record, hosts):
    """What the record's stragglers say: run.straggler per host (a warning; an error when one
    ended the attempt, straggler_action=restart), and `stragglers` as train.json carries them
    (first_seen and last_seen in ISO 8601 UTC). Returns {"checks", "stragglers", "straggle"}."""
    found = [s for s in straggle.read(record.get("stragglers")) if s["host"] in hosts]
    ended = {f.get("host") for f in record.get("failures") or []
             if isinstance(f, dict) and f.get("reason") == STRAGGLER}
    checks = [check("run.straggler", s["host"], False, straggle.words(s),
                    "look at %s's GPUs (clocks, thermals), CPU load and NIC rate; with "
                    "straggler_action=restart and a spare the run goes on without it"
                    % s["host"], severity=ERROR if s["host"] in ended else WARNING)
              for s in found]
    watch = record.get("straggle") if isinstance(record.get("straggle"), dict) else {}
    started, updated = (straggle._num(record.get(k)) for k in ("started", "updated"))
    return {"checks": checks, "straggle": {"watched": watch.get("watched") is not False
                                           and not straggle.unwatched(watch),
                                           "why": (straggle.unwatched(watch) or [""])[0],
                                           "blind": (straggle.blind(watch) or [""])[0],
                                           "signal": str(watch.get("signal") or "")[:16],
                                           "started": _iso(started), "ended": _iso(updated)},
            "stragglers": [{"host": s["host"], "ranks": s["ranks"],
                            "share_last": s["share_last"],
                            "late_ms_median": s["late_ms_median"],
                            "late_ms_mean": s["late_ms_mean"],
                            "interval_ms": s["interval_ms"],
                            "first_seen": _iso(s["first_seen"]),
                            "last_seen": _iso(s["last_seen"])} for s in found]}


def blind_note(slow):
    """What a verdict adds when the run's groups left its hosts uncompared (straggler_checks'
    straggle.blind): '; stragglers blind between hosts: ...', or ''."""
    said = slow["straggle"].get("blind")
    return "; stragglers %s" % said if said else ""


def _iso(at):
    return None if at is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def host_transport(run_dir, host):
    """What NCCL used on a host, from the head of its ranks' gathered logs (None: no NCCL INFO
    line there)."""
    procs = []
    pattern = os.path.join(run_dir, "logs", host, "attempt_*", "*", "std*.log")
    for path in sorted(glob.glob(pattern)):
        try:
            procs.extend(nccl_log.parse(nccl_log.read_head(path)))
        except OSError:
            continue
    return nccl_log.summarize(procs)


def busbw_table(results, world_size):
    """Per op and size across ranks: busbw min / median / max, slowest rank, wrong elements."""
    rows = {}
    for r in results:
        for item in r.get("results", []):
            key = (item["op"], item["size_bytes"])
            rows.setdefault(key, []).append((r, item))
    table = []
    for (op, size), entries in rows.items():  # the workload's order: op by op, sizes rising
        busbw = [item["busbw_gbs"] for _rank, item in entries]
        slow_rank, slow = max(entries, key=lambda e: e[1]["time_us"])
        table.append({
            "op": op, "size_bytes": size, "count": entries[0][1]["count"],
            "ranks": len(entries), "time_us_max": slow["time_us"],
            "algbw_gbs_min": min(item["algbw_gbs"] for _rank, item in entries),
            "busbw_gbs_min": min(busbw), "busbw_gbs_median": statistics.median(busbw),
            "busbw_gbs_max": max(busbw), "wrong": sum(item["wrong"] for _rank, item in entries),
            "slowest_rank": slow_rank["rank"], "slowest_host": slow_rank.get("host"),
            "missing_ranks": world_size - len(entries)})
    return table


def host_busbw(results, op="all_reduce"):
    """Each host's ranks' busbw at the op's largest size: {host: {op, size_bytes, min, median,
    max}}. An outlier host shows here in every run, not only with the pair rounds."""
    sizes = [i["size_bytes"] for r in results for i in r.get("results", []) if i["op"] == op]
    if not sizes:
        return {}
    largest = max(sizes)
    per_host = {}
    for r in results:
        for item in r.get("results", []):
            if item["op"] == op and item["size_bytes"] == largest:
                per_host.setdefault(r.get("host"), []).append(item["busbw_gbs"])
    return {host: {"op": op, "size_bytes": largest, "min": min(bw),
                   "median": statistics.median(bw), "max": max(bw)}
            for host, bw in per_host.items()}


def collective_text(table):
    blocks = []
    for op in dict.fromkeys(row["op"] for row in table):
        rows = [(r["size_bytes"], r["count"], "%.1f" % r["time_us_max"],
                 "%.4g" % r["algbw_gbs_min"],
                 spread(r["busbw_gbs_min"], r["busbw_gbs_median"], r["busbw_gbs_max"]),
                 r["wrong"], "%s (rank %s)" % (r["slowest_host"], r["slowest_rank"]))
                for r in table if r["op"] == op]
        blocks.append(op + "\n" + render(
            ("size(B)", "count", "time(us)", "algbw(GB/s)", "busbw(GB/s) min/med/max",
             "#wrong", "slowest"), rows))
    return "\n\n".join(blocks)


def rank_states(hosts_out, results, run_dir, nproc, failure=None):
    """Every rank's end: [{rank, host, local_rank, ok, exit_code, state}].

    A rank's exit code comes from torchrun's failure summary on its host (negative: a signal)
    or is 0 when its host's torchrun succeeded; the first failure's rank's from the judge's
    record (`failure`: first_failure(), read as the rank died) where torchrun said none: the abort can stop its
    torchrun before it prints its summary. state: succeeded | failed | killed (by a signal)
    | stopped (ended by torchfleet after another rank failed, no code recorded).
    """
    rows = {}
    for h in hosts_out:
        mine = [r for r in results if r.get("host") == h["host"]]
        for r in mine:
            done = h["outcome"] == "succeeded"
            rows[(h["host"], r.get("local_rank"))] = {
                "rank": r.get("rank"), "host": h["host"], "local_rank": r.get("local_rank"),
                "ok": bool(r.get("ok")) and done, "exit_code": 0 if done else None,
                "state": "succeeded" if done else "stopped"}
        text = _tail(os.path.join(run_dir, "logs", h["host"], TORCHRUN_LOG), 400) if run_dir else ""
        for f in failed_ranks(text):
            rows[(h["host"], f["local_rank"])] = {
                "rank": f["rank"], "host": h["host"], "local_rank": f["local_rank"], "ok": False,
                "exit_code": f["exitcode"], "state": "failed" if f["exitcode"] > 0 else "killed"}
        for local_rank in range(nproc):
            rows.setdefault((h["host"], local_rank), {
                "rank": h["node_rank"] * nproc + local_rank, "host": h["host"], "local_rank": local_rank, "ok": False,
                "exit_code": None, "state": "stopped"})
    failure = failure or {}
    row = rows.get((failure.get("host"), failure.get("local_rank")))
    code = failure.get("exit_code")
    if row is not None and row["exit_code"] is None and isinstance(code, int) and code:
        row.update(ok=False, exit_code=code, state="failed" if code > 0 else "killed")
    return sorted(rows.values(), key=lambda r: (r["rank"] is None, r["rank"] or 0, r["host"],
                                                r["local_rank"]))


def _span(ranks):
    return "-" if not ranks else str(ranks[0]) if len(ranks) == 1 else "%d-%d" % (ranks[0],
                                                                                  ranks[-1])


def attempts_of(attempts, restarts):
    """Every attempt of a run with max_restarts, as its own record (run_state.json in its
    directory) says it ended, with the restart decision that followed it (restart.py's)."""
    decided = {d.get("attempt"): d for d in restarts}
    out = []
    for a in attempts:
        record = read_json(os.path.join(a["dir"], STATE_FILE)) or {}
        failure = record.get("failure")
        decision = decided.get(a["attempt"]) or {}
        out.append({
            "attempt": a["attempt"], "hosts": a["hosts"], "dir": a["dir"],
            "logs": os.path.join(a["dir"], "logs"),
            "phase": record.get("phase", UNKNOWN), "ok": record.get("phase") == SUCCEEDED,
            "outcomes": {r["host"]: r["outcome"] for r in host_rows(a["hosts"], dict(
                record, nproc_per_node=record.get("nproc_per_node") or 0))},
            "first_failure": failure_text(failure), "failure": failure,
            "drain": hardware_checks(record, a["hosts"])["drain"],
            "restart": decision.get("why", "") if decision.get("restart") else "",
            "not_restarted": "" if decision.get("restart") else decision.get("why", ""),
            "replaced": decision.get("replaced", []),
            "actions": checked_actions(record.get("actions")) + restart_actions(
                decision, record)})
    return out


def restart_actions(decision, record):
    """The audit's entries of a restart decision (restart.py's): the restart, done, or one
    actions=observe kept from being done; each host it replaced, excluded."""
    at = _time(record.get("updated")) or time.time()
    why = decision.get("why") or ""
    if decision.get("would"):
        return [action("restart", None, "run.restart", at, why, False)]
    if not decision.get("restart"):
        return []
    return [action("restart", None, "run.restart", at, why, True)] + [
        action("exclude", r.get("host"), "run.restart", at, "%s, replaced by %s" % (
            r.get("reason"), r.get("by")), True)
        for r in _list(decision.get("replaced")) if isinstance(r, dict)]


# A record's time: a finite number, else none (the record comes from another host: a
# 400-digit int or 1e999 is garbage, never an OverflowError in status or the report).
_time = goodput.finite


def _list(value):
    """A record's list, or none (the record comes from another host: a garbled field is [])."""
    return value if isinstance(value, list) else []


def timeline(times, records, now):
    """goodput.goodput()'s input (reports/goodput.py): every attempt's times on the
    controller's clock. times: the run_summary parameter (started, launched {attempt: t},
    attempts [{attempt, dir}]); records: {attempt: its record (run_state.json), whose `clock`
    the watch measured (offset_s = master - controller; 0.0 unmeasured) and whose times are the
    master's}. An attempt without its launch play's time (a detached run the controller that
    launched it did not gather) starts at its record's own start."""
    launched = times.get("launched") if isinstance(times.get("launched"), dict) else {}
    out, watched = [], ""
    for a in _list(times.get("attempts")):
        n = a.get("attempt") if isinstance(a, dict) else None
        if not isinstance(n, int) or isinstance(n, bool):
            continue
        record = records.get(n) if isinstance(records.get(n), dict) else {}
        clock = record.get("clock") if isinstance(record.get("clock"), dict) else {}
        offset = _time(clock.get("offset_s")) or 0.0

        def local(value, offset=offset):
            at = _time(value)
            return None if at is None else at - offset

        marks = record.get("timeline") if isinstance(record.get("timeline"), dict) else {}
        failure = record.get("failure") if isinstance(record.get("failure"), dict) else None
        watch = record.get("checkpoint_watch") \
            if isinstance(record.get("checkpoint_watch"), dict) else {}
        watched = watched or str(watch.get("dir") or "")
        launch = _time(launched.get(str(n)))
        out.append({
            "attempt": n, "launch": launch if launch is not None else local(record.get("started")),
            **{k: local(marks.get(k)) for k in (
                "running", "init_done", "failed", "stopped", "last_collective")},
            "failure": None if failure is None else {"check": check_of(failure),
                                                     "host": failure.get("host") or ""},
            "checkpoints": [dict(c, began=local(c.get("began")), ended=local(c.get("ended")))
                            for c in _list(record.get("checkpoints")) if isinstance(c, dict)],
            "checkpoints_folded": _folded_local(record.get("checkpoints_folded"), local),
            "checkpoint_warnings": [w for w in _list(watch.get("warnings"))
                                    if isinstance(w, str)],
            "checkpoint_blind": watch.get("blind") is True})
    nnodes = [r.get("nnodes") for r in records.values() if isinstance(r, dict)]
    return {"started": _time(times.get("started")), "now": now, "checkpoint_dir": watched,
            "attempts": out, "nnodes": nnodes[-1] if nnodes else None}


def _folded_local(folded, local):
    """The record's aggregate of its oldest saves, its times on the controller's clock."""
    if not isinstance(folded, dict):
        return None
    return dict(folded, first=local(folded.get("first")), last=local(folded.get("last")))


def run_goodput(times, last_record, now=None, history=None, reported=None):
    """The report's goodput object (goodput.goodput of timeline()), the last attempt's record
    as given, the others' read from their directories; None without any attempt. history: the
    runs root's failures for the MTBF (goodput.history); reported: the report's time (the
    wall time ends there: the gather is teardown)."""
    attempts = [a for a in _list(times.get("attempts")) if isinstance(a, dict)]
    if not attempts:
        return None
    records = {a.get("attempt"): read_json(os.path.join(str(a.get("dir") or ""), STATE_FILE))
               or {} for a in attempts[:-1]}
    records[attempts[-1].get("attempt")] = last_record
    if now is None and isinstance(last_record, dict) and last_record.get("final"):
        # A final record's run ended when it was last updated, not when it is reported: a
        # host never heard to stop must not count the report's delay as detection.
        clock = last_record.get("clock") if isinstance(last_record.get("clock"), dict) else {}
        updated = _time(last_record.get("updated"))
        now = None if updated is None else updated - (_time(clock.get("offset_s")) or 0.0)
    tl = timeline(times, records, time.time() if now is None else now)
    tl["reported"] = reported
    return goodput.goodput(tl, history=history)


def restart_checks(attempts):
    """run.restart: each host an attempt left behind, with the host that took its place."""
    return [check("run.restart", r["host"], False,
                  "attempt %d: %s, replaced by %s in attempt %d" % (
                      a["attempt"], r["reason"], r["by"], a["attempt"] + 1),
                  "fix %s before it is needed again" % r["host"], WARNING)
            for a in attempts for r in a["replaced"]]


def link_logs(run_dir, attempt_dir):
    """runs/<run_id>/logs -> the last attempt's logs: logs/<host>/ is where every run's logs are
    (DESIGN.md's Outputs), whichever attempt ended the run."""
    link = os.path.join(run_dir, "logs")
    if os.path.exists(link) and not os.path.islink(link):
        return  # a directory of the user's: left alone
    try:
        point_link(link, os.path.join(attempt_dir, "logs"))
    except OSError:
        pass  # the report still names every attempt's logs


def decide(params):
    hosts, ranks = params["hosts"], params["ranks"]
    kind, world = params["kind"], params["world_size"]
    nproc = int(params["settings"].get("nproc_per_node") or 0)
    results = sorted((r for h in hosts for r in (ranks.get(h) or {}).get("results", [])),
                     key=lambda r: r.get("rank", 0))
    # With max_restarts each attempt keeps its logs and record in attempt_<n>/: the report
    # describes the last one and lists them all.
    logs_dir = params["attempt_dir"] or params["run_dir"]
    record = params.get("state")
    if record is None and logs_dir:
        record = read_json(os.path.join(logs_dir, STATE_FILE))
    record = record or {"phase": UNKNOWN, "failure": None, "failures": [], "hosts": []}
    abort = record.get("failure")
    failure = first_failure(record, logs_dir, params["tail_lines"])
    own = {}  # each host's own failures, as the record keeps them
    for f in record.get("failures") or []:
        own.setdefault(f.get("host"), []).append(f)
    checks, rows_out = [], []
    if abort and abort.get("host") is None and abort.get("reason") in RUN_WIDE:
        checks.append(check("run." + abort["reason"], "controller", False,
                            abort.get("detail", ""), RUN_WIDE[abort["reason"]]))
    for rec in host_rows(hosts, dict(record, nproc_per_node=record.get("nproc_per_node")
                                     or nproc)):
        host, outcome = rec["host"], rec["outcome"]
        ok = outcome == "succeeded"
        detail = "%s, exit %s after %.1f s" % (outcome, "-" if rec.get("rc") is None
                                               else rec["rc"], rec.get("elapsed_s") or 0.0)
        hint = "see %s/logs/%s/" % (logs_dir, host)
        if failure and failure["host"] == host:
            detail += "; first failure: %s" % failure["reason"]
        if outcome == LOST:
            lost = [f for f in own.get(host, []) if f["reason"] == LOST]
            checks.append(check("host.lost", host, False, lost[0]["detail"] if lost else
                                "the host stopped answering during the run",
                                "check the host and its network (ssh %s); the others were "
                                "stopped" % host))
        checks.append(check("run.exit", host, ok, detail, hint))
        if outcome == HANG:
            checks.append(check("run.hang", host, False, hang_detail(abort, host), hint))
        node_rank = rec.get("node_rank", hosts.index(host))
        rows_out.append({"host": host, "node_rank": node_rank,
                         "ranks": list(range(node_rank * nproc, node_rank * nproc + nproc)),
                         "outcome": outcome, "rc": rec.get("rc"),
                         "duration_s": rec.get("elapsed_s"),
                         "reported_ranks": [r["rank"] for r in results if r.get("host") == host],
                         "logs": os.path.join(logs_dir, "logs", host)})
    hardware = hardware_checks(record, hosts)
    if params["actions"] == "observe" and record.get("phase") == SUCCEEDED:
        # Observed, not acted on, and the run ended well all the same: what would have stopped
        # it is said (a warning and the verdict's "would have"), the run's fate is its own.
        hardware["checks"] = [dict(c, severity=WARNING, hint="actions=observe: the run went "
                                   "on; " + c["hint"]) if c["id"] in ("run.hardware", "run.oom")
                              and c["severity"] == ERROR else c for c in hardware["checks"]]
    checks.extend(hardware.pop("checks"))
    if not hardware["hardware_dropped"]:  # (returned only when some warnings were not kept)
        del hardware["hardware_dropped"]
    slow = straggler_checks(record, hosts)
    checks.extend(slow.pop("checks"))
    settings = params["settings"]
    if boolean(settings.get("transport_check", False), strict=False) and logs_dir:
        seen = {h: host_transport(logs_dir, h) for h in hosts}
        for row in rows_out:
            row["transport"] = seen.get(row["host"])
        # A host whose ranks ended before NCCL started says nothing; one that ran through
        # without a word from NCCL is unknown.
        checked = [r["host"] for r in rows_out
                   if seen.get(r["host"]) is not None or r["outcome"] == SUCCEEDED]
        checks.extend(fabric.transport_checks(
            checked, seen, settings.get("network"),
            boolean(settings.get("expect_gdr", True), strict=False)))
    present = {r.get("rank") for r in results}
    missing = [r for r in range(world) if r not in present]
    # A user's script need not write rank results; when some rank did, all must have.
    if params["expect_results"] or results:
        checks.append(check("rank.missing", "controller", not missing,
                            "%d of %d ranks reported" % (len(present), world) if not missing
                            else "no result from rank(s) %s" % ", ".join(map(str, missing[:20])),
                            "read the missing ranks' logs under logs/<host>/"))
    extra = {}
    if kind == "collective":
        table = busbw_table(results, world)
        wrong = [r for r in results if not r.get("ok")]
        checks.append(check("collective.wrong", "controller", results and not wrong,
                            "every op and size exact on %d rank(s)" % len(results) if not wrong
                            else "wrong results on rank(s) %s" % ", ".join(
                                str(r["rank"]) for r in wrong),
                            "check the NIC, driver and NCCL versions of those hosts"))
        extra.update(busbw=table, table_collective=collective_text(table))
        per_host = host_busbw(results)
        for row in rows_out:
            row["busbw_gbs"] = per_host.get(row["host"])
        opts = params.get("isolate") or {}
        pairs = isolate.verdict(results, hosts, threshold=opts.get("threshold", 0.5),
                                floor_gbs=opts.get("floor_gbs", 0.0), nics=opts.get("nics"))
        if pairs:
            checks.extend(pairs.pop("checks"))
            extra.update(isolate=pairs, table_collective=extra["table_collective"] + "\n\n"
                         + isolate.text(pairs))
    elif any("checksum" in r for r in results):  # the built-in training workload
        agree = (len({r.get("checksum") for r in results}) == 1
                 and all(r.get("checksums_agree") for r in results))
        checks.append(check("train.checksum", "controller", agree,
                            "parameters identical on %d rank(s)" % len(results) if agree else
                            "parameter checksums differ across ranks: gradients were not "
                            "synchronised", "check that every rank runs the same code"))
    bad = failed(checks)
    if params["attempts"]:
        extra["attempts"] = attempts_of(params["attempts"], params["restarts"])
        checks.extend(restart_checks(extra["attempts"]))
        # A host drained in an earlier attempt stays drained: every attempt's, once each.
        drained = {}
        for entry in [d for a in extra["attempts"] for d in a["drain"]] + hardware["drain"]:
            drained.setdefault(entry["host"], entry)
        hardware["drain"] = list(drained.values())
    sentence = verdict(kind, checks, failure, extra.get("attempts", [])) + blind_note(slow)
    # The collective test's report has it only when it may restart (its attempts).
    if kind == "train" or params["attempts"]:
        # The runs root's other runs give the MTBF its history (per host-second); the report's
        # own time ends the wall time (the command's, first play to last).
        extra["goodput"] = run_goodput(
            params["times"], record, reported=time.time(),
            history=goodput.history(params["runs_root"], params["run_id"])
            if params["runs_root"] else None)
    rank_rows = rank_states(rows_out, results, logs_dir, nproc, failure)
    extra.update(hardware, **slow)
    report = dict(ok=not bad, kind=kind, run_id=params["run_id"], world_size=world,
                  phase=record.get("phase"), hosts=rows_out, ranks=rank_rows, checks=checks,
                  first_failure=failure, verdict=sentence, settings=params["settings"], **extra)
    # The fleet's memory of the run, written before its report (whose warning it may be):
    # the hosts it quarantines now are drained with the ledger's reason where asked.
    fleet = memory.open_fleet(params, params["run_dir"])
    recording = params["run_dir"] and params["ledger_record"]
    newly = memory.record(fleet, kind, report) if recording else []
    memory.textfile(fleet, params, params["run_dir"])
    # Slurm drains (reports/slurm_drain.py): the hosts with a fatal hardware cause and those
    # quarantined now (with the ledger's reason), unless the circuit breaker (this run's drains
    # with those torchfleet did within quarantine_h, the ledger's audit) or actions=observe
    # keeps them from being done. Hosts are compared and counted by the ledger's key
    # (node3.cluster.example is node3) and drained by the inventory's own name.
    key = ledger_store.canonical_host
    own = {key(h["host"]): h["host"] for h in rows_out}
    drained = {key(d["host"]) for d in hardware["drain"]}
    asked = hardware["drain"] + [
        {"host": own.get(key(q["host"]), q["host"]), "reason": "host.quarantined",
         "evidence": "%s (until %s)" % (q["reason"], memory.iso(q["until"]))}
        for q in newly if key(q["host"]) not in drained]
    at = time.time()
    observe = params["actions"] == "observe"
    breaker = [[], ""]

    def decide(held, seen):
        breaker[:] = drain_breaker(asked, list(own.values()), params["quarantine_max_fraction"],
                                   held, seen)
        return breaker[0] if params["slurm_drain"] and not observe else []
    # Decided under the ledger's decision lock, the drains pending in it until Slurm answers:
    # another controller's breaker counts them meanwhile.
    pending = fleet.decide_drains(params["run_id"], kind, decide, recording, at) if asked else []
    drain, tripped = breaker
    if observe:
        drain = []
    # Slurm's answer, before the audit is written: a drain it refused is not done.
    refused = slurm_drain.drain(pending, params["run_id"], params["slurm_nodes"],
                                params["slurm_scontrol"] or "scontrol",
                                params["slurm_scontrols"]) if pending else {}
    # The audit (docs/running.md): what torchfleet did on its own, or would have (done false),
    # in train.json and in the ledger (torchfleet hosts HOST).
    before = [a for att in extra.get("attempts", []) for a in att["actions"]] \
        if params["attempts"] else checked_actions(record.get("actions"))
    drains = [action("drain", d["host"], d["reason"], at, "; ".join(
        w for w in (d["evidence"], refused.get(d["host"])) if w),
        d in pending and not refused.get(d["host"])) for d in asked] \
        if params["slurm_drain"] else []
    if pending and recording:
        # A drain whose scontrol timed out may be done (slurmctld took it late): it stays
        # pending in the ledger, counted by every controller's breaker within quarantine_h.
        fleet.settle_drains(params["run_id"], kind, [
            a for a in drains if not slurm_drain.unanswered(refused.get(a["host"]))])
    audit = memory.audit(fleet, kind, params["run_id"], newly, at, before, drains, recording)
    fleet.close()
    report["actions"] = extra["actions"] = audit
    # train.json's `drain` keeps the hardware's (a quarantine is its own entry); the module's
    # every drain asked and not held back (the breaker, observe).
    report["drain"] = [d for d in drain if d["reason"] != "host.quarantined"]
    extra["drain"] = drain
    said = memory.ledger_checks(fleet, params["ledger_said"]) + memory.breaker_checks(tripped)
    if said:
        checks.extend(said)
        sentence = verdict(kind, checks, failure, extra.get("attempts", [])) + blind_note(slow)
        # The breaker is said in the verdict too: what torchfleet kept itself from doing.
        sentence += "".join("; %s" % c["detail"] for c in said
                            if c["id"] == ledger.BREAKER_CHECK)
    if observe and any(not a["done"] for a in audit):
        sentence += "; " + would_words(audit)
    report.update(checks=checks, verdict=sentence)
    if newly:
        report["quarantined"] = extra["quarantined"] = newly
    path = ""
    if params["run_dir"] and logs_dir != params["run_dir"]:
        link_logs(params["run_dir"], logs_dir)
    if params["run_dir"]:
        path = write_report(params["run_dir"], kind + ".json", report,
                            params["runs_root"] or None)
        if params["runs_root"]:
            prune_runs(params["runs_root"], params["keep_runs"])
    rows = [(h["host"], h["node_rank"], _span(h["ranks"]), h["outcome"],
             "-" if h["rc"] is None else h["rc"],
             "-" if h["duration_s"] is None else "%.1f s" % h["duration_s"], h["logs"])
            for h in rows_out]
    head = ("HOST", "NODE_RANK", "RANKS", "OUTCOME", "EXIT", "DURATION", "LOGS")
    if kind == "collective":  # each host's ranks at the largest all_reduce: outliers show
        head = head[:6] + ("BUSBW GB/s min/med/max",) + head[6:]
        rows = [r[:6] + (spread_of(h.get("busbw_gbs")),) + r[6:]
                for r, h in zip(rows, rows_out, strict=True)]
    if any("transport" in h for h in rows_out):  # what NCCL used, before the logs' path
        head = head[:-1] + ("NCCL TRANSPORT",) + head[-1:]
        rows = [r[:-1] + (nccl_log.describe(h.get("transport")),) + r[-1:]
                for r, h in zip(rows, rows_out, strict=True)]
    text = render(head, rows)
    if extra.get("table_collective"):
        text = extra["table_collective"] + "\n\n" + text
    text += "\n\n" + sentence + ("\n" + failure["tail"] if failure else "")
    if extra.get("goodput"):
        text += "\n" + goodput.line(extra["goodput"])
    if newly:
        text += "\n" + memory.newly_text(newly)
    if any(refused.values()):  # who Slurm did not drain, and the command that would
        text += "\n" + "\n".join("%s: %s" % (h, w) for h, w in sorted(refused.items()) if w)
    if said:
        text += "\n" + "\n".join("%s: %s" % (c["id"], c["detail"]) for c in said)
    out = dict(ok=not bad, checks=checks, failures=bad, first_failure=failure, report=path,
               verdict=sentence, table=text, hosts=rows_out, ranks=rank_rows, **extra)
    return out


def would_words(audit, most=6):
    """actions=observe in the verdict: what torchfleet would have done on its own."""
    would = [a for a in audit if not a["done"]]
    done = {"stop": "stopped", "drain": "drained", "quarantine": "quarantined",
            "exclude": "excluded", "restart": "restarted", "release": "released",
            "undrain": "undrained"}
    said = ["%s %s (%s)" % (done[a["action"]], a["host"] or "the run", a["check"])
            for a in would[:most]]
    return "actions=observe: would have %s%s" % (", ".join(said), ", and %d more" % (
        len(would) - most) if len(would) > most else "")


def drain_breaker(drain, hosts, fraction, held=(), seen=()):
    """The circuit breaker on drains: the hosts this run would drain, with those torchfleet
    drained within quarantine_h (`held`, the ledger's audit: ten runs draining one host each
    are ten drains), past breaker_limit of the group (the run's `hosts` and those the ledger
    saw in that time, `seen`) are a shared cause's (a rack's power, a driver roll-out): none
    of this run's is done. Returns (the drains to do, the breaker's sentence or "")."""
    key = ledger_store.canonical_host  # (held and seen are the ledger's keys)
    named = sorted({key(d["host"]) for d in drain})
    group = {key(h) for h in hosts} | set(seen) | set(held)
    if len(set(named) | set(held)) <= ledger.breaker_limit(len(group), fraction, whole=True):
        return drain, ""
    return [], ledger.breaker_words(named, len(group), fraction, "drained",
                                    len(set(held) - set(named)))
