"""collective.yml against raw ssh + torchrun on the same lab nodes."""
from __future__ import annotations

import json
import statistics

from bench.harness import (
    lab_down,
    TIMER_ENV,
    WORKLOADS,
    lab,
    playbook,
    raw_launch,
    stats)


def launch_overhead_at(n, args, tmp):
    the_lab = lab(n)
    timings = tmp / "launch-timings.jsonl"
    try:
        script = WORKLOADS / "collective.py"
        sargs = ["--sizes", "64K", "--iters", "5"]
        fleet, raw = [], []
        for i in range(args.runs):
            timings.unlink(missing_ok=True)
            wall, _, rc, out = playbook("collective.yml", the_lab.inventory, "-e",
                                        "run_dir=%s/lo%d-%d" % (tmp, n, i),
                                        "-e", "collective_sizes=64K",
                                        "-e", "collective_iters=5", **TIMER_ENV,
                                        BENCH_TIMINGS=str(timings))
            assert rc == 0, out[-3000:]
            fleet.append(wall)
            wall, rcs = raw_launch(the_lab, 29510 + i, script, sargs, tmp)
            assert rcs == [0] * n, rcs
            raw.append(wall)
        # (the timer's lines: tasks, and each play's start and the end, which carry no seconds)
        tasks = [json.loads(line) for line in timings.read_text().splitlines()]
        return {"hosts": n, "collective_yml_s": stats(fleet), "raw_ssh_torchrun_s": stats(raw),
                "overhead_s": statistics.median(fleet) - statistics.median(raw),
                "ratio": statistics.median(fleet) / statistics.median(raw),
                "tasks_last_run": [{"task": t["task"], "seconds": round(t["seconds"], 3)}
                                   for t in tasks if t.get("seconds", 0) >= 0.3]}
    finally:
        lab_down()


def run(args, tmp):
    out = {"sizes": {}}
    for n in args.launch_sizes:
        out["sizes"]["lab%d" % n] = launch_overhead_at(n, args, tmp)
    # The 2-host figures stay where earlier results had them (before/after comparisons).
    first = out["sizes"].get("lab2") or next(iter(out["sizes"].values()))
    out.update({k: first[k] for k in ("collective_yml_s", "raw_ssh_torchrun_s", "overhead_s",
                                      "tasks_last_run")})
    return out
