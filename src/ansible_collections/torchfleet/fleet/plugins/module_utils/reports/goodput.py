"""Goodput: the share of a run's wall time that became training that was kept, in buckets that
add up to the wall time (issue 59), the one-line summary of it, the checkpoint interval that
loses least, and the same over every run under a runs root (`torchfleet goodput`).

Pure arithmetic on a timeline the controller assembles from the master's record (every time on
the controller's clock, epoch seconds); see goodput(). The timeline comes from other hosts and
train.json from disk: every field is checked here, never assumed, and nothing raises.
"""
from __future__ import annotations

import json
import math
import os
import re
import stat
import time

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import RUN_ID

BUCKETS = ("preflight", "launch", "init", "kept_training", "checkpoint_stall", "lost_work",
           "detection", "teardown", "restart")
KEPT_MARGIN_S = defaults.CHECKPOINT_KEPT_MARGIN_S
SAME_SAVE_S = defaults.CHECKPOINT_SAME_SAVE_S  # (the record groups its saves alike)
UNKNOWN_MAX = 8             # sentences in "unknown"
TIME_MAX = 1e10             # an epoch time past 2286 is garbage, not a time
READ_MAX = 16 << 20         # a train.json larger than this is not read (the 256-host one: 0.3 MB)
# A run's MTBF history (history(), read at each run's end): the runs of the last 90 days by
# the report's time (a fleet's hardware of a year ago is not today's), the newest 500 of them
# by their train.json's mtime, each read up to 8 MiB, so that a runs root of 50,000 runs does
# not delay the report.
HISTORY_S = 90 * 86400.0
HISTORY_RUNS = 500
HISTORY_READ_MAX = 8 << 20
# The user's own stop costs work but says nothing of the mean time between failures; a run's
# planned end (run.timeout, at job_timeout_s) and a controller that went away
# (run.controller_lost) are the run's plan and its controller, not the fleet failing.
NOT_A_FAILURE = ("run.stopped_by_user", "run.timeout", "run.controller_lost")
# The report's gather counts as teardown only this long after every rank stopped: a detached
# run attached to days later did not spend those days being torn down.
GATHER_MAX_S = defaults.GOODPUT_GATHER_MAX_S
CHECK_ID = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")
NO_CHECKPOINT_DIR = ("lost work is unknown: no checkpoint_dir, so no checkpoint was seen; give "
                     "-e checkpoint_dir=<where the script saves> (until then goodput is an upper "
                     "bound: the training since the last checkpoint counts as kept)")

NO_SAVE_SEEN = ("lost work is unknown: the checkpoint watch saw no save in checkpoint_dir %s "
                "during the run (the wrong folder, or saves that go elsewhere, e.g. object "
                "storage?); if the script saved nothing, all of a failed attempt's training was "
                "lost; goodput is an upper bound")
PARTIAL = ("attempt %s: the save %s was cut short (%d of %d shards): not a checkpoint to resume "
           "from; lost work counts from the last complete save")

BLIND = ("lost work is unknown: the checkpoint watch could not read checkpoint_dir at the end "
         "(its sentence below says why), so a failure's loss since the last checkpoint is not "
         "known; goodput is an upper bound")


def _t(value):
    """An epoch time (or a duration) to the millisecond; None when it is not a plausible one."""
    value = finite(value)
    return None if value is None or not 0 <= value < TIME_MAX else round(value, 3)


