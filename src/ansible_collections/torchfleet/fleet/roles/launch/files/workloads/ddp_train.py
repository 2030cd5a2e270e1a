"""Built-in training workload: a small DDP model on synthetic data.

Every rank trains on its own deterministic batches; DDP averages the gradients, so at the end
every rank must hold the very same parameters. Each rank writes a checksum of its parameters
and compares it with every other rank's: the run proves gradients were synchronised.

With --checkpoint-dir (storage every host sees) rank 0 saves the model, the optimizer and the
step every --checkpoint-every steps, and a run started again resumes from the last one. A
step's batch depends only on the rank and the step, so a resumed run ends with the very
parameters of a run that was never stopped.
"""
from __future__ import annotations

import argparse
import hashlib
import os
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


CHECKPOINT = "ddp_train.pt"


def batch(rank: int, step: int, size: int):
    """Step `step`'s batch on rank `rank`: the same whatever step the run started from."""
    return torch.randn(size, 16, generator=torch.Generator().manual_seed(
        1_000_003 * (rank + 1) + step))


def save(directory: str, model, opt, step: int) -> None:
    """Atomically: a rank killed while saving leaves the previous checkpoint whole."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, CHECKPOINT)
    torch.save({"step": step, "model": model.state_dict(), "optimizer": opt.state_dict()},
               path + ".tmp")
    os.replace(path + ".tmp", path)


def load(directory: str) -> dict | None:
    path = os.path.join(directory, CHECKPOINT)
    if not os.path.isfile(path):
        return None
    return torch.load(path, map_location="cpu", weights_only=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--checkpoint-dir", default="",
                        help="save here and resume from here (storage every host sees)")
    parser.add_argument("--checkpoint-every", type=int, default=50)
    args = parser.parse_args()

    backend, device, init_s = _rank.init()
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # same initial weights everywhere; DDP also broadcasts them
    model = torch.nn.Sequential(torch.nn.Linear(16, args.width), torch.nn.Tanh(),
                                torch.nn.Linear(args.width, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    state = load(args.checkpoint_dir) if args.checkpoint_dir else None
    first = 0
    if state is not None:  # before DDP, which broadcasts rank 0's parameters
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        first = int(state["step"])
    # Every rank must resume from the same step: a checkpoint_dir that is not shared storage
    # would resume each host from its own.
    steps = torch.tensor([first], dtype=torch.int64, device=device)
    seen = torch.empty(n, dtype=torch.int64, device=device)
    dist.all_gather_into_tensor(seen, steps)
    if len(set(seen.tolist())) > 1:
        _rank.log("checkpoint steps differ across ranks (%s): --checkpoint-dir %s must be "
                  "storage every host sees" % (seen.tolist(), args.checkpoint_dir))
        dist.destroy_process_group()
        return 1
    attempt = _rank.env_int("TORCHFLEET_ATTEMPT", 0)
    if first:
        _rank.log("attempt %d: resuming from the checkpoint of step %d in %s"
                  % (attempt, first, args.checkpoint_dir))
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda"
                                  else None)
    true_w = torch.linspace(-1, 1, 16)
    start = time.perf_counter()
    loss = torch.tensor(0.0)
    for step in range(first + 1, args.steps + 1):
        x = batch(rank, step, args.batch).to(device)  # different data on every rank
        y = (x.cpu() @ true_w).unsqueeze(1).to(device)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        if step % args.log_every == 0 or step == args.steps:
            _rank.log("step %d/%d loss %.5f" % (step, args.steps, loss.item()))
        if args.checkpoint_dir and rank == 0 and (step % args.checkpoint_every == 0
                                                  or step == args.steps):
            save(args.checkpoint_dir, model, opt, step)
    train_s = time.perf_counter() - start

    mine = checksum(model)
    # The digest's bytes as a tensor: all_gather_object would need numpy on every host.
    digest = torch.tensor(list(bytes.fromhex(mine)), dtype=torch.int32, device=device)
    everyone = torch.empty(n * digest.numel(), dtype=torch.int32, device=device)
    dist.all_gather_into_tensor(everyone, digest)
    agree = bool((everyone.view(n, -1) == digest).all())
    _rank.write_result(dict(_rank.identity(), kind="train", backend=backend, device=str(device),
                            init_s=round(init_s, 6), train_s=round(train_s, 6),
                            steps=args.steps, resumed_from_step=first, attempt=attempt,
                            final_loss=float(loss.item()), checksum=mine,
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
