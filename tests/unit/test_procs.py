"""Finding and stopping a run's processes: never a process that is not the run's."""
from __future__ import annotations

import subprocess

from ansible_collections.torchfleet.fleet.plugins.module_utils.run.procs import run_processes, stop_run


def test_run_processes_ignores_a_recycled_pid():
    bystander = subprocess.Popen(["sleep", "30"])
    try:
        assert run_processes("some-run", bystander.pid) == []
        assert stop_run("some-run", bystander.pid, grace_s=0.1) == {"signalled": [], "killed": []}
        assert bystander.poll() is None
    finally:
        bystander.kill()


def test_stop_run_ends_a_process_tree_marked_with_the_run_id():
    env = {"TORCHFLEET_RUN_ID": "r-1", "TORCHFLEET_HOST": "node0", "PATH": "/usr/bin:/bin"}
    orphan = subprocess.Popen(["sleep", "30"], env=env)
    other_host = subprocess.Popen(["sleep", "30"], env=dict(env, TORCHFLEET_HOST="node1"))
    try:
        assert run_processes("r-1", None, "node0") == [orphan.pid]
        result = stop_run("r-1", None, grace_s=0.1, host="node0")
        assert orphan.wait(timeout=5) is not None and orphan.pid in result["signalled"]
        assert other_host.poll() is None
    finally:
        orphan.kill()
        other_host.kill()
