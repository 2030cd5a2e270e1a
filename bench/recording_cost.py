"""What torch's Flight Recorder and torchfleet's watcher thread cost the ranks: all_reduce
busbw of the built-in collective workload with recording on (flight_recorder=2000: torch
records every collective, the watcher reads where the rank is each second) against recording
off (TORCH_FR_BUFFER_SIZE=0, no watcher), side by side, run by run interleaved. Plain torchrun
on this machine (2 ranks, gloo): the same ranks and sitecustomize an agent starts, without the
control plane around them. busbw on two busy CPUs varies by tens of percent from run to run,
more than the goal, so the cost of one recorded collective is also timed alone: a one-rank
gloo group running 20000 all_reduces of one float, on against off."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import flight, stacks
from bench.harness import stats
from lab.ports import free_port

WORKLOADS = (Path(__file__).resolve().parent.parent / "src" / "ansible_collections" /
             "torchfleet" / "fleet" / "roles" / "launch" / "files" / "workloads")


def rank_env(run_dir, entries, **extra):
    """The ranks' environment an agent gives them: the recorder's variables and the run's
    sitecustomize (with the watcher when recording)."""
    env = dict(os.environ, **extra)
    env.update(flight.rank_env(entries, str(run_dir)))
    stacks.install_hook(str(run_dir), env, flight.WATCHER if entries else "")
    return env


def one(tmp, entries, i, args):
    run_dir = Path(tmp) / ("rec-%d-%d" % (entries, i))
    run_dir.mkdir(parents=True)
    env = rank_env(run_dir, entries, TORCHFLEET_OUT_DIR=str(run_dir / "results"),
                   PYTHONPATH=str(WORKLOADS))
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--master-port", str(free_port()), "--log-dir", str(run_dir / "logs"),
            "--redirects", "3", str(WORKLOADS / "collective.py"), "--ops", "all_reduce",
            "--sizes", args.recording_sizes, "--iters", str(args.busbw_iters)]
    subprocess.run(argv, env=env, check=True, timeout=600, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    out = {}
    for path in (run_dir / "results").glob("rank-*.json"):
        for item in json.loads(path.read_text())["results"]:
            out.setdefault(item["size_bytes"], []).append(item["busbw_gbs"])
    return {size: min(bw) for size, bw in out.items()}  # the slower rank's, as nccl-tests


PER_OP = r"""
import sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % sys.argv[1], rank=0,
                        world_size=1)
x = torch.ones(1)
for _ in range(2000):
    dist.all_reduce(x)
t = time.perf_counter()
for _ in range(20000):
    dist.all_reduce(x)
print((time.perf_counter() - t) / 20000 * 1e6)
"""


def per_op_us(tmp, entries, i):
    """Microseconds of one all_reduce in a one-rank group, with the watcher when recording."""
    run_dir = Path(tmp) / ("op-%d-%d" % (entries, i))
    (run_dir / "0").mkdir(parents=True)
    env = rank_env(run_dir, entries, RANK="0",
                   TORCHELASTIC_ERROR_FILE=str(run_dir / "0" / "error.json"))
    out = subprocess.run([sys.executable, "-c", PER_OP, str(free_port())], env=env, check=True,
                         timeout=600, capture_output=True, text=True).stdout
    return float(out.split()[-1])


def run(args, tmp):
    levels = (("off", 0), ("on", defaults.default("flight_recorder")))
    busbw = {"on": {}, "off": {}}
    for i in range(args.runs):
        for name, entries in levels:
            for size, bw in one(tmp, entries, i, args).items():
                busbw[name].setdefault(size, []).append(bw)
    out = {}
    for size in sorted(busbw["off"]):
        on, off = busbw["on"][size], busbw["off"][size]
        out[str(size)] = {"on_gbs": stats(on), "off_gbs": stats(off),
                          "ratio": statistics.median(on) / statistics.median(off),
                          "ratio_min": min(on) / max(off), "ratio_max": max(on) / min(off)}
    us = {"on": [], "off": []}
    for i in range(args.runs):
        for name, entries in levels:
            us[name].append(per_op_us(tmp, entries, i))
    out["per_op"] = {"on_us": stats(us["on"]), "off_us": stats(us["off"]),
                     "cost_us": statistics.median(us["on"]) - statistics.median(us["off"])}
    out["goal"] = "busbw with recording >= 0.98x without"
    return out