def finite(value):
    """A finite number as a float, else None (JSON's 1e999 is inf; a bool is no number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:   # an int of 400 digits
        return None
    return value if math.isfinite(value) else None


def _d(seconds):
    """A bucket: a difference of millisecond times, to the millisecond (so they add up)."""
    return round(max(0.0, seconds), 3)


def _checkpoints(items):
    out = []
    for c in items if isinstance(items, list) else []:
        if not isinstance(c, dict):
            continue
        ended = _t(c.get("ended"))
        if ended is None:
            continue
        began = _t(c.get("began"))
        began = ended if began is None or began > ended else began
        step = c.get("step")
        files = c.get("files")
        # How long it stalled the ranks (the record's stall_s); an older record's "stall" is
        # the whole save's.
        stall_s = _t(c.get("stall_s"))
        stall_s = (ended - began if c.get("stall") is True else 0.0) if stall_s is None \
            else min(stall_s, ended - began)
        of = c.get("of")
        out.append({"path": str(c.get("path") or "")[-200:], "began": began, "ended": ended,
                    "partial": c.get("partial") is True,
                    "of": of if isinstance(of, int) and not isinstance(of, bool)
                    and 0 < of < 1 << 31 else None,
                    "step": step if isinstance(step, int) and not isinstance(step, bool) else None,
                    "files": files if isinstance(files, int) and not isinstance(files, bool)
                    and 0 < files < 1 << 31 else 1,
                    "stall_s": stall_s})
    # A save cut short (some ranks' shards only) is no checkpoint: kept apart, said.
    return _saves([c for c in out if not c["partial"]]), [c for c in out if c["partial"]]


def _folded(value):
    """The record's aggregate of the saves older than the ones it keeps (runstate's
    checkpoints_folded): {"saves", "stall_s", "save_s", "first", "last"} checked, else None."""
    if not isinstance(value, dict):
        return None
    saves = value.get("saves")
    if not isinstance(saves, int) or isinstance(saves, bool) or not 0 < saves < 1 << 31:
        return None
    out = {"saves": saves}
    for k in ("stall_s", "save_s", "first", "last"):
        out[k] = _t(value.get(k))
    if out["first"] is None or out["last"] is None or out["last"] < out["first"]:
        return None
    out["stall_s"] = min(out["stall_s"] or 0.0, out["save_s"] or 0.0) \
        if out["save_s"] is not None else 0.0
    return out


def _saves(ckpts):
    """Checkpoints grouped into saves: windows that overlap or end within SAME_SAVE_S of each
    other (per-rank shard files, 8 or 4096 a save) are one, from the earliest began to the
    latest ended, its files counted, its stall the union of theirs, each taken as the end of
    its window (exact for whole stalls; shards of one save stall at once)."""
    out, parts = [], []
    for c in sorted(ckpts, key=lambda c: c["began"]):
        last = out[-1] if out else None
        if last is not None and (c["began"] < last["ended"] or abs(c["ended"] - last["ended"])
                                 <= SAME_SAVE_S):
            last["ended"] = max(last["ended"], c["ended"])
            last["files"] += c["files"]
            parts[-1].append((c["ended"] - c["stall_s"], c["ended"]))
            if c["step"] is not None and (last["step"] is None or c["step"] > last["step"]):
                last["step"] = c["step"]
        else:
            out.append(dict(c))
            parts.append([(c["ended"] - c["stall_s"], c["ended"])])
    for c, stalled in zip(out, parts, strict=True):
        c["stall_s"] = min(_union(stalled), c["ended"] - c["began"])
        c["stall"] = c["stall_s"] > 0
        # A checkpoint holds the state at its save's start. A stall (the ranks waited for most
        # of it: a synchronous save, its own few collectives aside) trained nothing meanwhile:
        # what is kept reaches its end. Else training went on while it was written (an async
        # save: DCP's async_save, Megatron's --async-save) and that training is lost with it.
        c["kept_at"] = c["ended"] if c["stall_s"] * 2 >= c["ended"] - c["began"] > 0 \
            else c["began"]
    return sorted(out, key=lambda c: c["ended"])


def _union(windows):
    """The length of the union of [a, b] windows."""
    total, end = 0.0, None
    for a, b in sorted(w for w in windows if w[1] > w[0]):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def _median(values):
    values = sorted(values)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def _intervals(ends):
    """Successive checkpoints' ended, apart: how often the script saved."""
    return [b - a for a, b in zip(ends, ends[1:], strict=False) if b > a]


