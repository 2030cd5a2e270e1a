"""Rank 1 exits 1: until every rank on every host is gone, and the play's exit; plain torchrun beside it."""
from __future__ import annotations

import json
import time

from bench.harness import (
    lab_down,
    GoneWatcher,
    RAW_BOUND_S,
    lab,
    pids_running,
    playbook,
    raw_launch,
    stats)


FAIL_SCRIPT = '''
import os, sys, time, torch.distributed as dist
dist.init_process_group("gloo")
time.sleep(4)
if dist.get_rank() == 1:
    with open(sys.argv[1], "w") as f:
        f.write(repr(time.time()))
    sys.exit(1)
time.sleep(300)
'''


def fail_fast_at(n, args, tmp, raw_runs):
    the_lab = lab(n)
    script = tmp / ("fail_after_4s_%d.py" % n)
    script.write_text(FAIL_SCRIPT)
    try:
        gone, exits, raw = [], [], []
        for i in range(args.runs):
            stamp = tmp / ("failed-at-%d-%d" % (n, i))
            watcher = GoneWatcher(str(script), stamp)
            watcher.start()
            wall, _, rc, out = playbook("train.yml", the_lab.inventory, "-e",
                                        "nnodes=%d" % n, "-e",
                                        "run_dir=%s/ff%d-%d" % (tmp, n, i), "-e",
                                        "script=%s" % script,
                                        "-e", json.dumps({"script_args": [str(stamp)]}))
            ended = time.time()
            watcher.done.set()
            watcher.join()
            assert rc != 0 and stamp.exists(), out[-3000:]
            assert not pids_running(str(script)), (tmp / ("ff%d-%d" % (n, i)) / "train.json")
            failed = float(stamp.read_text())
            gone.append(watcher.gone_at - failed)
            exits.append(ended - failed)
            stamp.unlink()
        for i in range(raw_runs):
            stamp = tmp / ("raw-failed-at-%d-%d" % (n, i))
            wall, rcs = raw_launch(the_lab, 29520 + i, script, [str(stamp)], tmp,
                                   timeout_s=RAW_BOUND_S)
            raw.append((time.time() - float(stamp.read_text())) if rcs is not None and
                       stamp.exists() else float("inf"))
        out = {"hosts": n, "failure_to_every_rank_gone_s": stats(gone),
               "failure_to_play_exit_s": stats(exits)}
        if raw:
            out["raw_torchrun_failure_to_all_exited_s"] = stats(raw)
        return out
    finally:
        lab_down()


def run(args, tmp):
    out = {"sizes": {}}
    for n in args.fail_fast_sizes:
        # Plain torchrun's figure is a bound (> RAW_BOUND_S): measured once, at the first size.
        out["sizes"]["lab%d" % n] = fail_fast_at(n, args, tmp, 1 if not out["sizes"] else 0)
    first = next(iter(out["sizes"].values()))
    out.update({"failure_to_play_exit_s": first["failure_to_play_exit_s"],
                "raw_torchrun_failure_to_all_exited_s":
                    first.get("raw_torchrun_failure_to_all_exited_s"),
                "raw_note": "inf means plain torchrun was still running %d s after the failure"
                            % RAW_BOUND_S})
    return out


# Prints a line a second for argv[1] seconds: a run the controller only watches.
