"""Many fork batches against the lease: no false abort."""
from __future__ import annotations

import json
from pathlib import Path

from bench.harness import lab, lab_down, playbook


def run(args, tmp):
    """train.yml on n lab hosts with few forks: the agents start over many fork batches, the
    start longer than the master's lease (args.skew_lease_s, looked at every second). Whether
    the run ends ok (no false abort), and how far apart the first and the last agent
    started."""
    n = args.skew_size
    the_lab = lab(n)
    try:
        out = {"hosts": n, "lease_s": args.skew_lease_s, "forks": {}}
        for forks in args.skew_forks:
            run_dir = tmp / ("skew%d-%d" % (n, forks))
            wall, _, rc, text = playbook("train.yml", the_lab.inventory, "-e", "nnodes=%d" % n,
                                         "-e", "train_steps=20", "-f", str(forks),
                                         "-e", "launch_lease_s=%g" % args.skew_lease_s,
                                         "-e", "launch_poll_s=1", "-e", "run_dir=%s" % run_dir)
            state = json.loads((run_dir / "run_state.json").read_text())
            runs = Path.home() / ".torchfleet" / "runs" / state["run_id"]
            started = [json.loads((runs / ("node%d" % i) / "torchrun.pid").read_text())["started"]
                       for i in range(n)]
            out["forks"][str(forks)] = {"ok": rc == 0, "phase": state["phase"],
                                        "start_spread_s": round(max(started) - min(started), 2),
                                        "wall_s": round(wall, 2)}
        return out
    finally:
        lab_down()