def _attempt(a, index, cursor, next_launch, last, now, watched, saw=True):
    """One attempt's boundaries, clipped monotonic, and its buckets (restart left to the run)."""
    number = a.get("attempt")
    number = number if isinstance(number, int) and not isinstance(number, bool) else index
    launch = _t(a.get("launch"))
    launch = cursor if launch is None else max(launch, cursor)
    running, init_done, failed, stopped = (_t(a.get(k)) for k in (
        "running", "init_done", "failed", "stopped"))
    failure = a.get("failure") if isinstance(a.get("failure"), dict) else None
    live = False
    notes = []
    if stopped is None:
        if last and now is not None:
            stopped, live = now, True
        elif not last and next_launch is not None:
            stopped = next_launch
        else:
            stopped = max([t for t in (running, init_done, failed) if t is not None] or [launch])
    is_failed = failed is not None or failure is not None
    failed = stopped if failed is None else failed
    ckpts, partial = _checkpoints(a.get("checkpoints"))
    folded = _folded(a.get("checkpoints_folded"))
    last_coll = _t(a.get("last_collective"))
    if init_done is None and not live and running is not None and (
            not is_failed or any(c["began"] >= running for c in ckpts)):
        # (a live one may be in its init still) Every rank ran, and the attempt ended well or
        # saved a checkpoint, with no first collective seen: flight_recorder=0, an old torch or
        # one dead watcher, not an attempt spent in its init: count it as training. A failed
        # one that saved nothing is read as one that died in its init (no training lost).
        notes.append("attempt %s: no rank's first collective was seen (flight_recorder=0 or an "
                     "old torch): init counts as training; goodput is an upper bound" % number)
        init_done = running
    if init_done is None:
        if not live:
            notes.append("attempt %s: no collective was seen completed on every rank; its "
                         "time to the end counts as init" % number)
        init_done = failed
    running = init_done if running is None else running
    running = max(running, launch)
    init_done = max(init_done, running)
    failed = max(failed, init_done)
    stopped = max(stopped, failed)
    # A clean attempt's training ends at its last collective completed: what follows (the
    # script's own exit, torchrun's) is teardown, as what precedes the first one is init.
    trained_to = failed
    if not is_failed and not live and last_coll is not None:
        trained_to = min(failed, max(init_done, last_coll))
    if not is_failed:
        lost, kept_to = 0.0, trained_to
    elif not watched or not saw and failed > init_done:
        # (no save seen in the whole run: the wrong folder? not all the training lost)
        lost, kept_to = None, failed
    else:
        done = [c["kept_at"] for c in ckpts if c["ended"] <= failed - KEPT_MARGIN_S]
        if folded is not None and folded["last"] <= failed - KEPT_MARGIN_S:
            done.append(folded["last"])  # (older than every save kept: a synchronous one's end)
        kept_to = min(failed, max([init_done] + done))
        lost = _d(failed - kept_to)
    # Each save's stalled part clipped to [I, kept_to] (saves do not overlap once grouped):
    # at most what is left of its window there; the saves the record folded (older than those
    # it keeps) as one window, their stalls summed.
    stall = sum(min(c["stall_s"], max(0.0, min(c["ended"], kept_to) - max(c["began"], init_done)))
                for c in ckpts if c["stall"])
    if folded is not None:
        stall += min(folded["stall_s"], max(0.0, min(folded["last"], kept_to)
                                            - max(folded["first"], init_done)))
    stall = _d(min(stall, kept_to - init_done))
    training = _d(trained_to - init_done)
    buckets = {"preflight": 0.0, "launch": _d(running - launch), "init": _d(init_done - running),
               "kept_training": _d(training - stall - (lost or 0.0)), "checkpoint_stall": stall,
               "lost_work": lost, "detection": _d(stopped - failed) if is_failed else 0.0,
               "teardown": _d(failed - trained_to), "restart": 0.0}
    for c in partial:
        notes.append(PARTIAL % (number, c["path"], c["files"], c["of"] or c["files"]))
    # A save cut by the failure tells neither how long a save takes nor how often one is made.
    whole = [c for c in ckpts if not is_failed or c["ended"] <= failed - KEPT_MARGIN_S]
    f = None
    if is_failed:
        failure = failure or {}
        f = {"attempt": number, "check": str(failure.get("check") or "")[:64],
             "host": str(failure.get("host") or "")[:200], "at": failed}
    return {"attempt": number, "launch": launch, "stopped": stopped, "live": live,
            "buckets": buckets, "failure": f, "checkpoints": ckpts, "whole": whole,
            "notes": notes, "folded": folded}


def _saw_a_save(a):
    """Whether the watch saw any save of this attempt (whole, cut short, or folded)."""
    items = a.get("checkpoints") if isinstance(a.get("checkpoints"), list) else []
    return any(isinstance(c, dict) and _t(c.get("ended")) is not None for c in items) or \
        _folded(a.get("checkpoints_folded")) is not None


