"""Built-in training workload: a small DDP model on synthetic data.

Every rank trains on its own deterministic batches; DDP averages the gradients, so at the end
every rank must hold the very same parameters. Each rank writes a checksum of its parameters
and compares it with every other rank's: the run proves gradients were synchronised.
"""
from __future__ import annotations

import argparse
import hashlib
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import _rank


def checksum(model) -> str:
    """sha256 over every parameter's exact float64 values (no numpy needed)."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(repr(p.detach().to("cpu", torch.float64).flatten().tolist()).encode())
    return digest.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--log-every", type=int, default=25)
    args = parser.parse_args()

    backend, device, init_s = _rank.init()
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # same initial weights everywhere; DDP also broadcasts them
    model = torch.nn.Sequential(torch.nn.Linear(16, args.width), torch.nn.Tanh(),
                                torch.nn.Linear(args.width, 1)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda"
                                  else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1000 + rank)  # different data on every rank
    true_w = torch.linspace(-1, 1, 16)
    start = time.perf_counter()
    loss = torch.tensor(0.0)
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, 16, generator=data).to(device)
        y = (x.cpu() @ true_w).unsqueeze(1).to(device)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        if step % args.log_every == 0 or step == args.steps:
            _rank.log("step %d/%d loss %.5f" % (step, args.steps, loss.item()))
    train_s = time.perf_counter() - start

    mine = checksum(model)
    # The digest's bytes as a tensor: all_gather_object would need numpy on every host.
    digest = torch.tensor(list(bytes.fromhex(mine)), dtype=torch.int32, device=device)
    everyone = torch.empty(n * digest.numel(), dtype=torch.int32, device=device)
    dist.all_gather_into_tensor(everyone, digest)
    agree = bool((everyone.view(n, -1) == digest).all())
    _rank.write_result(dict(_rank.identity(), kind="train", backend=backend, device=str(device),
                            init_s=round(init_s, 6), train_s=round(train_s, 6),
                            steps=args.steps, final_loss=float(loss.item()), checksum=mine,
                            checksums_agree=agree, ok=agree))
    # Every rank past its last collective before any tears its process group down: a gloo
    # peer that closed its pairs under a rank still tearing down was seen to abort it (SIGABRT).
    dist.barrier()
    dist.destroy_process_group()
    _rank.log("done: parameter checksum %s, %s across %d ranks"
              % (mine[:16], "identical" if agree else "DIFFERENT", n))
    return 0 if agree else 1


if __name__ == "__main__":
    _rank.exit_now(main())
