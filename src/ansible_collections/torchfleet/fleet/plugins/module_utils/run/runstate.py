"""The run's contract and its one judge: phases, host states, outcomes, message kinds, the
failure record, and RunState, the record itself, owned by the master's store.

Every host's agent reports to the master (control.py carries the messages); the master's store
feeds them here and calls tick() for what time alone decides (a host gone silent, a hang, the
job's time limit, the controller's lease). Every failure is kept in `failures`; `failure` is
the judged first one, decided here and only here:

- a cause before a consequence: a rank that died of a lost peer (its log shows the connection
  to another rank closed or reset, rundir.peer_loss) is a consequence of another failure; a
  rank that exited by itself, a host that went silent, an agent that could not start are causes;
- among those, the earliest by when it happened on the master's clock: an exit's time is when
  the master heard it less the age the agent measured on its own clock (never a comparison of
  two hosts' clocks); a silent host's is its last heartbeat; a host whose agent's connection
  closed without an exit, the moment it closed.

The run fails (and every host is told to stop) at the first failure of any kind; reports that
arrive while the hosts stop can still name a cause that came first. The record is final once
every host is done or the master's settle time is over; nothing changes after that. A host of
the run unheard-from and not yet judged keeps the record open (agent.MasterStore.done) until it
reports or tick() judges it lost: a silent cause is never lost to its consequence.

record() is what every output reads: the master's store writes it to control.json on the
host; the controller's watch copies it to run_state.json; the summary (train.json /
collective.json), the Python API, the CLI and the HTML report read that copy:

    {"run_id", "phase", "started", "updated", "final", "nnodes", "nproc_per_node",
     "failure": null | FAILURE, "failures": [FAILURE, ...], "channel": {"refused": {...}},
     "events": [EVENT, ...], "stragglers": [STRAGGLER, ...],
     "actions": [ACTION, ...] (what the judge stopped the run for, or with actions=observe
                 would have: {"action": "stop", "host", "check", "at" (ISO 8601), "why",
                 "done"}),
     "straggle": {"watched", "signal": "durations" | "calls" | "", "collectives", "window_s",
                  "untimed": [host whose NCCL collectives are not timed, ...],
                  "blind": why hosts were not compared at the last judgement, or ""},
     "checkpoints": [CHECKPOINT, ...] (oldest first, the newest defaults.CHECKPOINTS_KEPT),
     "checkpoints_folded": the older ones summed, {"saves", "stall_s", "save_s", "first",
                           "last"} | null (_fold()),
     "checkpoint_watch": {"dir": checkpoint_dir ("" unset), "warnings": [sentence, ...] (<= 8),
                          "blind": the watch's last look could not read the directory},
     "timeline": {"running": every host's ranks running (the latest host's ranks_at),
                  "init_done": the first collective completed on every rank (the latest
                  rank's first collective), "failed": the first failure's own time (started +
                  its at_s), "stopped": every host's torchrun ended or judged lost (the latest
                  such moment; None while any host runs), "last_collective": the last moment
                  some rank's completed collectives advanced (a clean end's training ends
                  there: goodput's teardown follows)} (each None until known),
     "hosts": [{"host", "node_rank", "ranks": [first, last], "state", "rc", "alive",
                "progress_ts", "ranks_at", "ended", "last_line", "last_seen", "pid", "elapsed_s",
                "watch": {"kmsg", "kmsg_error", "gpu", "gpu_error", "watch_error", "dropped"},
                "events": count,
                "dropped": warnings the master did not keep, "fatal_more": fatal events past
                FATAL_PER_HOST or FATAL_PER_MESSAGE that could not change the judgement}]}
    FAILURE = {"host", "node_rank", "reason", "detail", "rc", "rank", "local_rank",
               "exitcode", "root_cause", "consequence", "last_line", "at_s", "detected_s",
               "collective", "waited", "event", and where they apply "stalled" (the rank that
               never joined), "late", "died" (a hardware cause's)}
    EVENT = {"host", "source", "kind", "code", "gpu", "pci_bus", "rank", "pid", "fatal",
             "what", "line", "at", "age_err_s" (it happened between at - age_err_s and at),
             "count" (how many times it was seen)}
    CHECKPOINT = {"path" (relative to checkpoint_dir), "began", "ended", "step" (from its name,
                  or None), "kind": "file" | "dcp" | "dir", "bytes", "files": the
                  completions grouped in it (per-rank shards of one save), "stall_s": how long
                  it stalled the ranks (stall_s()), "stall": stall_s > 0, and for a save cut
                  short (some ranks' shards only, at the run's end) "partial": true and "of":
                  the world's ranks}
    STRAGGLER = {"host", "ranks", "share_last", "late_ms_median", "late_ms_mean",
                 "interval_ms", "first_seen", "last_seen", "active"} (times on the master's
                 clock; active: named at the last judgement)

A host's hardware events (hwwatch.py) come in its heartbeats: a fatal one is a cause
(`hardware`), a fatal OOM kill (its victim one of the run's processes, whether or not the
agent could name the rank) too (`oom`); how they are ordered against the other failures is
_judged's, each with its own slack (slack()). Every fatal event is judged, whatever came
before it; warnings are kept up to their own bounds per host and per run, and the ones not
kept are counted (dropped()).

Stragglers are judged here too, from the ranks' sampled collectives (straggle.py): named in
the record while the run goes on; with straggler_action=restart a host that stays one for
straggler_window_s is a failure (`straggler`), which the restart answers like a lost host.

A hang is also decided from where the ranks are in their collectives (flight.py), when every
rank reports it: no rank's collective advanced for hang_timeout_s while some rank waits in
one, even if a rank keeps writing to its log. Every failure the record judges first carries
the finding of flight.finding() (`collective`): the collective where the ranks diverge, the
ranks that never joined it or called another; a rank that died waiting in a collective that
another rank never joined is a consequence of that.

Checkpoints are seen from outside (ckptwatch.py, in the master's agent, dated on this clock);
whether each was a stall is judged here from when the ranks' collectives advanced (the
timeline and the checkpoints are what goodput is computed from: reports/goodput.py).

Only the standard library, defaults.py, exits.py, flight.py and straggle.py: it runs inside the agent on every host, and in
the watch's look.
"""
from __future__ import annotations

import bisect
import heapq
import math
import re
import time

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import exits, flight, straggle

# The controller's copy of the master's record (the host's files: rundir.py).
STATE_FILE = "run_state.json"

# phase: the run as a whole. RUNNING until the first failure or until every host exited 0;
# a failure's reason is also the phase it ends the run in.
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"            # a host's torchrun exited non-zero (a rank failed)
NOT_STARTED = "not_started"  # a host's agent could not start torchrun, or never reached the master
LOST = "lost"                # a host stopped answering (host.lost)
HANG = "hung"                # no rank anywhere made progress for hang_timeout_s
TIMEOUT = "timeout"          # the run outlived job_timeout_s
CONTROLLER_LOST = "controller_lost"  # the controller stopped watching (lease ran out)
STOPPED_BY_USER = "stopped_by_user"  # Ctrl-C, SIGTERM or SIGHUP to the controller, stop.yml
HARDWARE = "hardware"        # a fatal hardware event on a host (run.hardware)
OOM = "oom"                  # the kernel's OOM killer ended a rank (run.oom)
STRAGGLER = "straggler"      # a host stayed a straggler (run.straggler, straggler_action=restart)
HW_REASONS = (HARDWARE, OOM)
# What torchfleet itself stops a run for (not a rank's own death, a lost host, the controller
# or the user): with actions=observe it is judged and recorded as an action not done
# ("would have stopped"), and the run goes on.
OWN_STOPS = (HARDWARE, OOM, HANG, STRAGGLER)
OBSERVE = "observe"
ACTIONS = ("stop", "drain", "quarantine", "exclude", "restart", "release", "undrain")
RUN_WIDE = (HANG, TIMEOUT, CONTROLLER_LOST, STOPPED_BY_USER)  # failures of the run, not a host's

# host state
PENDING = "pending"      # not heard from yet
STARTED = "running"      # its torchrun runs
EXITED = "exited"        # its torchrun ended by itself (rc says how)
STOPPED = "stopped"      # its agent stopped torchrun after the run failed elsewhere
HOST_LOST = "lost"       # silent for lost_after_s, or its agent's connection closed for good
UNKNOWN = "unknown"      # not in the record: the master was lost before it could be read
DONE = (EXITED, STOPPED, HOST_LOST)

# outcome: how the run ended for one host (run.exit, the tables, the API).
ABORTED = "aborted"      # stopped, or its ranks died, because the run failed elsewhere
OUTCOMES = (SUCCEEDED, FAILED, HANG, LOST, TIMEOUT, ABORTED, RUNNING, UNKNOWN)
# The outcome of a host whose own failure is the given reason.
_OWN_OUTCOME = {FAILED: FAILED, NOT_STARTED: FAILED, LOST: LOST, HARDWARE: FAILED, OOM: FAILED,
                STRAGGLER: FAILED}