def goodput(timeline, mtbf_s=None, history=None):
    """The train.json "goodput" object of a run's timeline (contract of issue 59):

    timeline: {"started": T0 (the first play's start), "now" (for a live run), "checkpoint_dir"
    ("" unset), "attempts": [{"attempt", "launch" L, "running" R, "init_done" I, "failed" F,
    "stopped" S (each None when unknown), "last_collective" E (the last moment some rank's
    collectives advanced), "failure": {"check", "host"} | None, "checkpoints":
    [{"path", "began", "ended", "step", "stall_s", "stall", "files", "partial", "of", ...}],
    "checkpoints_folded": the record's aggregate of the saves older than those it keeps
    ({"saves", "stall_s", "save_s", "first", "last"}) | None, "checkpoint_warnings": [str],
    "checkpoint_blind": the watch could not read checkpoint_dir at its last look}],
    "reported": when the report was written (the command's last play) | None, "nnodes"}.

    Each attempt's boundaries are clipped to L <= R <= I <= F <= S (and L to the previous
    attempt's S): a missing R or I is the next one known, a missing F is S (a clean end, unless
    a failure is named), a missing S is the next attempt's launch, or now for the last attempt
    of a live run. The buckets, which add up to the wall time T0 -> the last S:
    preflight = L1 - T0; launch = R - L; init = I - R; detection = F -> S; restart = S -> the
    next L; the training window [I, F] = kept_training + checkpoint_stall + lost_work, where
    lost_work = F - max(I, C), C where the last checkpoint ended KEPT_MARGIN_S before F keeps
    the training to (its end when it stalled the ranks for most of its window, else its start:
    training went on while it was written)
    (0 for a clean end; None when no checkpoint_dir is watched, or its watch was blind: that time stays in
    kept_training, and "unknown" says goodput is then an upper bound), and checkpoint_stall the
    saves' stalled seconds ("stall_s"; checkpoints that overlap are one save first: _saves()),
    each at most its window clipped to [I, max(I, C)] (a stall after C is lost work already).
    A missing I in an attempt that ended is R: init 0, "unknown" says so. A clean attempt's
    training ends at E (clipped to [I, S]): E -> S is teardown (the script's and torchrun's
    exit), and so is the last S -> "reported" (the gather and the report; at most
    GATHER_MAX_S), so that the wall time is the command's, first play to last. A save cut
    short ("partial": some ranks' shards only) is no checkpoint: "unknown" says so. When the
    watch saw no save at all in checkpoint_dir, lost work is unknown (the wrong folder?), not
    all the training. The run's buckets are its attempts' summed (the first attempt carries
    the preflight, each attempt the restart after it, the last the report's teardown).

    failures: one per failed attempt, "cost_s" = its lost work (0 when unknown) + detection +
    restart + the next attempt's launch and init. The mean time between failures (the user's own
    stop, a planned end and a lost controller are none: NOT_A_FAILURE) is per host-second, at
    this run's size: (its wall x nnodes + history's "host_s") / (its failures + history's
    "failures") / nnodes, history being the runs root's other runs (runs_goodput's); else the
    mtbf_s given. Also
    "advice" (see advice()), "save_s" and "interval_s" (medians), "live" (the last attempt
    still runs: the figures are so far) and "started" (T0): those two beyond the issue's object.
    """
    tl = timeline if isinstance(timeline, dict) else {}
    attempts = [a for a in (tl.get("attempts") if isinstance(tl.get("attempts"), list) else [])
                if isinstance(a, dict)]
    now = _t(tl.get("now"))
    watched = bool(tl.get("checkpoint_dir")) and isinstance(tl.get("checkpoint_dir"), str)
    t0 = _t(tl.get("started"))
    if t0 is None:
        # (no first play noted: the earliest moment the timeline holds)
        known = [_t(a.get(k)) for a in attempts
                 for k in ("launch", "running", "init_done", "failed", "stopped")] + [now]
        t0 = min([t for t in known if t is not None] or [0.0])
    cursor, done = t0, []
    saw = any(_saw_a_save(a) for a in attempts)
    for i, a in enumerate(attempts):
        last = i == len(attempts) - 1
        nxt = None if last else _t(attempts[i + 1].get("launch"))
        done.append(_attempt(a, i, cursor, nxt, last, now,
                             watched and a.get("checkpoint_blind") is not True, saw))
        cursor = done[-1]["stopped"]
    end = cursor if attempts else max(t0, now if now is not None else t0)
    reported = _t(tl.get("reported"))
    late = None
    if done and not done[-1]["live"] and reported is not None and reported > end:
        if reported - end <= GATHER_MAX_S:
            done[-1]["buckets"]["teardown"] = _d(done[-1]["buckets"]["teardown"] + reported - end)
            end = reported
        else:
            late = reported - end
    if done:
        done[0]["buckets"]["preflight"] = _d(done[0]["launch"] - t0)
    for prev, nxt in zip(done, done[1:], strict=False):
        prev["buckets"]["restart"] = _d(nxt["launch"] - prev["stopped"])
    total = {k: 0.0 for k in BUCKETS}
    if not done:
        total["preflight"] = _d(end - t0)
    for d in done:
        for k in BUCKETS:
            total[k] = _d(total[k] + (d["buckets"][k] or 0.0))
    # Lost work is unknown when no failed attempt's is known; where some are (a watch blind in
    # one attempt only), the known ones are summed and "unknown" says which are not.
    if any(d["buckets"]["lost_work"] is None for d in done) and not any(
            d["failure"] is not None and d["buckets"]["lost_work"] is not None for d in done):
        total["lost_work"] = None
    failures = []
    for i, d in enumerate(done):
        if d["failure"] is None:
            continue
        b = d["buckets"]
        cost = (b["lost_work"] or 0.0) + b["detection"] + b["restart"]
        if i + 1 < len(done):
            cost += done[i + 1]["buckets"]["launch"] + done[i + 1]["buckets"]["init"]
        failures.append(dict(d["failure"], cost_s=_d(cost)))
    unknown = []
    # Why each unknown lost work is: no checkpoint_dir, a watch that could not read it, or a
    # watch that saw no save at all.
    blind = [d["attempt"] for a, d in zip(attempts, done, strict=True)
             if d["buckets"]["lost_work"] is None and a.get("checkpoint_blind") is True]
    if not watched and any(d["buckets"]["lost_work"] is None for d in done):
        unknown.append(NO_CHECKPOINT_DIR)
    elif not saw and len(blind) < sum(d["buckets"]["lost_work"] is None for d in done):
        unknown.append(NO_SAVE_SEEN % str(tl.get("checkpoint_dir"))[:200])
    if watched and blind:
        unknown.append(BLIND if total["lost_work"] is None else
                       "%s (attempt %s)" % (BLIND, ", ".join(map(str, blind))))
    for d in done:
        unknown += d["notes"]
    if late is not None:
        unknown.append("the report came %s after every rank stopped (a run attached to later): "
                       "that wait is not in the wall time" % duration(late))
    for a in attempts:
        for w in a.get("checkpoint_warnings") if isinstance(a.get("checkpoint_warnings"),
                                                            list) else []:
            if isinstance(w, str) and w:
                unknown.append("checkpoint watch: %s" % w[:300])
    unknown = list(dict.fromkeys(unknown))[:UNKNOWN_MAX]
    ckpts = [c for d in done for c in d["checkpoints"]]
    save_s = _median([c["ended"] - c["began"] for d in done for c in d["whole"]])
    interval_s = _median([x for d in done for x in _intervals([c["ended"] for c in d["whole"]])])
    wall = _d(end - t0)
    counted = [f for f in failures if f["check"] not in NOT_A_FAILURE]
    nnodes = tl.get("nnodes")
    nnodes = nnodes if isinstance(nnodes, int) and not isinstance(nnodes, bool) and \
        0 < nnodes < 1 << 20 else 1
    mtbf = mtbf_of(wall * nnodes, len(counted), history, nnodes)
    mtbf = mtbf if mtbf is not None else _t(mtbf_s)
    return {"ratio": round(total["kept_training"] / wall, 6) if wall > 0 else 0.0,
            "wall_s": wall, "buckets": total, "unknown": unknown,
            "attempts": [{"attempt": d["attempt"], "buckets": d["buckets"]} for d in done],
            "checkpoints": [{k: c[k] for k in ("path", "began", "ended", "step", "files")}
                            for c in ckpts[-defaults.CHECKPOINTS_KEPT:]],
            # Older saves the record folded into one aggregate (a days-long run): counted in
            # checkpoint_stall all the same.
            "checkpoints_folded": sum(d["folded"]["saves"] for d in done if d["folded"]),
            "nnodes": nnodes,
            "failures": failures, "advice": advice(save_s, interval_s, mtbf),
            "save_s": None if save_s is None else round(save_s, 3),
            "interval_s": None if interval_s is None else round(interval_s, 3),
            "mtbf_s": None if mtbf is None else round(mtbf, 3),
            "live": bool(done and done[-1]["live"]) or (not done and now is not None),
            "started": t0}


