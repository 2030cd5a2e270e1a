"""A Slurm allocation is the inventory: a real slurmctld and a slurmd in each of 3 lab nodes
(lab/slurm.py), jobs made with salloc and sbatch, preflight and train run on them
over SSH. node0 is held by another job, so the allocation is node1, node2: order and
membership come from Slurm, not from the first N lab nodes. A lab of its own for this module."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import torchfleet
from tests.conftest import run_processes
from lab.slurm import TOOLS, SlurmLab
from torchfleet.paths import ansible_root
from torchfleet import ansible_cli

pytestmark = [pytest.mark.lab, pytest.mark.skipif(
    not all(map(shutil.which, TOOLS)),
    reason="the Slurm lab needs slurm-wlm and munge (.ci/run installs them)")]
ROOT = ansible_root()
SBATCH = ROOT / "examples" / "slurm" / "train.sbatch"
BIN = str(Path(sys.executable).parent)


@pytest.fixture(scope="module")
def slurm(lab):
    """A Slurm cluster of the module's 3-node lab; the lab's removal ends its daemons."""
    cluster = SlurmLab(lab).start()
    # The user's side of it: inventory/slurm.yml as shipped, their connection settings in
    # group_vars beside it.
    shutil.copy(ROOT / "inventory" / "slurm.yml", lab.root / "slurm.yml")
    (lab.root / "group_vars").mkdir()
    (lab.root / "group_vars" / "nodes.yml").write_text(yaml.safe_dump(lab.node_vars()))
    cluster.allocate("-J", "other-user", "-w", "node0")  # held for the whole module
    return cluster


def slurm_env(cluster, job_id=None):
    env = dict(cluster.env, PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    env.pop("SLURM_JOB_ID", None)
    if job_id:
        env["SLURM_JOB_ID"] = job_id
    return env


def test_inventory_is_the_jobs_nodes_in_slurm_order_with_its_gpus(slurm):
    job = slurm.allocate("-N", "2", "--gres=gpu:2")
    try:
        out = subprocess.run([*ansible_cli.command("ansible-inventory"), "-i",
                              str(slurm.lab.root / "slurm.yml"), "--list"], cwd=ROOT,
                             env=slurm_env(slurm, job), capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        inv = json.loads(out.stdout)
        assert inv["nodes"]["hosts"] == ["node1", "node2"]
        hostvars = inv["_meta"]["hostvars"]
        for name in ("node1", "node2"):
            # Marked unsafe (scontrol's text is never templated), hence the wrapper.
            assert hostvars[name]["ansible_host"] == {
                "__ansible_unsafe": slurm.lab.node(name).address}
            assert hostvars[name]["nproc_per_node"] == 2  # --gres=gpu:2
            assert hostvars[name]["ansible_user"] == "root"  # from the user's group_vars
    finally:
        slurm.run("scancel", job)


def test_sbatch_example_trains_on_the_allocation_and_the_job_ends_as_the_play(slurm, tmp_path):
    def sbatch(name, *extra):
        out = slurm.run(
            "sbatch", "--parsable", "-J", name, "-N", "2", "--gres=gpu:2", "--chdir", str(ROOT),
            "--output", str(tmp_path / (name + ".out")),
            "--export", "ALL,PATH=%s,TORCHFLEET_INVENTORY=%s" % (
                slurm_env(slurm)["PATH"], slurm.lab.root / "slurm.yml"),
            str(SBATCH), *extra).stdout
        return out.strip().split(";")[0]

    run_dir = tmp_path / "run"
    ok = sbatch("train", "-e", "train_steps=5", "-e", "run_dir=%s" % run_dir)
    job = slurm.wait_job_end(ok, timeout_s=300)
    log = (tmp_path / "train.out").read_text()
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), log[-3000:]
    assert job["NodeList"] == "node[1-2]"
    report = json.loads((run_dir / "train.json").read_text())
    # The batch script ran on node1, the job's first node: the master, node_rank 0, and
    # nproc_per_node came from the job's GPUs.
    assert [(h["host"], h["node_rank"], h["ranks"]) for h in report["hosts"]] == [
        ("node1", 0, [0, 1]), ("node2", 1, [2, 3])]
    assert report["ok"] is True
    assert run_processes(report["run_id"]) == []

    # A play that fails makes a failed job, with the play's exit status.
    bad = sbatch("too-many", "-e", "nnodes=3", "-e", "run_dir=%s" % (tmp_path / "bad"))
    job = slurm.wait_job_end(bad, timeout_s=120)
    log = (tmp_path / "too-many.out").read_text()
    assert job["JobState"] == "FAILED" and job["ExitCode"] != "0:0", job
    assert "world.size" in log and "nnodes=3" in log, log[-3000:]
    assert not (tmp_path / "bad" / "logs").exists()  # nothing was started


def test_an_ended_job_is_named_before_anything_starts(slurm, tmp_path, monkeypatch):
    job = slurm.allocate("-N", "1")
    slurm.run("scancel", job)
    assert slurm.wait_job_end(job, timeout_s=30)["JobState"] == "CANCELLED"
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    monkeypatch.setenv("SLURM_JOB_ID", job)
    result = torchfleet.preflight(slurm.lab.root / "slurm.yml", runs_root=tmp_path)
    assert not result.ok
    [check] = result.failures
    assert check.id == "ansible.error"
    assert "Slurm job %s is CANCELLED, not RUNNING" % job in check.detail
    assert list((tmp_path / result.run_id).glob("*.json")) == []