# How a run that ended in a phase ended, in the same words (the watch's `outcome`).
PHASE_OUTCOME = {SUCCEEDED: SUCCEEDED, FAILED: FAILED, NOT_STARTED: FAILED, HANG: HANG,
                 LOST: LOST, TIMEOUT: TIMEOUT, CONTROLLER_LOST: ABORTED, STOPPED_BY_USER: ABORTED,
                 HARDWARE: FAILED, OOM: FAILED, STRAGGLER: FAILED}

# Message kinds on the control channel.
HELLO, BEAT, EXIT, NOT_STARTED_MSG = "hello", "beat", "exit", "not_started"  # agent -> master
PONG = "pong"  # agent -> master: the answer to a ping (an ACK's, for the host's clock offset)
# agent -> master: a rank ended with a failure (its exit status, read before torchrun reaped
# it) while its torchrun runs on: its EXIT follows and completes the failure this made
DIED = "died"
ACK, ABORT = "ack", "abort"                                                  # master -> agent

LINE_MAX = 300
DETAIL_MAX = 1000
# A host's hardware events (hwwatch.py): what the record keeps of them.
EVENT_SOURCES = ("kmsg", "nvml", "sysfs")
EVENT_KINDS = ("xid", "aer", "amdgpu", "mlx5", "oom", "ecc", "remap", "clocks", "recovery",
               "link", "nvml", "nvswitch")
# Warnings: taken per message, kept per host and per run; more are counted (dropped()). Fatal
# events are never held back by warnings: every one in a message is taken (the channel's
# MAX_LINE bounds how many), judged, and kept up to FATAL_PER_HOST distinct ones a host (its
# GPUs, the bridges above them, its HCAs; a repeat is a count, not a second event).
EVENTS_PER_MESSAGE, EVENTS_PER_HOST, EVENTS_MAX = 8, 64, 512
FATAL_PER_HOST = 32
# Fatal events taken from one message, its earliest: a host's first cause is among them, and
# a broken or hostile agent's thousands cannot stall the master's loop (each one past
# FATAL_PER_HOST is weighed against every kept event); the rest are counted in fatal_more.
FATAL_PER_MESSAGE = 64
AGE_MAX_S = 3600.0
AGE_ERR_MAX_S = 600.0  # the widest sampling uncertainty believed (hwwatch's own bound)
COUNT_MAX = 1 << 31
# Goodput's inputs: the checkpoints' bounds (the record keeps defaults.CHECKPOINTS_KEPT) and
# the moments collectives advanced the master keeps to judge their stalls.
CKPT_KINDS = ("file", "dcp", "dir")
CKPT_PATH_MAX, CKPT_WARNINGS_MAX, DIR_MAX = 200, 8, 1000
ADVANCES_KEPT = 2048
# A gap between two moments collectives advanced longer than this is a stall inside a save (the
# ranks' watchers write each second and beats come each second: a shorter one says nothing).
STALL_GAP_S = 2 * defaults.BEAT_S
SAME_SAVE_S = defaults.CHECKPOINT_SAME_SAVE_S  # (goodput groups its saves alike)
_PCI = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")  # (a VMD: 10000:)


def _text(value, limit):
    return value[-limit:] if isinstance(value, str) else ""


def _number(value, default=None):
    """A finite number, else default: json.loads takes NaN and Infinity from a host's bytes, and
    either would poison every sum and comparison of times downstream (goodput, leases)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    return value if math.isfinite(value) else default


def _int(value):
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _bounded(value, low, high, default):
    return min(high, max(low, _number(value, default)))


def _event(e):
    """One event checked and bounded, or None."""
    if not isinstance(e, dict) or e.get("source") not in EVENT_SOURCES \
            or e.get("kind") not in EVENT_KINDS:
        return None
    code = e.get("code")
    bus = e.get("pci_bus")
    return {
        "source": e["source"], "kind": e["kind"],
        "code": code if _int(code) is not None else _text(code, 32) or None,
        "gpu": _int(e.get("gpu")), "rank": _int(e.get("rank")), "pid": _int(e.get("pid")),
        "pci_bus": bus if isinstance(bus, str) and _PCI.match(bus) else None,
        "fatal": e.get("fatal") is True, "what": _text(e.get("what"), 160),
        "line": _text(e.get("line"), LINE_MAX),
        "age_s": _bounded(e.get("age_s"), 0.0, AGE_MAX_S, 0.0),
        "age_err_s": _bounded(e.get("age_err_s"), 0.0, AGE_ERR_MAX_S, 0.0),
        "count": int(_bounded(_int(e.get("count")), 1, COUNT_MAX, 1))}


def checked_events(value):
    """A message's hardware events (hwwatch.py) checked and bounded, how many well-formed
    warnings past EVENTS_PER_MESSAGE it carried and how many fatal events past
    FATAL_PER_MESSAGE (counted, not kept). The fatal events taken are the earliest (the
    largest age_s + age_err_s), wherever they are in the list. The host's name, the rank's
    range and the time are the master's to add."""
    out, dropped, warnings, fatal = [], 0, 0, []
    for e in value if isinstance(value, list) else []:
        e = _event(e)
        if e is None:
            continue
        if e["fatal"]:
            fatal.append(e)
        else:
            warnings += 1
            if warnings > EVENTS_PER_MESSAGE:
                dropped += 1
                continue
        out.append(e)
    more = max(0, len(fatal) - FATAL_PER_MESSAGE)
    if more:  # in the message's order still
        keep = {id(e) for e in heapq.nsmallest(FATAL_PER_MESSAGE, fatal, key=lambda e: -(
            e["age_s"] + e["age_err_s"]))}
        out = [e for e in out if not e["fatal"] or id(e) in keep]
    return out, dropped, more


def events(value):
    """A message's hardware events checked and bounded (checked_events without its counts)."""
    return checked_events(value)[0]


def event_key(e):
    """The same fault, whichever source saw it: a repeat of a kept event is a count."""
    return (e.get("host"), e.get("kind"), e.get("code"), e.get("pci_bus"), e.get("pid"),
            e.get("gpu"))


def slack(failure):
    """How much sooner than its date a hardware cause may have happened: HW_SLACK_S (a rank
    that died of it may be seen before its line is read) and its event's own dating
    uncertainty (age_err_s: a sampled source's interval). The one measure of _judged, fail()'s
    "late" and _explain."""
    e = failure.get("event") if isinstance(failure, dict) else None
    err = _number(e.get("age_err_s"), 0.0) if isinstance(e, dict) else 0.0
    return defaults.HW_SLACK_S + min(AGE_ERR_MAX_S, max(0.0, err))


def dropped(record):
    """{host: how many of its hardware warnings the record does not hold}: those its agent did
    not send (its watch's "dropped") and those the master did not keep. Hosts with none left
    out; what every output says as "and N more warnings"."""
    out = {}
    for h in record.get("hosts") if isinstance(record, dict) and isinstance(
            record.get("hosts"), list) else []:
        if not isinstance(h, dict) or not isinstance(h.get("host"), str):
            continue
        watch = h.get("watch") if isinstance(h.get("watch"), dict) else {}
        n = max(0, _int(watch.get("dropped")) or 0) + max(0, _int(h.get("dropped")) or 0)
        if n:
            out[h["host"]] = n
    return out


def more_warnings(n):
    """"and 212 more warnings" ('' for none)."""
    return "and %d more warning%s" % (n, "" if n == 1 else "s") if n else ""


def drains(event):
    """Whether a host's event is a hardware cause (run.hardware, train.json's drain): a fatal
    event other than the OOM killer's, which is the workload's memory (run.oom). An OOM kill
    is fatal when its victim was the run's (a rank, a process of a rank's tree or cgroup),
    whether or not the agent could name the rank; else a warning."""
    return event.get("fatal") is True and event.get("kind") != "oom"


def watch_status(value):
    """A host's hardware watch as its agent says it (hwwatch.HostWatch.status), bounded."""
    value = value if isinstance(value, dict) else {}
    return {"kmsg": _text(value.get("kmsg"), 200) or None,
            "kmsg_error": _text(value.get("kmsg_error"), 400) or None,
            "gpu": _text(value.get("gpu"), 20) or None,
            "gpu_error": _text(value.get("gpu_error"), 400) or None,
            "watch_error": _text(value.get("watch_error"), 400) or None,
            "dropped": min(COUNT_MAX, max(0, _int(value.get("dropped")) or 0))}


