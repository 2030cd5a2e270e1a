"""The built-in DDP workload resumes from its checkpoint: a run stopped after step 4 and
started again ends with the very parameters of a run that was never stopped (real torchrun,
two ranks, gloo)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import WORKLOADS
from lab.ports import free_port

# slow: docs/testing.md's tiers (bash tests/run --all, or --touching a source it covers)
pytestmark = [pytest.mark.integration, pytest.mark.slow]
WORKLOAD = WORKLOADS / "ddp_train.py"


def train(out: Path, *args: str) -> dict:
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
            "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
            str(WORKLOAD), "--width", "8", "--batch", "8", "--log-every", "1", *args]
    env = {"PATH": "/usr/bin:/bin", "TORCHFLEET_OUT_DIR": str(out), "TORCHFLEET_BACKEND": "gloo",
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    assert len(results) == 2 and all(r["checksums_agree"] for r in results)
    return dict(results[0], log=proc.stdout)


def test_a_resumed_run_ends_with_the_parameters_of_one_never_stopped(tmp_path):
    whole = train(tmp_path / "whole", "--steps", "8")
    ckpt = tmp_path / "ckpt"
    first = train(tmp_path / "first", "--steps", "4", "--checkpoint-dir", str(ckpt),
                  "--checkpoint-every", "2")
    assert first["resumed_from_step"] == 0 and (ckpt / "ddp_train.pt").is_file()
    again = train(tmp_path / "again", "--steps", "8", "--checkpoint-dir", str(ckpt))
    assert again["resumed_from_step"] == 4
    assert "resuming from the checkpoint of step 4" in again["log"]
    assert "step 4/8" not in again["log"] and "step 5/8" in again["log"]
    assert again["checksum"] == whole["checksum"] != first["checksum"]
