"""What detaching costs: train.yml -e detach=true followed by attach.yml, against the same run
attached (train.yml to its end), side by side on the same lab hosts; and one status look."""
from __future__ import annotations

import time

from bench.harness import lab, lab_down, playbook, stats, timed, BIN


def run(args, tmp):
    """On 3 lab hosts, the built-in DDP workload (train_steps steps) each way, in turn:
    attached (train.yml to its end) and detached (train.yml -e detach=true, which returns once
    every rank runs, then attach.yml -e run_id= to the end, gathered and reported). Between
    the two, status.yml -e run_id= (one look at the master's record) against `ansible -m ping`
    of the master (one Ansible round trip)."""
    the_lab = lab(3)
    inv = the_lab.inventory
    common = ("-e", "nnodes=3", "-e", "train_steps=%d" % args.detach_steps)
    times = {"attached": [], "detach": [], "attach": [], "status": [], "ping": []}
    try:
        for i in range(args.runs):
            wall, _, rc, out = playbook("train.yml", inv, *common,
                                        "-e", "run_dir=%s/attached%d" % (tmp, i))
            assert rc == 0, out[-3000:]
            times["attached"].append(wall)
            run_id = "detach%d-%d" % (i, time.time_ns() % 100000)
            wall, _, rc, out = playbook("train.yml", inv, *common, "-e", "detach=true",
                                        "-e", "run_id=%s" % run_id, "-e", "runs_root=%s" % tmp)
            assert rc == 0 and "is detached" in out, out[-3000:]
            times["detach"].append(wall)
            wall, _, rc, out = playbook("status.yml", inv, "-e", "run_id=%s" % run_id,
                                        "-e", "runs_root=%s" % tmp)
            assert rc == 0, out[-3000:]
            times["status"].append(wall)
            wall, _, rc, out = timed([str(BIN / "ansible"), "-i", str(inv), "node0", "-m",
                                      "ping"])
            assert rc == 0, out[-3000:]
            times["ping"].append(wall)
            wall, _, rc, out = playbook("attach.yml", inv, "-e", "run_id=%s" % run_id,
                                        "-e", "runs_root=%s" % tmp)
            assert rc == 0 and "train ok" in out, out[-3000:]
            times["attach"].append(wall)
    finally:
        lab_down()
    detached = [d + a + s for d, a, s in zip(times["detach"], times["attach"], times["status"], strict=True)]
    ratios = [d / a for d, a in zip(detached, times["attached"], strict=True)]
    status_ratios = [s / p for s, p in zip(times["status"], times["ping"], strict=True)]
    return {"hosts": 3, "steps": args.detach_steps,
            "attached_s": stats(times["attached"]), "detach_s": stats(times["detach"]),
            "attach_s": stats(times["attach"]), "status_s": stats(times["status"]),
            "ping_s": stats(times["ping"]), "detached_total_s": stats(detached),
            "ratio": stats(ratios), "status_ratio": stats(status_ratios)}