def message(body):
    """An agent's verified message with its fields checked and bounded, or None. A signed
    message still comes from another host: nothing in it may break the master's loop."""
    kind = body.get("t")
    hw, hw_dropped, hw_fatal_more = checked_events(body.get("hw")) if kind in (BEAT, EXIT) \
        else ([], 0, 0)
    if kind == BEAT:
        return {"t": BEAT, "alive": max(0, _int(body.get("alive")) or 0),
                "idle_s": _number(body.get("idle_s")), "pid": _int(body.get("pid")),
                "last_line": _text(body.get("last_line"), LINE_MAX), "coll": body.get("coll"),
                "steady": body.get("steady"), "first": body.get("first"), "hw": hw,
                "hw_dropped": hw_dropped, "hw_fatal_more": hw_fatal_more,
                "watch": watch_status(body.get("watch")) if "watch" in body else None,
                "fr": body.get("fr"), "fr_untimed": body.get("fr_untimed") is True,
                # (at most two beats: ranks_at is also the hang judge's floor of silence)
                "up_s": _bounded(body.get("up_s"), 0.0, 2 * defaults.BEAT_S, 0.0)}
    if kind == PONG:
        return {"t": PONG, "echo": _number(body.get("echo")), "at": _number(body.get("at"))}
    if kind in (EXIT, DIED):
        cause = body.get("root_cause")
        if isinstance(cause, dict) and all(_int(cause.get(k)) is not None
                                           for k in ("rank", "local_rank")):
            # exitcode None: the rank died while its torchrun was stopped before saying how;
            # script_code and at_exit: its own exit note (exits.py).
            cause = {"rank": cause["rank"], "local_rank": cause["local_rank"],
                     "exitcode": _int(cause.get("exitcode")),
                     "script_code": _int(cause.get("script_code")),
                     "at_exit": cause.get("at_exit") is True}
        else:
            cause = None
    if kind == DIED:  # (only a failing status read is a death told early)
        return None if cause is None or not cause["exitcode"] else {
            "t": DIED, "root_cause": cause, "consequence": body.get("consequence") is True,
            "age_s": max(0.0, _number(body.get("age_s"), 0.0))}
    if kind == EXIT:
        return {"t": EXIT, "rc": _int(body.get("rc")), "stopped": body.get("stopped") is True,
                "consequence": body.get("consequence") is True, "root_cause": cause,
                "age_s": max(0.0, _number(body.get("age_s"), 0.0)),
                "ended_s": _bounded(body.get("ended_s"), 0.0, AGE_MAX_S, 0.0),
                "last_line": _text(body.get("last_line"), LINE_MAX), "coll": body.get("coll"),
                "steady": body.get("steady"), "first": body.get("first"), "hw": hw,
                "hw_dropped": hw_dropped,
                "hw_fatal_more": hw_fatal_more,
                "watch": watch_status(body.get("watch")) if "watch" in body else None}
    if kind == NOT_STARTED_MSG:
        return {"t": NOT_STARTED_MSG, "detail": _text(body.get("detail"), DETAIL_MAX)}
    if kind == HELLO:
        return {"t": HELLO}
    return None


def host_outcome(phase, failures, host_record):
    """How the run ended for one host: one of OUTCOMES."""
    if host_record["state"] == EXITED and host_record["rc"] == 0:
        return SUCCEEDED
    if host_record["state"] == UNKNOWN:
        return UNKNOWN
    own = [f for f in failures or () if f["host"] == host_record["host"]
           and not f.get("consequence")]
    if own:
        return _OWN_OUTCOME.get(own[0]["reason"], FAILED)
    if phase in (HANG, TIMEOUT, RUNNING):
        return phase
    return ABORTED


def host_rows(hosts, record):
    """Each host of the run in rank order with its outcome; a host the record does not know
    (the master was lost before its record could be read) is UNKNOWN, not guessed."""
    known = {h["host"]: h for h in record.get("hosts") or []}
    nproc = record.get("nproc_per_node") or 0
    rows = []
    for node_rank, host in enumerate(hosts):
        rec = known.get(host) or {
            "host": host, "node_rank": node_rank, "state": UNKNOWN, "rc": None,
            "ranks": [node_rank * nproc, node_rank * nproc + nproc - 1], "elapsed_s": None}
        rows.append(dict(rec, outcome=host_outcome(record.get("phase"),
                                                   record.get("failures"), rec)))
    return rows


def collective_words(failure):
    """What the recording adds to a failure's words: the collective and the ranks it names,
    else where the other ranks were; '' for a hang (its detail says it) or without one."""
    found = failure.get("collective") if failure else None
    if not found or failure.get("reason") == HANG:
        return ""
    # (Every rank in a collective that never completed is a hang's finding, not a failed rank's.)
    return (flight.text(found) if flight.culprits(found) else "") or found.get("others") or ""


def _clock(at):
    return time.strftime("%H:%M:%S", time.localtime(at))


ACTIONS_MAX = 1024  # a record's audit read back: at most this many entries


def checked_actions(value):
    """A record's `actions` as read back from the master's file (another host's bytes): the
    well-formed entries, each field bounded, at most ACTIONS_MAX; never raises."""
    out = []
    for a in value if isinstance(value, list) else []:
        if len(out) >= ACTIONS_MAX:
            break
        if not isinstance(a, dict) or a.get("action") not in ACTIONS \
                or not isinstance(a.get("done"), bool):
            continue
        host = a.get("host")
        out.append({"action": a["action"],
                    "host": _text(host, LINE_MAX) if isinstance(host, str) else None,
                    "check": _text(a.get("check"), 64), "at": _text(a.get("at"), 32),
                    "why": _text(a.get("why"), DETAIL_MAX), "done": a["done"]})
    return out


def action(what, host, check, at, why, done):
    """One entry of the audit of what torchfleet did, or would have, on its own (train.json's
    `actions`, the ledger's): at in epoch seconds, written ISO 8601 UTC."""
    return {"action": what, "host": host, "check": check,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)),
            "why": _text(why, DETAIL_MAX), "done": bool(done)}


def hardware_words(failure):
    """A hardware or OOM cause in words: the host, the device, the event and when (on the
    master's clock), the rank that died of it where one did, and what follows from it."""
    e = failure.get("event") or {}
    host, rank = failure.get("host") or "a host", failure.get("rank")
    when = _clock(e["at"]) if _number(e.get("at")) is not None else "an unknown time"
    if failure.get("reason") == OOM:
        return "%s %s was %s at %s" % (host, oom_victim(rank, e.get("pid")),
                                       e.get("what") or "killed by the OOM killer", when)
    device = ("GPU %d (%s)" % (e["gpu"], e.get("pci_bus") or "PCI unknown")
              if e.get("gpu") is not None else e.get("pci_bus") or "")
    died = rank if rank is not None else failure.get("died")
    return "%s%s: %s, at %s%s; every other failure follows from it; drain %s" % (
        host, " " + device if device else "", e.get("what") or e.get("line") or "a fatal event",
        when, "; rank %d stopped there" % died if died is not None else "", host)


def oom_victim(rank, pid):
    """An OOM kill's victim in words: its rank, else a process of the run (a DataLoader worker,
    a rank in a container's own PID namespace: the agent tied it to the run, not to a rank)."""
    if rank is not None:
        return "rank %d" % rank
    return "a process of the run%s" % (" (pid %d)" % pid if _int(pid) is not None else "")


def evidence(event, rank=None, died=None):
    """A hardware or OOM cause's evidence as (label, words) rows, what a person reads first:
    the event's own line, the device (GPU index, PCI address) or the process, the rank it hit
    (`rank`: the failure's; else the rank that died of it, `died`), where and when it was
    seen. The abort that followed (its ranks' SIGTERM tracebacks) is a consequence, not here."""
    e = event if isinstance(event, dict) else {}
    gpu, bus = _int(e.get("gpu")), _text(e.get("pci_bus"), 16) or None
    rank = _int(rank) if _int(rank) is not None else _int(e.get("rank"))
    if e.get("kind") == "oom":
        device = ("process", oom_victim(rank, e.get("pid")))
    else:
        device = ("device", "GPU %d, PCI %s" % (gpu, bus or "address unknown") if gpu is not None
                  else "PCI %s (GPU index unknown)" % bus if bus else "none named")
    if rank is not None:
        hit = "rank %d" % rank
    elif _int(died) is not None:
        hit = "none named by the event; rank %d stopped there" % died
    else:
        hit = "none named by the event, and no rank died of it before the run stopped"
    at, err, count = _number(e.get("at")), _number(e.get("age_err_s"), 0.0), _int(e.get("count"))
    seen = "%s, at %s%s%s" % (
        _text(e.get("source"), 16) or "a source unknown",
        _clock(at) if at is not None else "an unknown time",
        " (up to %.0f s before: its source is sampled)" % err if err >= 0.5 else "",
        ", %d times" % count if count is not None and count > 1 else "")
    return [("line", _text(e.get("line"), LINE_MAX) or _text(e.get("what"), 160) or "-"),
            device, ("rank", hit), ("seen", seen)]


