"""What every torchfleet workload does on its rank: join the group, check the world, report.

Shipped beside each workload into the run directory on the host, and imported from there.
"""
from __future__ import annotations

import datetime
import inspect
import json
import os
import socket
import sys
import time


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.strip() else default


def init():
    """Join the process group with a short timeout and check the world size.

    torchrun silently accepts a smaller world when one host starts fewer processes, so the
    size torchfleet expects (TORCHFLEET_EXPECT_WORLD_SIZE) is asserted here.
    """
    import torch
    import torch.distributed as dist

    backend = os.environ.get("TORCHFLEET_BACKEND") or (
        "nccl" if torch.cuda.is_available() else "gloo")
    timeout = datetime.timedelta(seconds=env_int("TORCHFLEET_COLLECTIVE_TIMEOUT_S", 60))
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    start = time.perf_counter()
    # With NCCL the process group is bound to this rank's GPU: barrier() and the first
    # collective would otherwise guess the device (torch warns; a wrong guess hangs).
    bound = {}
    if backend == "nccl" and "device_id" in inspect.signature(dist.init_process_group).parameters:
        bound["device_id"] = device  # torch >= 2.3
    dist.init_process_group(backend, timeout=timeout, **bound)
    expected = env_int("TORCHFLEET_EXPECT_WORLD_SIZE", 0)
    if expected and dist.get_world_size() != expected:
        raise SystemExit("rank %d: WORLD_SIZE is %d but torchfleet started %d processes; a host "
                         "started fewer processes than nproc_per_node"
                         % (dist.get_rank(), dist.get_world_size(), expected))
    return backend, device, time.perf_counter() - start


def sync(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def identity() -> dict:
    return {
        "rank": env_int("RANK", 0), "local_rank": env_int("LOCAL_RANK", 0),
        "world_size": env_int("WORLD_SIZE", 1), "node_rank": env_int("GROUP_RANK", 0),
        "host": os.environ.get("TORCHFLEET_HOST") or socket.gethostname(),
        "hostname": socket.gethostname(), "pid": os.getpid(),
    }


def write_result(result: dict) -> str:
    """Write this rank's JSON result into TORCHFLEET_OUT_DIR (or the working directory)."""
    out_dir = os.environ.get("TORCHFLEET_OUT_DIR") or os.getcwd()
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "rank-%05d.json" % result["rank"])
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path


def log(message: str) -> None:
    print("[rank %s] %s" % (os.environ.get("RANK", "?"), message), flush=True)
    sys.stdout.flush()


def exit_now(code: int) -> None:
    """End the rank without the interpreter's teardown. Every result is written and the process
    group destroyed by then; under torchrun's static rendezvous gloo's threads were seen aborting
    the process (SIGABRT, "terminate called without an active exception") during that teardown,
    which turned a finished run into a failed one."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