def mtbf_of(host_s, failures, history, nnodes):
    """The mean time between failures at a run of nnodes hosts, from host-seconds per failure:
    this run's own (host_s, failures) pooled with history's ({"host_s", "failures"}: the runs
    root's other runs, whatever their size); None without any failure."""
    h = history if isinstance(history, dict) else {}
    h_s, h_f = finite(h.get("host_s")), h.get("failures")
    h_s = h_s if h_s is not None and 0 <= h_s < TIME_MAX * 1e3 else 0.0
    h_f = h_f if isinstance(h_f, int) and not isinstance(h_f, bool) and 0 <= h_f < 1 << 40 else 0
    total_f, total_s = failures + h_f, max(0.0, host_s) + h_s
    if total_f <= 0 or total_s <= 0:
        return None
    return total_s / total_f / max(1, nnodes)


def duration(seconds):
    """Seconds as people read them: 0.4 s, 40 s, 4 min 10 s, 12 min, 6 h, 6 h 20 min, 3 d 4 h."""
    s = max(0.0, float(seconds))
    if s < 10:
        return "%.1f s" % s if s % 1 and s < 9.95 else "%d s" % round(s)
    s = int(round(s))
    if s < 600:
        m, r = divmod(s, 60)
        return "%d s" % r if not m else "%d min" % m + (" %d s" % r if r else "")
    if s < 3600 - 30:
        return "%d min" % round(s / 60)
    m = int(round(s / 60))
    if m < 600:
        h, r = divmod(m, 60)
        return "%d h" % h + (" %d min" % r if r else "")
    h = int(round(s / 3600))
    if h < 72:
        return "%d h" % h
    d, r = divmod(h, 24)
    return "%d d" % d + (" %d h" % r if r else "")


