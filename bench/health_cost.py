"""Node health's cost: preflight with health=basic (the default) against health=off, side by
side on one lab; and health=full, whose clean runs must name no host."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from bench.harness import lab, lab_down, playbook, stats


def run(args, tmp):
    """preflight.yml on an args.health_size-host lab, the three levels interleaved run by run.
    The lab has no GPU: basic reads the host's facts (memlock, free space, clock from the port
    test) and full measures one CPU thread per host; on GPU hosts basic adds one `nvidia-smi -q`,
    one `nvidia-smi nvlink -s` and the kernel log per host, which no machine here can time."""
    the_lab = lab(args.health_size)
    times = {"off": [], "basic": [], "full": []}
    named = []
    try:
        for i in range(args.runs):
            for level in times:
                run_dir = Path(tmp) / ("health-%s-%d" % (level, i))
                wall, _, rc, out = playbook("preflight.yml", the_lab.inventory,
                                            "-e", "health=%s" % level, "-e", "run_dir=%s" % run_dir)
                assert rc == 0, out[-3000:]
                times[level].append(wall)
                if level == "full":
                    report = json.loads((run_dir / "preflight.json").read_text())
                    named += [c["host"] for c in report["checks"]
                              if c["id"] == "cpu.perf" and not c["ok"]]
    finally:
        lab_down()
    base = statistics.median(times["off"])
    out = {level: {"preflight_s": stats(v), "ratio": statistics.median(v) / base,
                   "ratio_min": min(v) / max(times["off"]),
                   "ratio_max": max(v) / min(times["off"])} for level, v in times.items()}
    out["full"]["clean_runs_naming_a_host"] = len(set(named))
    out["goal"] = "basic <= 1.10x off"
    return out
