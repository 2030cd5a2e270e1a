"""torchfleet's benchmarks: what it costs and how it scales, against baselines in the same run.

    python -m bench                      # everything (root: lab benchmarks), 5 runs each
    python -m bench --runs 3 --only preflight_cost scale
    python -m bench --runs 3 --only lean --lab-sizes 2 --fail-fast-sizes 2 8   # issue 58's figures

Every figure is a ratio (or difference) to a baseline measured in the same process, median of
the runs with min and max. Results go to bench/results/results.{json,md}. This is not a test:
it never fails on a timing; a missed target is reported as such.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

from bench import (accuracy, checkpoint_watch, container_launch, detach_cost, diagnosis, fail_fast, flood, fuzz, hardware_watch, ledger,
                   harness_overhead, health_cost, isolate, launch_overhead, launch_profile, output_lines, preflight_cost, recording_cost,
                   report_scale, restart_cost, restart_profile, scale, spare_prepare, spares_cost, start_skew, straggler,
                   straggler_rates, watch_cpu)
from bench.harness import RESULTS, machine, markdown, merge, write

BENCHES = {
    "preflight_cost": preflight_cost.run,
    "launch_overhead": launch_overhead.run,
    "launch_profile": launch_profile.run,
    "container_launch": container_launch.run,
    "fail_fast": fail_fast.run,
    "watch_cpu": watch_cpu.run,
    "diagnosis": diagnosis.run,
    "harness_overhead": harness_overhead.run,
    "isolate": isolate.run,
    "fuzz": fuzz.run,
    "flood": flood.run,
    "start_skew": start_skew.run,
    "output_lines": output_lines.run,
    "report_scale": report_scale.run,
    "spares_cost": spares_cost.run,
    "restart_cost": restart_cost.run,
    "restart_profile": restart_profile.run,
    "spare_prepare": spare_prepare.run,
    "ledger": ledger.run,
    "health_cost": health_cost.run,
    "recording_cost": recording_cost.run,
    "detach_cost": detach_cost.run,
    "hardware_watch": hardware_watch.run,
    "straggler": straggler.run,
    "straggler_rates": straggler_rates.run,
    "scale": scale.run,
    "checkpoint_watch": checkpoint_watch.run,
    "accuracy": accuracy.run,
}
# Named groups of measures, for --only: "lean" is every figure of the launch's cost (issue 58),
# each beside its baseline in one sitting.
GROUPS = {"lean": ["preflight_cost", "launch_overhead", "launch_profile", "fail_fast",
                   "spares_cost", "isolate"]}
NEEDS_ROOT = {"launch_overhead", "launch_profile", "container_launch", "fail_fast", "watch_cpu", "diagnosis", "harness_overhead",
              "isolate", "flood", "start_skew", "output_lines", "spares_cost",
              "restart_cost", "restart_profile", "health_cost", "detach_cost", "straggler",
              "accuracy"}


def main():
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--only", nargs="*", choices=sorted(BENCHES) + sorted(GROUPS),
                        default=sorted(BENCHES), help="measures, or groups of them: %s" % GROUPS)
    parser.add_argument("--lab-sizes", type=int, nargs="*", default=[2, 16, 64, 128],
                        help="lab sizes of preflight_cost")
    parser.add_argument("--recheck-runs", type=int, default=0,
                        help="runs of a restart's re-check of every lab host (preflight_cost)")
    parser.add_argument("--launch-sizes", type=int, nargs="*", default=[2, 16])
    parser.add_argument("--container-sizes", type=int, nargs="*", default=[2, 8],
                        help="lab sizes of container_launch")
    parser.add_argument("--fail-fast-sizes", type=int, nargs="*", default=[2, 8, 16])
    parser.add_argument("--watch-sizes", type=int, nargs="*", default=[2, 8, 16])
    parser.add_argument("--watch-window-s", type=float, default=30,
                        help="how long watch_cpu samples the controller during the watch")
    parser.add_argument("--detach-steps", type=int, default=400,
                        help="train_steps of the detach_cost runs")
    parser.add_argument("--isolate-size", type=int, default=8,
                        help="lab hosts of the isolate bench")
    parser.add_argument("--flood-size", type=int, default=16, help="lab hosts of flood")
    parser.add_argument("--flood-rate", type=float, default=200,
                        help="garbage connections a second of flood's flooder")
    parser.add_argument("--flood-steps", type=int, default=100,
                        help="steps of the built-in training run of flood")
    parser.add_argument("--skew-size", type=int, default=16, help="lab hosts of start_skew")
    parser.add_argument("--skew-forks", type=int, nargs="*", default=[16, 1],
                        help="Ansible forks of start_skew (1: a batch per host)")
    parser.add_argument("--skew-lease-s", type=float, default=5,
                        help="the master's lease in start_skew (lease_s, 120 s by default in a run)")
    parser.add_argument("--fuzz-lines", type=int, default=100000,
                        help="frames fed to each end of the control channel by the fuzz bench")
    parser.add_argument("--output-sizes", type=int, nargs="*", default=[2, 16, 128],
                        help="lab sizes of output_lines")
    parser.add_argument("--scale-sizes", type=int, nargs="*", default=[64, 128, 256, 512],
                        help="simulated hosts (x 8 ranks) of the scale bench (lab/scale.py)")
    parser.add_argument("--scale-steady-s", type=float, default=20,
                        help="how long the scale bench watches each fleet steady")
    parser.add_argument("--scale-look-s", type=float, default=0.5,
                        help="how often the scale bench's hosts' agents look (the product: "
                             "0.1 s; 2 CPUs cannot step 512 agents that often)")
    parser.add_argument("--scale-step-s", type=float, default=5,
                        help="the scale bench's stand-in ranks' step (a collective each)")
    parser.add_argument("--scale-parts", nargs="*", choices=list(scale.PARTS),
                        default=list(scale.PARTS),
                        help="what the scale bench runs per size (without fail, the other "
                             "parts are added to the size's earlier figures)")
    parser.add_argument("--report-sizes", type=int, nargs="*", default=[16, 128, 512],
                        help="hosts of the records report_scale renders")
    parser.add_argument("--health-size", type=int, default=8, help="lab hosts of health_cost")
    parser.add_argument("--recording-sizes", default="64K,4M",
                        help="all_reduce sizes of recording_cost")
    parser.add_argument("--ckpt-window-s", type=float, default=60,
                        help="how long checkpoint_watch watches each directory")
    parser.add_argument("--accuracy-trials", type=int, default=5,
                        help="injected trials per fault class of the accuracy bench")
    parser.add_argument("--accuracy-clean", type=int, default=20,
                        help="clean runs (training, preflight, collective test in turn) of the "
                             "accuracy bench, routine kernel lines injected")
    parser.add_argument("--accuracy-classes", nargs="*", default=[],
                        choices=list(accuracy.CLASSES), metavar="CLASS",
                        help="only these fault classes of the accuracy bench (default: all)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    # 20 iterations time a 20-400 ms window, shorter than the noise of 2 busy CPUs.
    parser.add_argument("--busbw-iters", type=int, default=100,
                        help="timed iterations per size, both sides of harness_overhead")
    args = parser.parse_args()
    args.only = {m for name in args.only for m in GROUPS.get(name, [name])}
    # SIGTERM or SIGHUP unwinds like Ctrl-C: the labs and fleets a bench started come down.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: sys.exit(128 + signum))
    try:
        old = json.loads((args.out / "results.json").read_text())
    except (OSError, ValueError):
        old = None
    results = {"machine": machine()}
    with tempfile.TemporaryDirectory(prefix="torchfleet-bench-") as tmp:
        for name in [b for b in BENCHES if b in args.only]:
            if name in NEEDS_ROOT and os.geteuid() != 0:
                print("skip %s: needs root for the lab" % name)
                continue
            print("running %s ..." % name, flush=True)
            results[name] = BENCHES[name](args, Path(tmp))
            write(args.out, merge(old, results, BENCHES))  # a later measure's crash keeps this one
    print(markdown(merge(old, results, BENCHES)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