def failure_text(failure):
    """The first failure in words, for people: the host (or the run), the rank when one is
    known, and what happened. Never a None or a '?'."""
    if not failure:
        return ""
    if failure.get("reason") in HW_REASONS:
        return hardware_words(failure)
    if failure.get("stalled"):
        return "%s, %s" % (failure.get("host"), failure.get("detail"))
    who = failure.get("host") or "the run as a whole"
    extra = collective_words(failure)
    extra = "; " + extra if extra else ""
    if failure.get("rank") is not None:
        cause = failure.get("root_cause") or {}
        what = exits.words(failure["rank"], failure["exitcode"], cause.get("script_code"),
                           cause.get("at_exit"))
        if failure.get("consequence"):
            what += " (%s)" % ("it waited in a collective another rank did not join"
                               if failure.get("waited") else
                               "its connection to another rank broke")
        return "%s, %s%s" % (who, what, extra)
    return "%s: %s%s" % (who, failure.get("detail") or failure.get("reason"), extra)


def controller_record(run_id, hosts, nproc_per_node, failure):
    """The record when the master's store kept none the controller could read (its start
    failed, or the master could not be reached): the same shape, decided by this module."""
    state = RunState(run_id, hosts, nproc_per_node)
    host = failure.get("host")
    state.fail(host if host in state.hosts else None, failure["reason"], state.started,
               failure.get("detail") or "")
    state.final = True
    return state.record()


def master_lost(record, master, detail):
    """The record when the master's agent died while it kept it (killed, OOM-killed, a crash
    or a full disk while writing it): the master is lost as of its record's last update, the
    failures it had kept stay, and the first is judged again here."""
    state = RunState(record["run_id"], [h["host"] for h in record["hosts"]],
                     record["nproc_per_node"], now=record["started"])
    state.hosts = {h["host"]: dict(h) for h in record["hosts"]}
    state.failures = [dict(f) for f in record.get("failures") or []]
    state.events = [dict(e) for e in record.get("events") or [] if isinstance(e, dict)]
    state.failure = min(state.failures, key=_judged) if state.failures else None
    state.phase, state.refused = record["phase"], dict((record.get("channel") or {}).get(
        "refused") or {})
    state.checkpoints = [dict(c) for c in record.get("checkpoints") or [] if isinstance(c, dict)]
    watch = record.get("checkpoint_watch") or {}
    state.checkpoint_watch = {"dir": _text(watch.get("dir"), DIR_MAX),
                              "warnings": list(watch.get("warnings") or []),
                              "blind": watch.get("blind") is True}
    state.init_done = _number((record.get("timeline") or {}).get("init_done"))
    last = _number((record.get("timeline") or {}).get("last_collective"))
    state.advances = [] if last is None else [last]
    folded = record.get("checkpoints_folded")
    state.folded = dict(folded) if isinstance(folded, dict) else None
    at = record.get("updated") or record["started"]
    if master in state.hosts and state.hosts[master]["state"] not in DONE:
        state.hosts[master]["state"], state.hosts[master]["ended"] = HOST_LOST, at
        state.fail(master, LOST, at, detail, at=at)
    state.final = True
    out = state.record()
    out.update(stragglers=record.get("stragglers") or [], straggle=record.get("straggle"))
    return out


def _judged(f):
    """The order of the judge: a cause before a consequence (a hardware event after the first
    failure is neither: late), then the earliest, a hardware event first by its slack (the
    rank that died of it may be seen before its line is read, and a sampled source dates it
    only to its interval: slack()), then the lowest node rank (the run as a whole first).
    A hang is no exception: it is dated when it was declared, and an event dated after that
    (beyond its slack) is late, not the hang's cause; one dated before it, however long before
    the ranks' last progress, may be (with several process groups the ranks outside the dead
    GPU's groups go on advancing after it died, so their progress says nothing against it)."""
    hardware = f["reason"] in HW_REASONS and not f.get("late")
    return (f["consequence"] or bool(f.get("late")), f["at_s"] - (slack(f) if hardware else 0.0),
            -1 if f["node_rank"] is None else f["node_rank"])


def check_of(failure):
    """The check id a failure of the judge's is reported under (decide(): run.exit, host.lost,
    run.hang, run.hardware, run.oom, run.straggler, run.<reason> of a run-wide one)."""
    reason = failure.get("reason")
    if reason == LOST:
        return "host.lost"
    if reason == HANG:
        return "run.hang"
    if reason in HW_REASONS or reason == STRAGGLER:
        return "run." + reason
    if failure.get("host") is None and reason in RUN_WIDE:
        return "run." + reason
    return "run.exit"


