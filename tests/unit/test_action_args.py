"""The action plugins validate their arguments against the module's spec (plus their own),
before doing anything: a wrong or missing argument fails the task naming it."""
from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import ROOT
from torchfleet import ansible_cli



def adhoc(module, args):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([*ansible_cli.command("ansible"), "localhost", "-m", "torchfleet.fleet." + module, "-a", args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("module, args, named", [
    ("torchrun_watch", "run_id=r1", "run_dir"),
    ("torchrun_watch", "run_dir=/nonexistent run_id=r1 poll_s=soon", "poll_s"),
    ("torchrun_watch", "run_dir=/nonexistent run_id=r1 pol_s=5", "pol_s"),
    ("rank_results", "max_log_bytes=1", "run_dir"),
    ("run_summary", "kind=train run_id=r1 hosts=a world_size=two", "world_size"),
])
def test_a_wrong_argument_fails_the_task_naming_it(module, args, named):
    rc, out = adhoc(module, args)
    assert rc != 0
    assert named in out and ("missing required" in out or "Unsupported parameters" in out
                             or "cannot be converted" in out or "not a valid" in out), out[-2000:]
