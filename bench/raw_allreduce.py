"""The baseline for the collective test's busbw: a bare torch.distributed all_reduce loop.

    torchrun ... bench/raw_allreduce.py --sizes 1M,16M --iters 20 --warmup 5 --out FILE
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1M,16M")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    n, rank = dist.get_world_size(), dist.get_rank()
    units = {"K": 1 << 10, "M": 1 << 20}
    results = []
    for text in args.sizes.split(","):
        size = int(text[:-1]) * units[text[-1]]
        buf = torch.ones(size // 4)
        for _ in range(args.warmup):
            dist.all_reduce(buf)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(buf)
        elapsed = (time.perf_counter() - start) / args.iters
        results.append({"size_bytes": size, "busbw_gbs": size / elapsed / 1e9 * 2 * (n - 1) / n})
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
