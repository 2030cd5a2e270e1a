"""The control plane at 64 to 512 hosts x 8 ranks (lab/scale.py's harness: the real master and
agents, stand-in ranks; what is simulated is said there and in docs/benchmarks.md).

Each run of a size brings a fleet up, watches it steady for a window (the master's CPU and
memory, the control channel's bytes, the record's size, the controller's look and status),
then kills one rank (rank dies -> the master's failure -> every host told -> every host's
torchrun ended -> the record final -> the play's verdict). A hang run per size stops every
rank at a collective, one rank before it, and times the master naming that rank against
hang_timeout_s; a detach run per size detaches the run, leaves it unlooked-at past its lease,
attaches and follows it to a rank's death. Growth is
each figure at N over its figure at the smallest size, against N / smallest x 1.25 (issue 50:
nothing on the master may grow faster than the fleet by more than that).
"""
from __future__ import annotations

import json
import shutil
import statistics
import time

from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import status, summary
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import flight, runstate
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import AGENT_LOG
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.watch import look
from bench.harness import stats
from lab.scale import Fleet

HANG_TIMEOUT_S = 30.0
LEASE_S = 15.0  # the detach run's lease: a detached run must outlive it with nobody looking
# Per size: the fail-fast runs (and the steady figures), a hang, a detach. Without "fail" a
# size's result holds the other parts alone, merged into its earlier figures (harness.merge).
PARTS = ("fail", "hang", "detach")


def _timed(fn, repeat=5):
    """The median seconds of fn() over repeat calls."""
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def verdict(fleet, root, kind="train"):
    """The play's verdict on the controller at N: run_summary's decide (the one judge of the
    report) on the master's final record, every host's logs laid out as gather leaves them
    (run_dir/logs/<host>, here links to each host's own), timed once the fleet is idle; and
    the size of the train.json it writes. rank_results' per-host reading is not in it (the
    stand-in ranks write no results)."""
    ctl = root.with_name(root.name + "-ctl")
    (ctl / "logs").mkdir(parents=True)
    for i, name in enumerate(fleet.names):
        (ctl / "logs" / name).symlink_to(fleet.run_dir(i) / "logs" / name)
    record = look({"run_dir": str(fleet.run_dir(0)), "run_id": fleet.run_id,
                   "full": True})["record"]
    spec = summary.ARGUMENT_SPEC
    params = {k: v.get("default") for k, v in spec.items()}
    params.update(kind=kind, run_id=fleet.run_id, hosts=fleet.names, state=record,
                  world_size=fleet.n * fleet.nproc, settings={"nproc_per_node": fleet.nproc},
                  run_dir=str(ctl), expect_results=False,
                  isolate={k: v.get("default") for k, v in spec["isolate"]["options"].items()})
    try:
        began = time.perf_counter()
        result = summary.decide(params)
        took = time.perf_counter() - began
        first = (result.get("first_failure") or {})
        return {"verdict_s": took, "report_bytes": (ctl / ("%s.json" % kind)).stat().st_size,
                "verdict_host": first.get("host"), "verdict_rank": first.get("rank"),
                "verdict_culprits": flight.culprits(first.get("collective") or {})}
    finally:
        shutil.rmtree(ctl, ignore_errors=True)


