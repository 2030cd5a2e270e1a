"""preflight.yml against `ansible nodes -m ping` on the same hosts: the local default, then lab
sizes; with --recheck-runs, a restart's re-check of every candidate on the same lab hosts
(bench/recheck.yml)."""
from __future__ import annotations

import json
import os
import statistics
import time

from bench.harness import ROOT, TIMER_ENV, lab, lab_down, ping, playbook, stats

# A playbook's limit grows with the hosts: at 512 lab hosts on this machine ping takes ~450 s,
# preflight ~550 s and the re-check run (preflight, then the re-check) twice that.
LIMIT_S_PER_HOST = 4.0


def limit_s(nhosts):
    return max(600.0, LIMIT_S_PER_HOST * nhosts)


def preflight_vs_ping(inventory, runs, nhosts, tmp):
    pre, pings, cpu = [], [], []
    timings = tmp / "timings.jsonl"
    for i in range(runs):
        wall, c, rc, out = ping(inventory, timeout_s=limit_s(nhosts))
        assert rc == 0, out[-2000:]
        pings.append(wall)
        timings.unlink(missing_ok=True)
        wall, c, rc, out = playbook("preflight.yml", inventory, "-e", "run_dir=%s/pf%d" % (tmp, i),
                                    timeout_s=limit_s(nhosts), BENCH_TIMINGS=str(timings),
                                    **TIMER_ENV)
        assert rc == 0, out[-3000:]
        pre.append(wall)
        cpu.append(c / nhosts)
    tasks = [t for t in map(json.loads, timings.read_text().splitlines()) if "task" in t]
    slowest = sorted(tasks, key=lambda t: -t["seconds"])[:5]
    return {"hosts": nhosts, "preflight_s": stats(pre), "ping_s": stats(pings),
            "ratio": statistics.median(pre) / statistics.median(pings),
            "ratio_min": min(pre) / max(pings), "ratio_max": max(pre) / min(pings),
            "controller_cpu_s_per_host": stats(cpu),
            "slowest_tasks": [{"task": t["task"], "seconds": round(t["seconds"], 3)}
                              for t in slowest]}


def recheck(inventory, runs, nhosts, tmp):
    """bench/recheck.yml `runs` times: the re-check's seconds are its plays' (attempt.yml's
    restart plays, from the first one's start to the playbook's end), beside the same run's
    preflight (from the process's start to the bench's own play)."""
    timings = tmp / "recheck-timings.jsonl"
    pre, checks = [], []
    for i in range(runs):
        timings.unlink(missing_ok=True)
        began = time.monotonic()
        wall, _, rc, out = playbook(str(ROOT / "bench" / "recheck.yml"), inventory,
                                    "-e", "run_dir=%s/rc%d" % (tmp, i), "-e", "max_restarts=1",
                                    timeout_s=2 * limit_s(nhosts), BENCH_TIMINGS=str(timings),
                                    **TIMER_ENV)
        assert rc == 0 and "passed its re-check" in out, out[-3000:]
        lines = [json.loads(line) for line in timings.read_text().splitlines()]
        plays = [t for t in lines if "play" in t]
        bench = next(t["at"] for t in plays if t["play"].startswith("Bench |"))
        first = next(t["at"] for t in plays if t["play"].startswith("Restart |"))
        end = next(t["end"] for t in lines if "end" in t)
        pre.append(bench - began)
        checks.append(end - first)
    return {"hosts": nhosts, "candidates": nhosts, "recheck_s": stats(checks),
            "preflight_in_run_s": stats(pre),
            "ratio": statistics.median(checks) / statistics.median(pre)}


def run(args, tmp):
    out = {"local": preflight_vs_ping(ROOT / "inventory" / "local.yml", args.runs, 2, tmp)}
    if os.geteuid() == 0:
        for n in args.lab_sizes:
            the_lab = lab(n)
            try:
                out["lab%d" % n] = preflight_vs_ping(the_lab.inventory, args.runs, n, tmp)
                if args.recheck_runs:
                    try:
                        out["lab%d" % n]["recheck"] = recheck(the_lab.inventory,
                                                              args.recheck_runs, n, tmp)
                    except AssertionError as exc:  # the pairs above are still a figure
                        out["lab%d" % n]["recheck_error"] = str(exc)[-1000:]
            finally:
                lab_down()
    return out