class RunState:
    def __init__(self, run_id, hosts, nproc_per_node, *, now=None,
                 join_timeout_s=defaults.JOIN_BASE_S,
                 lost_after_s=defaults.default("lost_after_s"),
                 hang_timeout_s=defaults.default("hang_timeout_s"),
                 job_timeout_s=defaults.default("job_timeout_s"),
                 straggler_window_s=defaults.default("straggler_window_s"),
                 straggler_threshold=defaults.default("straggler_threshold"),
                 straggler_action=defaults.default("straggler_action"), recording=True,
                 checkpoint_dir="", actions=defaults.default("actions")):
        self.run_id, self.nproc = run_id, int(nproc_per_node)
        self.started = time.time() if now is None else now
        self.updated = self.started
        self.join_timeout_s, self.lost_after_s = float(join_timeout_s), float(lost_after_s)
        self.hang_timeout_s, self.job_timeout_s = float(hang_timeout_s), float(job_timeout_s)
        self.phase, self.failure, self.failures, self.final = RUNNING, None, [], False
        self.refused = {}
        self.order = list(hosts)
        self.hosts = {h: {"host": h, "node_rank": i,
                          "ranks": [i * self.nproc, i * self.nproc + self.nproc - 1],
                          "state": PENDING, "rc": None, "alive": 0, "progress_ts": None,
                          "ranks_at": None, "ended": None,
                          "last_line": "", "last_seen": None, "pid": None, "elapsed_s": None,
                          "coll": {}, "coll_ts": None, "coll_since": {}, "watch": None,
                          "events": 0, "dropped": 0, "fatal_more": 0}
                      for i, h in enumerate(self.order)}
        self.closed_at = {}  # host -> when its connection closed without an exit
        self.died = {}       # host -> the failure its DIED made, which its EXIT completes
        self.events = []     # every host's hardware events (hwwatch.py), dated on this clock
        self._kept = {}      # event_key -> the kept event (a repeat is its count)
        self._held = {}      # host -> [warnings, fatal events] kept
        self._warned = 0     # warnings kept in all
        # Stragglers (straggle.py), from the ranks' Flight Recorders: named, and with
        # straggler_action=restart, failed here once one stays for its window.
        self.straggle = straggle.Judge({h: tuple(r["ranks"]) for h, r in self.hosts.items()},
                                       straggler_window_s, straggler_threshold, recording)
        self.straggler_action = straggler_action
        # actions=observe: the run's own stops judged, recorded, not done (OWN_STOPS); each
        # (host, reason) once, its failure kept to explain a later one of the run's own.
        self.observe = actions == OBSERVE
        self.actions = []    # the audit: what torchfleet stopped the run for, or would have
        self.observed = {}   # (host, reason) -> the failure observed, not done
        # Goodput's timeline: each rank's first collective (rank -> when, this clock), the
        # moment every rank had one; the moments some rank's completed collectives advanced
        # (sorted, one per ADVANCE_GAP_S, the newest ADVANCES_KEPT); the checkpoints seen.
        self.firsts, self.init_done, self.advances = {}, None, []
        self.checkpoints = []
        self.folded = None  # the saves older than CHECKPOINTS_KEPT, summed (fold())
        self.checkpoint_watch = {"dir": _text(checkpoint_dir, DIR_MAX), "warnings": [],
                                 "blind": False}

    # -- what the agents report -------------------------------------------------------------

    def report(self, host, now, body):
        """One agent's message (control.py verified it, message() checks its fields); returns
        the failure it made the run's first, if it did."""
        msg = message(body) if isinstance(body, dict) else None
        if msg is None or host not in self.hosts:
            return None
        made = None
        if msg["t"] in (BEAT, EXIT):
            self.positions_of(host, now, msg["coll"], msg["steady"], msg["first"])
            if msg["watch"] is not None and self.hosts[host]["state"] not in DONE:
                self.hosts[host]["watch"] = msg["watch"]
            made = self.hardware(host, now, msg["hw"], msg["hw_dropped"], msg["hw_fatal_more"])
        if msg["t"] == BEAT and msg["fr_untimed"]:
            self.straggle.not_timed(host)
        if msg["t"] == BEAT and msg["fr"] and self.phase == RUNNING:
            self.straggle.add(host, now, straggle.clean(
                msg["fr"], range(self.hosts[host]["ranks"][0], self.hosts[host]["ranks"][1] + 1)))
        if msg["t"] == PONG:
            self.straggle.offsets.pong(host, msg["echo"], msg["at"], now)
            return None
        if msg["t"] == BEAT:
            return self.beat(host, now, msg["alive"], msg["idle_s"], msg["last_line"],
                             msg["pid"], msg["up_s"]) or made
        if msg["t"] == EXIT:
            return self.exited(host, now, msg["rc"], stopped=msg["stopped"],
                               root_cause=msg["root_cause"], last_line=msg["last_line"],
                               consequence=msg["consequence"], age_s=msg["age_s"],
                               ended_s=msg["ended_s"]) or made
        if msg["t"] == DIED:
            return self.rank_died(host, now, msg["root_cause"], msg["consequence"], msg["age_s"])
        if msg["t"] == NOT_STARTED_MSG:
            return self.not_started(host, now, msg["detail"])
        self.closed_at.pop(host, None)  # hello: the host is (back) on the channel
        return None

    def positions_of(self, host, now, coll, steady=None, first=None):
        """Where a host's ranks are in their collectives (checked: only its own ranks); the
        time any of them advanced, on the master's clock; since when each position held still
        (a dead rank's: long ago if it held still STEADY_S before it died, else never); when
        each rank's first collective was called (first: {rank: age_s}, on its host's clock)
        and when a rank's completed collectives advanced (stall())."""
        rec = self.hosts.get(host)
        if rec is None or rec["state"] in DONE:
            return
        first_rank, last = rec["ranks"]
        self._firsts(now, first, range(first_rank, last + 1))
        coll = flight.clean(coll, range(first_rank, last + 1)) if coll else {}
        if not coll:
            return
        for rank, (steady_s, alive) in flight.clean_steady(steady, range(first_rank,
                                                                         last + 1)).items():
            rec["coll_since"][rank] = now - steady_s if alive else (
                self.started - 1e6 if steady_s >= flight.STEADY_S else None)
        for rank, groups in coll.items():
            before = rec["coll"].get(rank) or {}
            if any(v[1] > (before.get(g) or [0, 0])[1] for g, v in groups.items()):
                since = rec["coll_since"].get(rank)
                self._advanced(since if since is not None and since > self.started else now)
        seqs = {r: {g: v[0] for g, v in groups.items()} for r, groups in coll.items()}
        if seqs != {r: {g: v[0] for g, v in groups.items()}
                    for r, groups in rec["coll"].items()} or rec["coll_ts"] is None:
            rec["coll_ts"] = now
        rec["coll"] = dict(rec["coll"], **coll)

    def positions(self):
        """{rank: (host, groups)} of every rank that reported where it is."""
        return {int(r): (rec["host"], groups) for rec in self.hosts.values()
                for r, groups in rec["coll"].items()}

    def finding(self, now, failed_rank=None):
        moving = {int(r) for rec in self.hosts.values() for r in rec["coll"]
                  if rec["coll_since"].get(r) is None
                  or now - rec["coll_since"][r] < flight.STEADY_S}
        return flight.finding(self.positions(), len(self.order) * self.nproc, failed_rank,
                              moving)

    def last_advance(self):
        """When any rank's collective last advanced (0: none reported)."""
        return max(rec["coll_ts"] or 0 for rec in self.hosts.values())

    def collectives_stalled(self, now):
        """Every rank reports its collectives, some rank waits in one, and none advanced for
        hang_timeout_s: a hang, whatever the logs say."""
        last = self.last_advance()
        if not last or now - last <= self.hang_timeout_s:
            return False  # (checked first: this runs at every tick)
        pos = self.positions()
        if len(pos) < len(self.order) * self.nproc:
            return False
        return any(v[0] > v[1] for _h, groups in pos.values() for v in groups.values())

    def beat(self, host, now, alive=0, idle_s=None, last_line="", pid=None, up_s=0.0):
        """A live agent's report: its torchrun runs with `alive` ranks, whose newest log write
        is idle_s old on that host's own clock; every one of its ranks was running up_s ago
        (its agent saw the last one start: goodput's launch ends there, not at the beat)."""
        rec = self.hosts.get(host)
        if rec is None or rec["state"] in DONE:
            return None
        self.closed_at.pop(host, None)
        rec.update(state=STARTED, alive=int(alive), last_seen=now, pid=pid,
                   elapsed_s=round(now - self.started, 3))
        if int(alive) and rec.get("ranks_at") is None:
            # The first report of its ranks alive, dated when its agent saw them all start.
            rec["ranks_at"] = round(max(self.started, now - up_s), 3)
        if idle_s is not None:
            rec["progress_ts"] = max(now - idle_s, rec["progress_ts"] or 0)
        if last_line:
            rec["last_line"] = last_line[-LINE_MAX:]
        self.updated = now
        return None

    def exited(self, host, now, rc, stopped=False, root_cause=None, last_line="",
               consequence=False, age_s=0.0, ended_s=0.0):
        """A host's torchrun ended (ended_s ago, on its host's clock): rc 0, a failure, or
        stopped by its agent after the run failed elsewhere. Returns the failure it made the
        run's first, if it did."""
        rec = self.hosts.get(host)
        if rec is None or rec["state"] in DONE:
            return None
        self.closed_at.pop(host, None)
        rec.update(state=STOPPED if stopped else EXITED, rc=rc, alive=0, last_seen=now,
                   elapsed_s=round(now - self.started, 3),
                   ended=round(max(self.started, now - ended_s), 3))
        if last_line:
            rec["last_line"] = last_line[-LINE_MAX:]
        self.updated = now
        if rc != 0 and host in self.died:  # (stopped too: its agent stops it once told)
            self._completed(self.died[host], rc, root_cause)
            return None
        if stopped:
            return None
        if rc != 0 and self._died_of_the_stop(root_cause, now - age_s, now):
            rec["state"] = STOPPED
            return None
        if rc != 0:
            cause = root_cause or {}
            detail = (exits.words(cause["rank"], cause["exitcode"], cause.get("script_code"),
                                  cause.get("at_exit")) if cause
                      else "torchrun exited with %s" % rc)
            return self.fail(host, FAILED, now, detail, rc=rc, root_cause=root_cause,
                             consequence=consequence, at=now - age_s)
        if self.phase == RUNNING and all(r["state"] == EXITED and r["rc"] == 0
                                         for r in self.hosts.values()):
            self.phase = SUCCEEDED
        return None

    def rank_died(self, host, now, root_cause, consequence=False, age_s=0.0):
        """A rank of a running host ended with a failure (the exit status the kernel holds
        until torchrun reaps it, read by its agent) while its torchrun runs on: the run fails
        now, not once that torchrun has seen it and torn down (a second or more on a busy
        host). One a host; its EXIT completes it
        (_completed). Returns the failure it made the run's first, if it did."""
        rec = self.hosts.get(host)
        if rec is None or rec["state"] in DONE or host in self.died:
            return None
        if self._died_of_the_stop(root_cause, now - age_s, now):
            return None
        kept = len(self.failures)
        made = self.fail(host, FAILED, now, exits.words(
            root_cause["rank"], root_cause["exitcode"], root_cause["script_code"],
            root_cause["at_exit"]), root_cause=root_cause, consequence=consequence,
            at=now - age_s)
        if len(self.failures) > kept:
            self.died[host] = self.failures[kept]
        return made

    def _died_of_the_stop(self, root_cause, at, now):
        """Whether a rank that ended at `at` died of the run's stop: after the run's fate was
        decided and its stop sent, waiting in the collective a stopped rank never joined (a
        hang's rank killed, its peers' collectives fail), as a stopped host's EXIT says. Its
        agent, which stops its host at once on a rank's failure, can tell it before it hears
        the abort: it would name the hang's rank again as a failure of its own."""
        rank = (root_cause or {}).get("rank")
        return self.failure is not None and rank is not None \
            and at > self.started + self.failure["detected_s"] \
            and self._waited(rank, self.finding(now, rank))

    def _completed(self, entry, rc, root_cause):
        """The EXIT of a host whose rank's death made `entry` (rank_died): torchrun's rc, and
        its own words of that rank's end (the exit code it saw) where the death could not say
        them; a rank it names otherwise leaves the entry as it was."""
        entry["rc"] = rc
        known = entry["root_cause"] or {}
        if not root_cause or root_cause["rank"] != entry["rank"] or \
                known.get("exitcode") is not None:
            return
        cause = dict(root_cause, script_code=known.get("script_code", root_cause["script_code"]),
                     at_exit=known.get("at_exit", False) or root_cause["at_exit"])
        entry.update(root_cause=cause, exitcode=cause["exitcode"], detail=exits.words(
            cause["rank"], cause["exitcode"], cause["script_code"],
            cause["at_exit"])[-DETAIL_MAX:])

    def hardware(self, host, now, found, dropped=0, fatal_more=0):
        """A host's hardware events (checked_events()): each dated on this clock from the age
        the host measured; a repeat of a kept event (event_key, whichever source saw it)
        updates its count. A fatal one is a cause, judged whatever came before it (_cause);
        warnings are kept up to EVENTS_PER_HOST a host and EVENTS_MAX a run, the rest counted
        in the host's "dropped" with the `dropped` its message could not carry. Returns the
        failure it made the run's first, if it did. After the record is final nothing
        changes."""
        rec = self.hosts.get(host)
        if rec is None or self.final:
            return None
        rec["dropped"] = min(COUNT_MAX, rec["dropped"] + dropped)
        rec["fatal_more"] = min(COUNT_MAX, rec["fatal_more"] + max(0, fatal_more))
        first, last = rec["ranks"]
        held = self._held.setdefault(host, [0, 0])
        made = None
        for e in found:
            rank = e["rank"] if e["rank"] is not None and first <= e["rank"] <= last else None
            e = dict(e, host=host, rank=rank, at=round(now - e.pop("age_s"), 3))
            kept = self._kept.get(event_key(e))
            if kept is not None:
                kept["count"] = min(COUNT_MAX, max(kept["count"], e["count"]))
                if e["fatal"] and not kept["fatal"]:
                    # A warning that became fatal (NVML silent too long): judged as it is now.
                    kept.update(e, count=kept["count"])
                    made = self._cause(kept, now) or made
                continue
            if not e["fatal"]:
                if held[0] >= EVENTS_PER_HOST or self._warned >= EVENTS_MAX:
                    rec["dropped"] = min(COUNT_MAX, rec["dropped"] + 1)
                    continue
                held[0] += 1
                self._warned += 1
            elif held[1] >= FATAL_PER_HOST and not self._replace(host, e):
                rec["fatal_more"] += 1  # its host has an earlier cause kept: nothing changes
                continue
            else:
                held[1] += 1
            rec["events"] += 1
            self._kept[event_key(e)] = e
            self.events.append(e)
            if e["fatal"]:
                made = self._cause(e, now) or made
        return made

    def _replace(self, host, e):
        """A fatal event past FATAL_PER_HOST: when it is dated before every fatal event kept
        of its host it takes the place of the newest (its event and its failure go), so the
        host's earliest cause is never lost and the record stays bounded; else False."""
        mine = [x for x in self.events if x["host"] == host and x["fatal"]]
        earliest = min(x["at"] - slack({"event": x}) for x in mine) if mine else None
        if earliest is None or e["at"] - slack({"event": e}) >= earliest:
            return False
        newest = max(mine, key=lambda x: x["at"])
        self.events = [x for x in self.events if x is not newest]
        self.failures = [f for f in self.failures if f.get("event") is not newest]
        self._kept.pop(event_key(newest), None)
        self.hosts[host]["events"] -= 1
        self.hosts[host]["fatal_more"] += 1
        return True

    def _cause(self, e, now):
        """A kept fatal event as a failure: a fatal OOM kill is the run's OOM (run.oom, its rank
        known or not), anything else a hardware cause (run.hardware)."""
        if e["kind"] == "oom":
            return self.fail(e["host"], OOM, now, "%s was %s" % (
                oom_victim(e["rank"], e["pid"]), e["what"] or "killed by the OOM killer"),
                at=e["at"], event=e, rank=e["rank"])
        return self.fail(e["host"], HARDWARE, now, e["what"] or e["line"], at=e["at"], event=e,
                         rank=e["rank"])

    def not_started(self, host, now, detail):
        rec = self.hosts.get(host)
        if rec is None or rec["state"] in DONE:
            return None
        rec.update(state=EXITED, last_seen=now, last_line=detail[-LINE_MAX:], ended=now)
        return self.fail(host, NOT_STARTED, now, detail)

    def closed(self, host, now):
        """A host's connection to the master ended. Not a failure yet: an agent reconnects
        after a broken connection; one that does not within defaults.CLOSED_LOST_S was killed (or its
        host went down), and is lost as of now."""
        rec = self.hosts.get(host)
        if rec is not None and rec["state"] not in DONE:
            self.closed_at.setdefault(host, now)

    # -- what time decides --------------------------------------------------------------------

    def tick(self, now, lease_age_s=None, lease_s=0.0, start_bound_s=None):
        """Decide what silence decides; returns the failure this tick made the run's first.

        lease_age_s: seconds since the controller's last look, None before its first look;
        until then the run is bounded by start_bound_s since its start instead (the lease
        counts from the controller's first look, so a slow start in many fork batches is not
        taken for a lost controller)."""
        self._judge_stalls(now)
        if self.final:
            return None
        made = []  # every host this tick fails is recorded, not only the first
        was_running = self.phase == RUNNING  # (the first failure of this tick changes it)
        elapsed = now - self.started
        # While agents dump their ranks' stacks (a hang) they do not beat: silence decides
        # nothing then.
        silence_counts = self.phase != HANG
        for rec in self.hosts.values():
            host = rec["host"]
            if rec["state"] == PENDING and elapsed > self.join_timeout_s and was_running:
                rec["state"], rec["ended"] = EXITED, now
                made.append(self.fail(
                    host, NOT_STARTED, now, "its agent never reached the master's control "
                    "port within join_timeout_s=%.0f" % self.join_timeout_s))
            elif rec["state"] == STARTED and host in self.closed_at \
                    and now - self.closed_at[host] > defaults.CLOSED_LOST_S:
                rec["state"], rec["ended"] = HOST_LOST, now
                made.append(self.fail(
                    host, LOST, now, "its agent's connection to the master closed without an "
                    "exit report and did not come back in %.0f s: the agent was killed or the "
                    "host went down" % defaults.CLOSED_LOST_S, at=self.closed_at.pop(host)))
            elif rec["state"] == STARTED and silence_counts \
                    and now - rec["last_seen"] > self.lost_after_s:
                rec["state"], rec["ended"] = HOST_LOST, now
                silent_s = now - rec["last_seen"]
                made.append(self.fail(
                    host, LOST, now, "no heartbeat for %.0f s (lost_after_s=%.0f): network "
                    "cut, host frozen or its agent killed" % (silent_s, self.lost_after_s),
                    at=rec["last_seen"]))
        first = next((f for f in made if f is not None), None)
        if self.phase != RUNNING:
            return first
        if lease_age_s is not None and lease_s and lease_age_s > lease_s:
            return self.fail(None, CONTROLLER_LOST, now, "the controller stopped watching the "
                             "run for %.0f s (interrupted or lost); every host was stopped"
                             % lease_age_s)
        if lease_age_s is None and start_bound_s and elapsed > start_bound_s:
            return self.fail(None, CONTROLLER_LOST, now, "the controller never looked at the "
                             "run in the %.0f s after its start (interrupted or lost during "
                             "the start); every host was stopped" % elapsed)
        running = [r for r in self.hosts.values() if r["state"] == STARTED]
        # Silence counts once every running host's ranks were up: a torchrun still importing
        # torch or in its rendezvous is starting, not hung (the rendezvous' own timeout and
        # job_timeout_s end a start that never ends). And only while a rank is alive: once every
        # agent counts none, the torchruns are ending (their exit barrier and their own
        # interpreter's exit: 10 s and more on a loaded host), with no rank to be hung or to
        # take a stack of (torchrun's exit barrier and job_timeout_s bound that end).
        ranks_up = [r.get("ranks_at") for r in running]
        if running and None not in ranks_up and any(r["alive"] for r in running) \
                and elapsed > self.hang_timeout_s:
            # Progress is a log written or a collective advanced, anywhere.
            last = max([r["progress_ts"] or 0 for r in self.hosts.values()] +
                       [self.last_advance(), self.started, max(ranks_up)])
            silent = now - last > self.hang_timeout_s
            if silent or self.collectives_stalled(now):
                found = self.finding(now)
                if flight.text(found):
                    detail = "hang at " + flight.text(found)
                elif silent:
                    detail = "no rank made progress for %.0f s (hang_timeout_s)" % (now - last)
                else:
                    detail = ("no rank's collective advanced for %.0f s (hang_timeout_s) while "
                              "ranks wait in one" % (now - self.last_advance()))
                hung = self.fail(None, HANG, now, detail, collective=found)
                if hung is not None or not self.observe:
                    return hung
        if elapsed > self.job_timeout_s:  # (an observed hang still ends at its bound)
            return self.fail(None, TIMEOUT, now, "still running after job_timeout_s=%.0f"
                             % self.job_timeout_s)
        return self.stragglers(now)

    def stragglers(self, now):
        """Judge the stragglers each STRAGGLE_EVAL_S; with straggler_action=restart, the first
        host named without a break for straggler_window_s ends the attempt (its restart leaves
        the host out, as a lost one)."""
        if not self.straggle.watched or not self.straggle.due(now):
            return None
        self.straggle.judge(now)
        stayed = self.straggle.stayed(now) if self.straggler_action == "restart" else None
        if stayed is None:
            return None
        return self.fail(stayed["host"], STRAGGLER, now, "a straggler for %.0f s "
                         "(straggler_window_s, straggler_action=restart): %s"
                         % (now - stayed["since"], straggle.words(stayed)))

    # -- the judge ----------------------------------------------------------------------------

    def fail(self, host, reason, now, detail, rc=None, root_cause=None, consequence=False,
             at=None, collective=None, event=None, rank=None, stalled=False):
        """Keep a failure and judge the run's first again; returns the failure when it is the
        first of the run (the run fails now: every host is told to stop), else None.
        event: the hardware event of a HARDWARE or OOM cause; rank: its rank, when known;
        stalled: the rank never joined the collective another died waiting in (_culprit)."""
        if self.final or self.phase == SUCCEEDED:
            return None
        rec = self.hosts.get(host) or {}
        cause = root_cause or {}
        rank = cause.get("rank", rank)
        found, waited = collective, False  # (a hang's finding: made by its caller)
        if found is None and reason == FAILED and rank is not None:
            found = self.finding(now, rank)
            waited = self._waited(rank, found)
            consequence = consequence or waited
        local_rank = cause.get("local_rank")
        if local_rank is None and rank is not None and rec:
            local_rank = rank - rec["ranks"][0]
        entry = {"host": host, "node_rank": rec.get("node_rank"), "reason": reason,
                 "detail": detail[-DETAIL_MAX:], "rc": rc, "rank": rank,
                 "local_rank": local_rank, "exitcode": cause.get("exitcode"),
                 "root_cause": root_cause, "consequence": bool(consequence),
                 "last_line": rec.get("last_line", ""),
                 "at_s": round((now if at is None else at) - self.started, 3),
                 "detected_s": round(now - self.started, 3), "collective": found,
                 "waited": waited, "event": event}
        if stalled:
            entry["stalled"] = True
        own = reason in OWN_STOPS and self.failure is None  # torchfleet's own decision
        if own and self.observe:
            if (host, reason) not in self.observed:
                self.observed[(host, reason)] = entry
                self.actions.append(self._stop_action(entry, now, done=False))
            return None
        if self.failure is None:
            # A hardware cause observed (not acted on) shortly before the run's own failure
            # explains it as it would have (its rank died of it, or hung in the driver until
            # NCCL's watchdog ended it); a hang or a straggler it saw earlier may have passed,
            # and is only the record's action.
            self.failures.extend(
                e for (_h, r), e in self.observed.items() if r in HW_REASONS
                and entry["at_s"] - e["at_s"] <= defaults.OBSERVED_CAUSE_S + slack(e))
        if reason in HW_REASONS and self.failure is not None \
                and entry["at_s"] - slack(entry) > self.failure["at_s"]:
            entry["late"] = True  # after the first failure (a hang's too): kept, not its cause
        first_of_run = self.failure is None
        self.failures.append(entry)
        if waited:
            self._culprit(found, entry, now)
        self._explain()
        self.failure = min(self.failures, key=_judged)
        if self.failure["collective"] is None:  # where the ranks were when it was judged
            self.failure["collective"] = self.finding(now, self.failure["rank"])
        self.phase, self.updated = self.failure["reason"], now
        if first_of_run and (own or reason == LOST):
            # A host lost (heartbeats stopped) is torchfleet's inference too: audited, and done
            # in observe as well (its ranks are gone or frozen; its peers would wait in their
            # collective until NCCL's own timeout, half an hour later).
            self.actions.append(self._stop_action(entry, now, done=True))
        return entry if first_of_run else None

    def _stop_action(self, entry, now, done):
        """The audit's entry of a stop of the run's own (OWN_STOPS): its evidence is the
        judge's detail, with the kernel's or NVML's line of a hardware cause."""
        why = entry["detail"]
        if entry.get("event") and entry["event"].get("line"):
            why = "%s (%s)" % (why, entry["event"]["line"])
        return action("stop", entry["host"], check_of(entry), now, why, done)

    def _culprit(self, found, waited, now):
        """A rank died waiting in a collective that another rank never joined: that rank (the
        first the finding names) is the cause, on its host, at the same moment, and explains
        the failure for a restart (restart.py); kept once."""
        named = (found.get("missing") or found.get("mismatch") or [None])[0]
        if not named or named.get("host") not in self.hosts or any(
                f.get("stalled") and f["rank"] == named["rank"] for f in self.failures):
            return
        verb = ("called %s" % named["op"]) if named.get("op") else "never joined"
        detail = "rank %d %s collective #%d (%s, %s, group %s), which rank %d on %s died " \
            "waiting in" % (named["rank"], verb, found["seq"], found.get("op") or "op unknown",
                            flight.human(found.get("bytes")), found.get("group"),
                            waited["rank"], waited["host"])
        self.fail(named["host"], FAILED, now, detail, at=self.started + waited["at_s"],
                  collective=found, rank=named["rank"], stalled=True)

    def _explain(self):
        """A rank's death on a host with a hardware cause at most its slack before it (on the
        same rank when the event names one) is that cause's consequence; the cause keeps which
        rank died of it."""
        causes = [f for f in self.failures if f["reason"] in HW_REASONS and not f.get("late")]
        for f in self.failures:
            if f["reason"] != FAILED or f["rank"] is None or f.get("stalled"):
                continue
            for c in causes:
                if c["host"] == f["host"] and (c["rank"] is None or c["rank"] == f["rank"]) \
                        and f["at_s"] >= c["at_s"] - slack(c):
                    f["consequence"] = True
                    if c.get("died") is None:
                        c["died"] = f["rank"]

    def _waited(self, rank, found):
        """Whether a dead rank was waiting in the collective that the finding names other
        ranks for: its death is their consequence."""
        named = flight.culprits(found)
        if rank is None or not named or rank in named:
            return False
        groups = self.positions().get(rank, (None, {}))[1]
        v = groups.get(found["group"])
        return bool(v) and v[0] == found["seq"] and v[0] > v[1]

    def all_done(self):
        return all(r["state"] in DONE or r["state"] == PENDING and self.phase != RUNNING
                   for r in self.hosts.values())

    # -- what is read -------------------------------------------------------------------------

    def record(self):
        stragglers, watch = self.straggle.record()
        return {"run_id": self.run_id, "phase": self.phase, "started": self.started,
                "updated": self.updated, "final": self.final, "nnodes": len(self.order),
                "nproc_per_node": self.nproc, "failure": self.failure,
                "failures": self.failures, "channel": {"refused": dict(self.refused)},
                "events": self.events, "hosts": [self.hosts[h] for h in self.order],
                "stragglers": stragglers, "straggle": watch,
                "checkpoints": [c if c["stall"] is not None else self._judged_stall(c)
                                for c in self.checkpoints],
                "checkpoints_folded": None if self.folded is None else dict(self.folded),
                "actions": list(self.actions),
                "checkpoint_watch": {"dir": self.checkpoint_watch["dir"],
                                     "warnings": list(self.checkpoint_watch["warnings"]),
                                     "blind": self.checkpoint_watch["blind"]},
                "timeline": self.timeline()}

    # -- goodput's timeline and checkpoints ---------------------------------------------------

    def timeline(self):
        """The run's moments on this clock, each None until known (the record's "timeline")."""
        hosts = list(self.hosts.values())
        up = [r.get("ranks_at") for r in hosts]
        ended = [r["ended"] for r in hosts if _number(r.get("ended")) is not None]
        # Every host's torchrun ended or judged lost (a host never heard from, once the run
        # failed, is done without an end of its own).
        done = all(r["state"] in DONE or r["state"] == PENDING and self.phase != RUNNING
                   for r in hosts)
        return {"running": max(up) if up and None not in up else None,
                "init_done": self.init_done,
                "failed": None if self.failure is None else round(
                    self.started + self.failure["at_s"], 3),
                "stopped": (max(ended) if ended else self.updated) if done else None,
                # A clean end's training ends here: the ranks' and torchrun's exit after it is
                # goodput's teardown.
                "last_collective": self.advances[-1] if self.advances else None}

    def _firsts(self, now, first, ranks):
        """A beat's {rank: age_s} of each rank's first collective (the watcher's "first"):
        dated once per rank on this clock; init_done once every rank of the run has one."""
        if not isinstance(first, dict) or self.init_done is not None:
            return
        for key, age in list(first.items())[:len(ranks)]:
            rank = flight.rank_key(key, ranks)
            age = _number(age)
            if rank is None or rank in self.firsts or age is None or not 0 <= age < 1e7:
                continue
            self.firsts[rank] = round(max(self.started, now - age), 3)
        if len(self.firsts) >= len(self.order) * self.nproc:
            self.init_done = max(self.firsts.values())

    def _advanced(self, at):
        """Some rank's completed collectives advanced at `at`: kept, one moment per
        ADVANCE_GAP_S, the newest ADVANCES_KEPT."""
        i = bisect.bisect_left(self.advances, at)
        if any(abs(x - at) < defaults.ADVANCE_GAP_S for x in self.advances[max(0, i - 1):i + 1]):
            return
        self.advances.insert(i, at)
        if len(self.advances) > ADVANCES_KEPT:
            del self.advances[0]

    def stall_s(self, c):
        """How long a checkpoint stalled the ranks: the union of the gaps longer than
        STALL_GAP_S between successive moments some rank's collectives advanced inside
        [began + CHECKPOINT_STALL_LEAD_S, ended - CHECKPOINT_STALL_TAIL_S] (the window's bounds
        count as moments): a synchronous save with the few collectives of its own inside
        (DeepSpeed's per-rank barriers, DCP's plan gather, FSDP's all-gathers) stalls for
        minutes all the same. A save of 2 s or less, one with no moment inside its window, and
        any save of a run with no rank's position (flight_recorder=0) stall whole (ended -
        began), as a synchronous save in the training loop does."""
        whole = round(c["ended"] - c["began"], 3)
        low = c["began"] + defaults.CHECKPOINT_STALL_LEAD_S
        high = c["ended"] - defaults.CHECKPOINT_STALL_TAIL_S
        if len(self.advances) >= ADVANCES_KEPT:  # older moments were dropped: not known there
            low = max(low, self.advances[0])
        inside = self.advances[bisect.bisect_right(self.advances, low):
                               bisect.bisect_left(self.advances, high)]
        if high <= low or not inside:
            return whole
        moments = [low] + inside + [high]
        gaps = sum(b - a for a, b in zip(moments, moments[1:], strict=False) if b - a > STALL_GAP_S)
        return round(min(gaps, whole), 3)

    def _judged_stall(self, c):
        stall_s = self.stall_s(c)
        return dict(c, stall_s=stall_s, stall=stall_s > 0)

    def _judge_stalls(self, now):
        """Each checkpoint's stall, judged once every beat that could show a collective of its
        window has come (two beats after its end), then kept."""
        for i, c in enumerate(self.checkpoints):
            if c["stall"] is None and now >= c["ended"] + 2 * defaults.BEAT_S:
                self.checkpoints[i] = self._judged_stall(c)

    def checkpoint_seen(self, now, ckpt):
        """A checkpoint the master's watch saw complete (ckptwatch.py), dated on this clock:
        checked and bounded, kept oldest first (the newest CHECKPOINTS_KEPT saves); returns its
        entry, or None. One save is one entry: a completion whose window overlaps the newest
        entry's (or ends within SAME_SAVE_S of it: per-rank shard files written side by side)
        extends that entry, and so does a second completion of an entry's path that began
        before that entry ended (a directory recorded twice); "files" counts them. Nothing is
        added once the record is final."""
        if self.final or not isinstance(ckpt, dict):
            return None
        began, ended = _number(ckpt.get("began")), _number(ckpt.get("ended"))
        path = ckpt.get("path")
        if began is None or ended is None or not isinstance(path, str) or not path \
                or math.isnan(began) or math.isnan(ended):
            return None
        ended = min(ended, now)
        entry = {"path": path[:CKPT_PATH_MAX], "began": round(min(began, ended), 3),
                 "ended": round(ended, 3), "step": _int(ckpt.get("step")),
                 "kind": ckpt.get("kind") if ckpt.get("kind") in CKPT_KINDS else "file",
                 "bytes": max(0, _int(ckpt.get("bytes")) or 0), "stall": None, "stall_s": None,
                 # per-rank shards the watch grouped by name (ckptwatch's shard groups)
                 "files": min(max(1, _int(ckpt.get("files")) or 1), 1 << 30)}
        if ckpt.get("partial") is True:  # some ranks' shards only: no checkpoint, said apart
            entry.update(partial=True, of=min(max(1, _int(ckpt.get("of")) or 1), 1 << 30))
        # (A save cut short is never merged with a whole one.)
        whole = [c for c in self.checkpoints if not c.get("partial")]
        same = None if entry.get("partial") else next(
            (c for c in reversed(whole) if c["path"] == entry["path"]
             and entry["began"] <= c["ended"] + SAME_SAVE_S), None)
        newest = whole[-1] if whole and not entry.get("partial") else None
        if same is None and newest is not None and (
                entry["began"] < newest["ended"] and newest["began"] < entry["ended"]
                or abs(entry["ended"] - newest["ended"]) <= SAME_SAVE_S):
            same = newest
        if same is not None:
            if same["path"] == entry["path"] and same["ended"] == entry["ended"]:
                return None  # the same completion told twice
            if same["path"] != entry["path"]:
                same["files"] = same.get("files", 1) + entry["files"]
                same["bytes"] = same["bytes"] + entry["bytes"]
            same.update(began=min(same["began"], entry["began"]),
                        ended=max(same["ended"], entry["ended"]), stall=None, stall_s=None)
            if entry["step"] is not None and (same["step"] is None or entry["step"] > same["step"]):
                same["step"] = entry["step"]
            self.checkpoints.sort(key=lambda c: c["ended"])
            self.updated = max(self.updated, now)
            return same
        i = len(self.checkpoints)
        while i and self.checkpoints[i - 1]["ended"] > entry["ended"]:
            i -= 1
        self.checkpoints.insert(i, entry)
        self._fold()
        self.updated = max(self.updated, now)
        return entry

    def _fold(self):
        """The saves past the newest CHECKPOINTS_KEPT are folded into one aggregate, not
        dropped: a days-long run's older stalls stay stalls (goodput), and its count says how
        many saves there were: {"saves", "stall_s", "save_s" (their writing summed), "first"
        (the oldest's began), "last" (the newest's ended)}."""
        while len(self.checkpoints) > defaults.CHECKPOINTS_KEPT:
            c = self.checkpoints.pop(0)
            if c.get("partial"):
                continue  # (no save: nothing to keep of it)
            if c["stall"] is None:
                c = self._judged_stall(c)
            f = self.folded or {"saves": 0, "stall_s": 0.0, "save_s": 0.0,
                                "first": c["began"], "last": c["ended"]}
            f.update(saves=f["saves"] + 1, stall_s=round(f["stall_s"] + c["stall_s"], 3),
                     save_s=round(f["save_s"] + c["ended"] - c["began"], 3),
                     first=min(f["first"], c["began"]), last=max(f["last"], c["ended"]))
            self.folded = f

    def checkpoint_blind(self, blind):
        """Whether the watch's last look could not read checkpoint_dir (missing, unreadable):
        the run's lost work is then unknown (goodput), not all of its training."""
        if not self.final:
            self.checkpoint_watch["blind"] = bool(blind)

    def checkpoint_warning(self, text):
        """A sentence of the checkpoint watch (a directory missing, unreadable, huge, a file
        that never stops growing): kept once, the first CKPT_WARNINGS_MAX."""
        text = text[:LINE_MAX] if isinstance(text, str) else ""
        warnings = self.checkpoint_watch["warnings"]
        if text and not self.final and text not in warnings and \
                len(warnings) < CKPT_WARNINGS_MAX:
            warnings.append(text)