def fail_run(n, root, steady_s, look_s, step_s):
    fleet = Fleet(root, n, look_s=look_s, step_s=step_s)
    try:
        began = time.monotonic()
        fleet.up(timeout_s=900)
        up_s = time.monotonic() - began
        time.sleep(5)  # past the start's own bursts
        cpu0, _ = fleet.master_usage()
        s0, w0 = fleet.stats(), time.monotonic()
        time.sleep(steady_s)
        cpu1, rss = fleet.master_usage()
        s1, w1 = fleet.stats(), time.monotonic()
        record = fleet.record()
        # The look and status are timed after the fleet is down, on a copy of the master's
        # run directory: on the master host they compete with the master alone, not with a
        # whole fleet's agents.
        shutil.copytree(fleet.run_dir(0), root.with_name(root.name + "-master"),
                        ignore=shutil.ignore_patterns("logs"))
        out = {
            "up_s": up_s, "master_cores": (cpu1 - cpu0) / (w1 - w0), "master_rss_mb": rss / 1e6,
            "channel_up_Bps": (s1["sent"] - s0["sent"]) / (w1 - w0),
            "channel_down_Bps": (s1["received"] - s0["received"]) / (w1 - w0),
            "record_bytes": len(json.dumps(record)),
        }
        victim = n // 2 + 1
        at = fleet.kill_rank(victim, 3)
        final = fleet.wait(lambda r: r["final"], 600, "the record final")
        for _ in range(600):
            st = fleet.stats()
            if st["live"] == 0:
                break
            time.sleep(0.5)
        failure = final["failure"]
        judged = verdict(fleet, root)
        broadcast = fleet.abort_broadcast()
        told = [v["told"] - at for v in st["times"].values() if "told" in v]
        ended = [v["ended"] - at for v in st["times"].values() if "ended" in v]
        out.update(
            named_right=(failure["host"] == fleet.names[victim]
                         and failure.get("rank") == victim * fleet.nproc + 3),
            detected_s=final["started"] + failure["detected_s"] - at,
            # the master's own part: the report judged (the failure decided and found where
            # every rank was) and the abort handed to every host's socket
            judged_s=broadcast[0] - (final["started"] + failure["detected_s"]),
            broadcast_s=broadcast[1] - broadcast[0],
            broadcast_cpu_s=broadcast[2],
            told_s=max(told), hosts_told=len(told), ended_s=max(ended), hosts_ended=len(ended),
            final_s=final["updated"] - at, verdict_s=judged["verdict_s"],
            train_json_bytes=judged["report_bytes"],
            verdict_right=(judged["verdict_host"] == fleet.names[victim]
                           and judged["verdict_rank"] == victim * fleet.nproc + 3))
    finally:
        fleet.down()
    copy = root.with_name(root.name + "-master")
    params = {"run_dir": str(copy), "run_id": fleet.run_id}
    text = status.text(status.view(look(dict(params, full=True))["record"], time.time()))
    out.update(look_s=_timed(lambda: look(params)),
               status_s=_timed(lambda: status.text(status.view(
                   look(dict(params, full=True))["record"], time.time()))),
               status_lines=len(text.splitlines()))
    shutil.rmtree(copy, ignore_errors=True)
    return out


