"""What watching checkpoint_dir costs the master's agent (issue 59: <= 0.1 % of a core).

The watch (module_utils/run/ckptwatch.py) runs as the agent runs it, a look each
CHECKPOINT_LOOK_S, over a directory where a writer saves a real torch.save checkpoint every
few seconds, with the directory holding a few files, then 100,000. Its figure is its own CPU
time (CheckpointWatch.cpu_s, the looking thread's) over the wall time of the window; the
baseline is the same window's share of one core, so the ratio is the share itself. The first
look, which takes what is already there as the past, is left out and given beside it: a run
pays it once.
"""
from __future__ import annotations

import os
import threading
import time

import torch

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.ckptwatch import CheckpointWatch

SIZES = (10, 100_000)


def _saver(path, every_s, stop, saved):
    step = 0
    while not stop.wait(every_s):
        step += 1
        torch.save({"w": torch.zeros(256, 1024), "step": step},
                   os.path.join(path, "step_%d.pt" % step))
        saved.append(step)


def window(path, files, window_s, every_s):
    os.makedirs(path)
    for i in range(files):
        with open(os.path.join(path, "old_%06d.log" % i), "w"):
            pass
    watch = CheckpointWatch(path)
    first_cpu = time.thread_time()
    watch.look(time.time())
    first_cpu = time.thread_time() - first_cpu
    stop, saved = threading.Event(), []
    saver = threading.Thread(target=_saver, args=(path, every_s, stop, saved), daemon=True)
    saver.start()
    cpu0, began, found = watch.cpu_s, time.monotonic(), []
    while time.monotonic() - began < window_s:
        time.sleep(defaults.CHECKPOINT_LOOK_S)
        found += watch.look(time.time())[0]
    wall = time.monotonic() - began
    stop.set()
    saver.join()
    return {"core_pct": 100.0 * (watch.cpu_s - cpu0) / wall, "first_look_s": first_cpu,
            "looks": watch.looks, "scans": watch.scans, "saved": len(saved),
            "found": len(found)}


def run(args, tmp):
    out = {}
    for files in SIZES:
        runs = [window(str(tmp / ("ckpt-%d-%d" % (files, i))), files, args.ckpt_window_s, 5.0)
                for i in range(args.runs)]
        pct = [r["core_pct"] for r in runs]
        out["files%d" % files] = {
            "files": files, "window_s": args.ckpt_window_s,
            "core_pct": {"median": sorted(pct)[len(pct) // 2], "min": min(pct), "max": max(pct),
                         "runs": len(pct)},
            "first_look_s": max(r["first_look_s"] for r in runs),
            "found_of_saved": [[r["found"], r["saved"]] for r in runs]}
    return out