def loss_per_failure(interval_s, save_s, mtbf_s):
    """What one failure costs, amortized, when the script saves every interval_s: on average
    half an interval of training is redone (interval/2), plus the saves made between two
    failures (save_s x mtbf_s / interval_s). Least at Young's sqrt(2 x save_s x mtbf_s), where
    both halves are equal and the loss is that interval itself."""
    return interval_s / 2.0 + save_s * mtbf_s / interval_s


def advice(save_s, interval_s, mtbf_s):
    """One sentence when the checkpoint interval that loses least (Young/Daly: sqrt(2 x save
    time x mean time between failures)) differs from the one used by more than 2x; "" when it
    does not or a figure is missing. E.g. "checkpoints every 2 h; with a failure every 6 h and
    40 s saves, every 22 min loses about 40 min less per failure" (see loss_per_failure)."""
    figures = [_t(x) for x in (save_s, interval_s, mtbf_s)]
    if any(x is None or x <= 0 for x in figures):
        return ""
    save_s, interval_s, mtbf_s = figures
    best = math.sqrt(2.0 * save_s * mtbf_s)
    if best <= save_s or interval_s / 2.0 <= best <= interval_s * 2.0:
        return ""
    gain = loss_per_failure(interval_s, save_s, mtbf_s) - loss_per_failure(best, save_s, mtbf_s)
    return ("checkpoints every %s; with a failure every %s and %s saves, every %s loses about "
            "%s less per failure" % (duration(interval_s), duration(mtbf_s), duration(save_s),
                                     duration(best), duration(gain)))


def line(g, so_far=None):
    """The one-line summary for `torchfleet status` and the live progress: "goodput 91 % so
    far; 1 restart cost 4 min 10 s: 2 min lost since the last checkpoint". so_far: None reads
    the object's "live"."""
    g = g if isinstance(g, dict) else {}
    ratio, wall = finite(g.get("ratio")), finite(g.get("wall_s"))
    if ratio is None or not wall or wall <= 0:
        return "goodput: nothing measured yet"
    buckets = g.get("buckets") if isinstance(g.get("buckets"), dict) else {}
    lost = finite(buckets.get("lost_work"))
    unknown = buckets.get("lost_work") is None
    pct = min(max(ratio, 0.0), 1.0) * 100
    pct_text = "%d %%" % (99 if 99 < pct < 100 else round(pct))
    head = "goodput %s%s%s" % ("at most " if unknown else "", pct_text,
                               " so far" if (g.get("live") if so_far is None else so_far) else "")
    failures = [f for f in g.get("failures") if isinstance(f, dict)] \
        if isinstance(g.get("failures"), list) else []
    if not failures:
        return head + "; no failure"
    n_attempts = len(g.get("attempts")) if isinstance(g.get("attempts"), list) else 0
    n = len(failures)
    # Every failure was followed by another attempt, or the last one ended the run.
    what = ("%d restart%s" if n < n_attempts else "%d failure%s") % (n, "" if n == 1 else "s")
    cost = sum(finite(f.get("cost_s")) or 0.0 for f in failures)
    tail = ("lost work unknown (no checkpoint_dir)" if unknown
            else "%s lost since the last checkpoint" % duration(lost) if lost
            else "no training lost")
    return "%s; %s cost %s%s: %s" % (head, what, "at least " if unknown else "",
                                     duration(cost), tail)


