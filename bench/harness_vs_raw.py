"""The collective test's busbw against a bare torch.distributed all_reduce loop, side by side in
the same processes: round after round, the harness's measure() (collective.py: warm-up, the
checked run, barrier, timed loop) and the raw loop at the same size, their order alternating,
so a busy moment of the machine weighs on both. Rank 0 writes every round's ratio.

    torchrun ... harness_vs_raw.py --sizes 1M,16M --iters 100 --rounds 7 --out FILE

It runs from a copy beside the workloads (python -m bench harness_overhead makes it), as the
launch role ships them, and imports them as they import each other.
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist

import _rank
import collective


def raw_seconds(size, iters, warmup):
    buf = torch.ones(size // 4)
    for _ in range(warmup):
        dist.all_reduce(buf)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    return (time.perf_counter() - start) / iters


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1M,16M")
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    _, device, _ = _rank.init()
    n, rank = dist.get_world_size(), dist.get_rank()
    ratios = {}
    for text in args.sizes.split(","):
        size = collective.parse_size(text)
        case = collective.Case("all_reduce", size, rank, n, device)
        for k in range(args.rounds):
            order = ("harness", "raw") if k % 2 == 0 else ("raw", "harness")
            seconds = {}
            for which in order:
                if which == "harness":
                    seconds[which], wrong = collective.measure(case, args.warmup, args.iters,
                                                               device)
                    assert wrong == 0
                else:
                    seconds[which] = raw_seconds(case.size_bytes, args.iters, args.warmup)
            # Same bytes and bus factor on both sides: the busbw ratio is the time ratio.
            ratios.setdefault(str(case.size_bytes), []).append(seconds["raw"]
                                                               / seconds["harness"])
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(ratios, f)
    dist.destroy_process_group()
    _rank.exit_now(0)


if __name__ == "__main__":
    main()