def summary(record, now):
    """What the controller shows while a run goes on: the same few fields at any N."""
    hosts = record["hosts"]
    running = [h for h in hosts if h["state"] == STARTED]
    # The quietest host: the one whose ranks wrote to their logs longest ago (not a straggler:
    # that is the judge's, straggle.py; the key stays "slowest" for the readers of progress).
    slowest = min(running, key=lambda h: h["progress_ts"] or 0, default=None)
    failure = record.get("failure")
    return {
        "phase": record["phase"], "final": record["final"], "failure": failure,
        "elapsed_s": round(now - record["started"], 3),
        "nranks": record["nnodes"] * record["nproc_per_node"],
        "ranks_alive": sum(h["alive"] for h in hosts),
        "hosts_running": len(running), "nnodes": record["nnodes"],
        "hosts_done": sum(1 for h in hosts if h["state"] in DONE),
        "slowest": None if slowest is None else {
            "host": slowest["host"], "idle_s": None if slowest["progress_ts"] is None
            else round(now - slowest["progress_ts"], 1)},
        "last_line": (failure or {}).get("last_line") or (hosts[0]["last_line"] if hosts else ""),
        # Hardware warnings (clocks held down, a link that flapped): shown, never a failure;
        # and how many more the record does not hold (dropped()).
        "warnings": sorted({e["host"] for e in record.get("events") or []
                            if not e.get("fatal")}),
        "warnings_dropped": sum(dropped(record).values()),
        # The stragglers named at the master's last judgement (straggle.py), in words.
        "stragglers": [straggle.words(s) for s in straggle.read(record.get("stragglers"))
                       if s["active"]],
        "stragglers_watched": (record.get("straggle") or {}).get("watched", True),
    }