def read_bounded(path, limit=READ_MAX):
    """A JSON file's object, read without following a link, from a regular file of at most
    limit bytes; None for anything else (a FIFO, a device, a huge or broken file). Also its
    mtime."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None, None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None, None
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            return None, None
        data = json.loads(b"".join(chunks).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None, None
    finally:
        os.close(fd)
    return (data if isinstance(data, dict) else None), st.st_mtime


def _stored(g, report=None):
    """A run's stored goodput object, checked: (wall, buckets, failures, nnodes) or None when
    it is not one goodput() wrote. report: its train.json (the hosts of an older one)."""
    wall = finite(g.get("wall_s"))
    buckets = g.get("buckets")
    if wall is None or not 0 <= wall < TIME_MAX or not isinstance(buckets, dict):
        return None
    clean = {}
    for k in BUCKETS:
        v = buckets.get(k)
        if k == "teardown" and k not in buckets:
            v = 0.0  # (a train.json written before the bucket was: in its kept_training)
        if v is None and k == "lost_work":
            clean[k] = None
            continue
        v = finite(v)
        if v is None or not 0 <= v <= wall + 1e-3:
            return None
        clean[k] = v
    failures = []
    for f in g.get("failures") if isinstance(g.get("failures"), list) else []:
        if isinstance(f, dict):
            check = f.get("check") if isinstance(f.get("check"), str) else ""
            failures.append({"check": check if CHECK_ID.match(check) else "unknown",
                             "cost_s": min(max(finite(f.get("cost_s")) or 0.0, 0.0), wall)})
    return wall, clean, failures, _nnodes(g, report)


def _count(value):
    return value if isinstance(value, int) and not isinstance(value, bool) and \
        0 < value < 1 << 20 else None


def _nnodes(g, report):
    """A run's hosts: its goodput's nnodes; for a train.json written before goodput kept it,
    its world_size over its settings' nproc_per_node, else its hosts' rows; else 1."""
    report = report if isinstance(report, dict) else {}
    nnodes = _count(g.get("nnodes"))
    if nnodes is None:
        world = _count(report.get("world_size"))
        settings = report.get("settings") if isinstance(report.get("settings"), dict) else {}
        nproc = settings.get("nproc_per_node")
        nproc = _count(int(nproc) if isinstance(nproc, str) and nproc.isdigit() else nproc)
        if world is not None and nproc is not None and world >= nproc:
            nnodes = world // nproc
    if nnodes is None and isinstance(report.get("hosts"), list):
        nnodes = _count(len(report["hosts"]))
    return nnodes or 1


def history(runs_root, exclude="", now=None):
    """The runs root's record of failures for a run's own MTBF (goodput()'s history): the
    host-seconds of every run but `exclude` and the failures among them, of the runs started
    in the last HISTORY_S before now (the report's time), the newest HISTORY_RUNS, each read up
    to HISTORY_READ_MAX bytes."""
    view = runs_goodput(runs_root, since_s=HISTORY_S, now=now, exclude=exclude,
                        newest=HISTORY_RUNS, read_max=HISTORY_READ_MAX)
    return {"host_s": view["host_s"], "failures": view["counted_failures"]}


def runs_goodput(runs_root, since_s=None, now=None, exclude="", newest=None,
                 read_max=READ_MAX):
    """Goodput over the runs under runs_root (the run directories `torchfleet status` lists)
    whose train.json has a "goodput" object, started since_s ago or later (the run's T0, else
    its train.json's time less its wall time): kept training / wall time summed, the buckets
    summed, failures by cause (the judge's check ids) with what each cost, the mean time
    between failures, and the advice from them and the median of the runs' save times and
    checkpoint intervals. The mean time between failures is per host-second ("mtbf_host_s":
    every run's wall time x its hosts, over the failures), so that 8-host and 512-host runs
    are not pooled as one size; "sizes" gives it and its advice at each run size seen
    ({"nnodes", "runs", "wall_s", "failures", "mtbf_s", "advice"}), and "mtbf_s" and "advice"
    are those of the size that ran longest. A train.json that cannot be read or is not
    torchfleet's is skipped and counted; nothing raises. exclude: a run id left out; newest:
    only that many runs, the newest by their train.json's mtime; read_max: a train.json's
    bytes read at most (a larger one is skipped)."""
    now = time.time() if now is None else now
    cutoff = None if since_s is None else now - since_s
    out = {"runs_root": str(runs_root), "since_s": since_s, "runs": 0, "skipped": 0,
           "without_goodput": 0, "ratio": 0.0, "wall_s": 0.0, "kept_s": 0.0,
           "buckets": {k: 0.0 for k in BUCKETS}, "lost_work_unknown_runs": 0, "failures": 0,
           "mtbf_s": None, "causes": [], "save_s": None, "interval_s": None, "advice": "",
           "host_s": 0.0, "counted_failures": 0, "mtbf_host_s": None, "sizes": []}
    try:
        entries = sorted(os.listdir(runs_root))
    except OSError:
        return out
    causes, saves, intervals, counted, sizes = {}, [], [], 0, {}
    paths = []
    for name in entries:
        run_dir = os.path.join(runs_root, name)
        if name == exclude or not RUN_ID.match(name) or os.path.islink(run_dir) or \
                not os.path.isdir(run_dir):
            continue
        path = os.path.join(run_dir, "train.json")
        try:
            mtime = os.lstat(path).st_mtime
        except OSError:
            continue
        if cutoff is not None and mtime < cutoff:
            continue  # written before the cutoff: started before it too
        paths.append((mtime, path))
    if newest is not None:
        paths = sorted(paths, reverse=True)[:newest]
    for _m, path in sorted(paths, key=lambda p: p[1]):
        report, mtime = read_bounded(path, read_max)
        if report is None:
            out["skipped"] += 1
            continue
        if "goodput" not in report:
            out["without_goodput"] += 1
            continue
        g = report["goodput"] if isinstance(report["goodput"], dict) else {}
        stored = _stored(g, report)
        if stored is None:
            out["skipped"] += 1
            continue
        wall, buckets, failures, nnodes = stored
        started = _t(g.get("started"))
        started = started if started is not None else (mtime or 0.0) - wall
        if cutoff is not None and started < cutoff:
            continue
        out["runs"] += 1
        out["wall_s"] += wall
        out["host_s"] += wall * nnodes
        size = sizes.setdefault(nnodes, {"nnodes": nnodes, "runs": 0, "wall_s": 0.0,
                                         "failures": 0})
        size["runs"] += 1
        size["wall_s"] += wall
        size["failures"] += sum(f["check"] not in NOT_A_FAILURE for f in failures)
        for k in BUCKETS:
            if buckets[k] is None:
                out["lost_work_unknown_runs"] += 1
            else:
                out["buckets"][k] += buckets[k]
        for f in failures:
            c = causes.setdefault(f["check"], {"check": f["check"], "failures": 0, "cost_s": 0.0})
            c["failures"] += 1
            c["cost_s"] += f["cost_s"]
            counted += f["check"] not in NOT_A_FAILURE
        # Each run's own medians (goodput() left out the saves a failure cut), one vote a run.
        for figure, into in (("save_s", saves), ("interval_s", intervals)):
            value = _t(g.get(figure))
            if value is not None and value > 0:
                into.append(value)
    out["kept_s"] = out["buckets"]["kept_training"]
    out["ratio"] = round(out["kept_s"] / out["wall_s"], 6) if out["wall_s"] > 0 else 0.0
    out["failures"] = sum(c["failures"] for c in causes.values())
    out["counted_failures"] = counted
    host_mtbf = out["host_s"] / counted if counted else None
    out["mtbf_host_s"] = None if host_mtbf is None else round(host_mtbf, 3)
    out["causes"] = sorted(({"check": c["check"], "failures": c["failures"],
                             "cost_s": round(c["cost_s"], 3),
                             "cost_h": round(c["cost_s"] / 3600.0, 3)}
                            for c in causes.values()), key=lambda c: (-c["cost_s"], c["check"]))
    out["save_s"], out["interval_s"] = _median(saves), _median(intervals)
    for size in sorted(sizes.values(), key=lambda s: s["nnodes"]):
        mtbf = None if host_mtbf is None else round(host_mtbf / size["nnodes"], 3)
        out["sizes"].append(dict(size, wall_s=round(size["wall_s"], 3), mtbf_s=mtbf,
                                 advice=advice(out["save_s"], out["interval_s"], mtbf)))
    if out["sizes"]:
        longest = max(out["sizes"], key=lambda s: (s["wall_s"], s["nnodes"]))
        out["mtbf_s"], out["advice"] = longest["mtbf_s"], longest["advice"]
    out["host_s"] = round(out["host_s"], 3)
    out["wall_s"], out["kept_s"] = round(out["wall_s"], 3), round(out["kept_s"], 3)
    out["buckets"] = {k: round(v, 3) for k, v in out["buckets"].items()}
    return out
