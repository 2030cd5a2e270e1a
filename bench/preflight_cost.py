"""preflight.yml against `ansible nodes -m ping` on the same hosts: the local default, then lab sizes."""
from __future__ import annotations

import json
import os
import statistics

from bench.harness import ROOT, TIMER_ENV, lab, lab_down, ping, playbook, stats


def preflight_vs_ping(inventory, runs, nhosts, tmp):
    pre, pings, cpu = [], [], []
    timings = tmp / "timings.jsonl"
    for i in range(runs):
        wall, c, rc, out = ping(inventory)
        assert rc == 0, out[-2000:]
        pings.append(wall)
        timings.unlink(missing_ok=True)
        wall, c, rc, out = playbook("preflight.yml", inventory, "-e", "run_dir=%s/pf%d" % (tmp, i),
                                    BENCH_TIMINGS=str(timings), **TIMER_ENV)
        assert rc == 0, out[-3000:]
        pre.append(wall)
        cpu.append(c / nhosts)
    tasks = [json.loads(line) for line in timings.read_text().splitlines()]
    slowest = sorted(tasks, key=lambda t: -t["seconds"])[:5]
    return {"hosts": nhosts, "preflight_s": stats(pre), "ping_s": stats(pings),
            "ratio": statistics.median(pre) / statistics.median(pings),
            "ratio_min": min(pre) / max(pings), "ratio_max": max(pre) / min(pings),
            "controller_cpu_s_per_host": stats(cpu),
            "slowest_tasks": [{"task": t["task"], "seconds": round(t["seconds"], 3)}
                              for t in slowest]}


def run(args, tmp):
    out = {"local": preflight_vs_ping(ROOT / "inventory" / "local.yml", args.runs, 2, tmp)}
    if os.geteuid() == 0:
        for n in args.lab_sizes:
            the_lab = lab(n)
            try:
                out["lab%d" % n] = preflight_vs_ping(the_lab.inventory, args.runs, n, tmp)
            finally:
                lab_down()
    return out
