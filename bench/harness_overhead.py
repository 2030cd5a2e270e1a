"""The collective test's busbw against a raw all_reduce loop in the same processes."""
from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

from bench.harness import ROOT, WORKLOADS, lab, lab_down, playbook, stats


def run(args, tmp):
    """The collective test's all_reduce busbw / a raw loop's, measured in the same torchrun
    processes (bench/harness_vs_raw.py: alternating rounds) on 2 lab nodes under train.yml."""
    the_lab = lab(2)
    try:
        # Beside the workloads it measures, as the launch role ships them to a run's hosts.
        shipped = tmp / "harness"
        shutil.copytree(WORKLOADS, shipped, dirs_exist_ok=True)
        script = Path(shutil.copy(ROOT / "bench" / "harness_vs_raw.py", shipped))
        ratios, per_run = {}, {}
        for i in range(args.runs):
            out = tmp / ("ho-%d.json" % i)
            wall, _, rc, text = playbook(
                "train.yml", the_lab.inventory, "-e", "run_dir=%s/ho%d" % (tmp, i), "-e",
                "script=%s" % script, "-e", json.dumps({"script_args": [
                    "--sizes", "1M,16M", "--iters", str(args.busbw_iters), "--out", str(out)]}))
            assert rc == 0, text[-3000:]
            for size, values in json.loads(out.read_text()).items():
                ratios.setdefault(size, []).extend(values)
                per_run.setdefault(size, []).append(statistics.median(values))
        return {"iters": args.busbw_iters, "method": "same processes, alternating rounds",
                "busbw_ratio_collective_over_raw": {size: stats(v) for size, v in ratios.items()},
                "per_run_median": {size: stats(v) for size, v in per_run.items()}}
    finally:
        lab_down()