def hang_run(n, root, look_s, step_s):
    fleet = Fleet(root, n, hang_timeout_s=HANG_TIMEOUT_S, look_s=look_s, step_s=step_s)
    try:
        fleet.up(timeout_s=900)
        victim = (n // 3) * fleet.nproc + 5
        began = fleet.hang(victim)
        record = fleet.wait(lambda r: r["failure"] is not None, HANG_TIMEOUT_S + 600, "a hang")
        failure = record["failure"]
        named = record["started"] + failure["detected_s"] - began
        culprits = flight.culprits(failure.get("collective") or {})
        fleet.wait(lambda r: r["final"], 600, "the record final")
        judged = verdict(fleet, root)  # a hang's reads every host's stacks
        return {"named_s": named, "over_timeout_s": named - HANG_TIMEOUT_S,
                "reason": failure["reason"], "named_right": failure["reason"] == runstate.HANG
                and culprits == [victim], "detail": failure["detail"][:300],
                "verdict_s": judged["verdict_s"], "train_json_bytes": judged["report_bytes"],
                "verdict_right": judged["verdict_culprits"] == [victim]}
    finally:
        fleet.down()


def detach_run(n, root, look_s, step_s):
    """Detach and attach at N, as train.yml -e detach=true and attach.yml do it through
    torchrun_watch: once every rank runs, one look with detach (timed to the master's own
    log saying it is detached); no look at all for twice the lease (a run still attached
    would end controller_lost: it must still run); then the attach's looks (touch_lease off,
    each timed) follow it, a rank is killed, and the attached follower sees the record final,
    naming that rank."""
    # Started in waves, with the join timeout of the harness's whole start: at 512 the burst
    # of 4,096 stand-ins left a starved agent short of the launch role's join timeout (130 s),
    # which would measure the harness, not detach and attach.
    fleet = Fleet(root, n, lease_s=LEASE_S, look_s=look_s, step_s=step_s, join_timeout_s=900)
    try:
        fleet.up(timeout_s=900, waves=True)
        log = fleet.run_dir(0) / AGENT_LOG
        began = time.monotonic()
        fleet.look(detach=True)
        fleet.wait(lambda r: log.exists() and "detached:" in log.read_text(errors="replace"),
                   120, "the master detached", renew=False)
        detach_s = time.monotonic() - began
        time.sleep(2 * LEASE_S)  # nobody looks
        held = fleet.record()
        attach_s = _timed(lambda: fleet.look(touch_lease=False))
        attach_full_s = _timed(lambda: fleet.look(full=True, touch_lease=False))
        victim = n // 4 + 1
        at = fleet.kill_rank(victim, 6)
        last = {}

        def followed(record):  # the attached follower's look, as attach.yml's watch makes it
            last.update(fleet.look(touch_lease=False))
            return last["state"] == "final"

        fleet.wait(followed, 600, "the detached run final", poll_s=0.2, renew=False)
        seen_s = time.time() - at
        failure = fleet.look(full=True, touch_lease=False)["record"]["failure"]
        return {"detach_s": detach_s, "held": held["failure"] is None and not held["final"],
                "attach_look_s": attach_s, "attach_full_look_s": attach_full_s,
                "final_seen_s": seen_s,
                "named_right": (failure["host"] == fleet.names[victim]
                                and failure.get("rank") == victim * fleet.nproc + 6)}
    finally:
        fleet.down()


def run(args, tmp):
    out = {"sizes": {}, "hang_timeout_s": HANG_TIMEOUT_S, "lease_s": LEASE_S,
           "steady_s": args.scale_steady_s,
           "look_s": args.scale_look_s, "step_s": args.scale_step_s}
    for n in args.scale_sizes:
        parts = {}
        try:
            if "fail" in args.scale_parts:
                runs = [fail_run(n, tmp / ("fleet%d-%d" % (n, i)), args.scale_steady_s,
                                 args.scale_look_s, args.scale_step_s) for i in range(args.runs)]
            if "hang" in args.scale_parts:
                parts["hang"] = hang_run(n, tmp / ("hang%d" % n), args.scale_look_s,
                                         args.scale_step_s)
            if "detach" in args.scale_parts:
                parts["detach"] = detach_run(n, tmp / ("detach%d" % n), args.scale_look_s,
                                             args.scale_step_s)
        except (RuntimeError, TimeoutError, OSError) as exc:  # a size that fails is a figure
            out["sizes"][str(n)] = {"hosts": n, "error": str(exc)[-1000:]}
            print("scale %d: %s" % (n, exc), flush=True)
            continue
        if "fail" not in args.scale_parts:
            out["sizes"][str(n)] = dict(parts, hosts=n, parts=sorted(parts))
            print("scale %d: %s" % (n, json.dumps(parts)), flush=True)
            continue
        size = {k: stats([float(r[k]) for r in runs]) for k in runs[0]
                if k not in ("named_right", "verdict_right", "hosts_told", "hosts_ended")}
        size.update(hosts=n, named_right=sum(r["named_right"] for r in runs), runs=len(runs),
                    verdict_right=sum(r["verdict_right"] for r in runs),
                    hosts_told=min(r["hosts_told"] for r in runs), **parts)
        out["sizes"][str(n)] = size
        print("scale %d: %s" % (n, json.dumps({k: v["median"] if isinstance(v, dict) and
                                               "median" in v else v for k, v in size.items()})),
              flush=True)
    measured = {n: size for n, size in out["sizes"].items() if "master_cores" in size}
    base = min(measured, key=int, default=None)
    for n, size in measured.items():
        allowed = int(n) / int(base) * 1.25
        size["growth"] = {k: size[k]["median"] / measured[base][k]["median"]
                          for k in ("master_cores", "master_rss_mb", "channel_up_Bps",
                                    "record_bytes", "look_s", "status_s", "judged_s",
                                    "broadcast_s", "told_s", "verdict_s",
                                    "train_json_bytes") if measured[base][k]["median"]}
        size["growth_allowed"] = allowed
    return out
