"""A Slurm allocation is the inventory: a real slurmctld and a slurmd in each of 4 lab nodes
(lab/slurm.py), jobs made with salloc and sbatch, preflight and train run on them
over SSH. node0 is held by another job, so an allocation of 2 is node1, node2: order and
membership come from Slurm, not from the first N lab nodes. A lab of its own for this module."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import torchfleet
from ansible_collections.torchfleet.fleet.plugins.inventory import slurm as slurm_inventory
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import procs
from tests.conftest import FIXTURES, run_processes
from tests.lab.conftest import runs_root
from lab.slurm import TOOLS, SlurmLab
from torchfleet.paths import ansible_root
from torchfleet import ansible_cli

# slow: docs/testing.md's tiers (bash tests/run --all, or --touching a source it covers)
pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.skipif(
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


def steps(logs):
    """The newest step any rank under logs printed."""
    found = [int(m) for p in logs.glob("**/stdout.log")
             for m in re.findall(r"step ([0-9]+)", p.read_text(errors="replace"))]
    return max(found, default=0)


def test_a_fatal_error_on_a_device_not_the_runs_is_a_warning_and_the_run_goes_on(slurm,
                                                                                tmp_path):
    """An NVMe drive's uncorrected fatal AER in node2's kernel log during the run (issue 57,
    item 5: on 0303260 it ended the run and drained node2): the run ends as it would have, and
    the error is a warning on node2 that says it is not a device of the run."""
    job = slurm.allocate("-N", "2")
    kmsg = tmp_path / "kmsg"
    kmsg.mkdir()
    stop_file = tmp_path / "stop"
    run_id, run_dir = "nvme-%d" % os.getpid(), tmp_path / "run"
    proc = subprocess.Popen(
        [*ansible_cli.command("ansible-playbook"), "train.yml", "-i",
         str(slurm.lab.root / "slurm.yml"), "-e", "nnodes=2", "-e", "nproc_per_node=1",
         "-e", "script=%s" % (FIXTURES / "scripts" / "steps_until_file.py"),
         "-e", json.dumps({"script_args": [str(stop_file)]}),
         "-e", "kernel_log=%s/{{ inventory_hostname }}.log" % kmsg,
         "-e", "run_id=%s" % run_id, "-e", "run_dir=%s" % run_dir], cwd=ROOT,
        env=slurm_env(slurm, job), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        stdin=subprocess.DEVNULL)
    try:
        logs = runs_root(Path(__file__).stem) / run_id
        end = time.monotonic() + 240
        while steps(logs) < 3:
            assert time.monotonic() < end and proc.poll() is None, proc.poll()
            time.sleep(0.1)
        # aer-fatal.returnn.txt's fatal line with an NVMe drive's address in it.
        with open(kmsg / "node2.log", "a") as f:
            f.write("[74880.000001] nvme 0000:c1:00.0: AER: Multiple Uncorrected (Fatal) error "
                    "received: 0000:c1:00.0\n")
        # 30 more steps of 0.2 s: several of the agents' beats, each of which reads the log.
        seen = steps(logs)
        while steps(logs) < seen + 30:
            assert time.monotonic() < end and proc.poll() is None, proc.poll()
            time.sleep(0.1)
        stop_file.touch()
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-4000:]
        report = json.loads((run_dir / "train.json").read_text())
        assert report["ok"] is True and report["drain"] == [], report["verdict"]
        (warning,) = [c for c in report["checks"] if c["id"] == "run.hardware"]
        assert (warning["host"], warning["severity"]) == ("node2", "warning"), warning
        assert "not a device of the run" in warning["detail"], warning
        assert run_processes(run_id) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        slurm.run("scancel", job)


def test_a_gpu_fallen_off_the_bus_is_the_cause_its_host_is_replaced_and_drained(slurm,
                                                                                tmp_path):
    """The cascade that hid the cause (issue 48): node2's rank stops (SIGSTOP: a GPU fallen off
    the bus leaves its rank hung in the driver) and the kernel writes Xid 79, a real line
    (tests/fixtures/kmsg/xid79-aer.gpu-burn.txt) delivered to node2's kernel_log file, never
    to this machine's own log. The verdict names node2 and the Xid, not a peer's timeout; the
    restart replaces node2 with the spare node3; node2 is drained in Slurm with the evidence.
    Before the Xid, in the same write (issue 57): an NVMe drive's uncorrected fatal AER, not a
    device of the run (a warning, not the cause), and a flood of 300 corrected AER lines (one
    warning with its count; the Xid after it still read)."""
    job = slurm.allocate("-N", "3")
    kmsg = tmp_path / "kmsg"
    kmsg.mkdir()
    stop_file = tmp_path / "stop"  # the run ends cleanly once it exists (the restart's run)
    run_id, run_dir = "xid-%d" % os.getpid(), tmp_path / "run"
    env = slurm_env(slurm, job)
    proc = subprocess.Popen(
        [*ansible_cli.command("ansible-playbook"), "train.yml", "-i",
         str(slurm.lab.root / "slurm.yml"), "-e", "nnodes=2", "-e", "nproc_per_node=1",
         "-e", "spares=1", "-e", "max_restarts=1", "-e", "slurm_drain=true",
         "-e", "script=%s" % (FIXTURES / "scripts" / "steps_until_file.py"),
         "-e", json.dumps({"script_args": [str(stop_file)]}),
         "-e", "kernel_log=%s/{{ inventory_hostname }}.log" % kmsg,
         "-e", "run_id=%s" % run_id, "-e", "run_dir=%s" % run_dir], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    try:
        logs = runs_root(Path(__file__).stem) / run_id / "node2" / "logs"
        end = time.monotonic() + 240
        while not any("step 3" in p.read_text(errors="replace")
                      for p in logs.glob("**/stdout.log")):
            assert time.monotonic() < end and proc.poll() is None, proc.poll()
            time.sleep(0.1)
        (rank,) = [pid for pid in procs.run_processes(run_id)
                   if procs.environ(pid).get(b"TORCHFLEET_HOST") == b"node2"
                   and b"LOCAL_RANK" in procs.environ(pid)
                   and b"torch.distributed.run" not in procs.cmdline(pid).encode()]
        os.kill(rank, signal.SIGSTOP)
        recorded = (FIXTURES / "kmsg" / "xid79-aer.gpu-burn.txt").read_text().splitlines()
        xid79, corrected = recorded[-1], recorded[0]
        # aer-fatal.returnn.txt's fatal line with an NVMe drive's address in it.
        nvme = ("[74880.000001] nvme 0000:c1:00.0: AER: Multiple Uncorrected (Fatal) error "
                "received: 0000:c1:00.0")
        with open(kmsg / "node2.log", "a") as f:
            f.write("\n".join([nvme] + [corrected] * 300 + [xid79]) + "\n")
        stop_file.touch()
        out, _ = proc.communicate(timeout=300)
        report = json.loads((run_dir / "train.json").read_text())
        assert proc.returncode == 0, out[-4000:]
        assert report["verdict"].startswith(
            "train ok after 1 restart: node2 run.hardware, replaced by node3"), report["verdict"]
        first = report["attempts"][0]
        assert first["first_failure"].startswith(
            "node2 0000:02:00.0: Xid 79, GPU has fallen off the bus, at "), first
        # (Its rank was stopped by the abort, so no rank is said to have died of it.)
        assert first["first_failure"].endswith(
            "; every other failure follows from it; drain node2")
        assert report["drain"] == [{"host": "node2", "reason": "run.hardware",
                                    "evidence": xid79.split("] ", 1)[1]}]
        (state,) = list(run_dir.glob("**/attempt_0/run_state.json")) or list(
            runs_root(Path(__file__).stem).glob("%s/**/attempt_0/run_state.json" % run_id))
        events = {(e["kind"], e["code"], e["pci_bus"]): e for e in json.loads(
            state.read_text())["events"] if e["host"] == "node2"}
        drive = events[("aer", "Uncorrected (Fatal)", "0000:c1:00.0")]
        assert drive["fatal"] is False and drive["what"].endswith(": not a device of the run")
        assert events[("aer", "Corrected", "0000:00:02.0")]["count"] > 1, events
        shown = slurm.run("scontrol", "-o", "show", "node", "node2").stdout
        assert "DRAIN" in slurm_inventory.fields(shown)["State"]
        assert "Reason=torchfleet %s: run.hardware: NVRM: Xid (PCI:0000:02:00): 79" % run_id \
            in shown, shown
        assert run_processes(run_id) == []
        # `torchfleet hosts release` resumes a node torchfleet drained, and only such a node
        # (issue 65): node1 drained by an administrator stays drained.
        slurm.run("scontrol", "update", "nodename=node1", "state=drain", "reason=maintenance")
        said = {}
        for host in ("node2", "node1"):
            done = subprocess.run([os.path.join(BIN, "torchfleet"), "hosts", "release", host,
                                   "--runs-root", str(tmp_path)], env=env, text=True,
                                  capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
            assert done.returncode == 0, done.stderr
            said[host] = done.stdout
        assert "node2 resumed in Slurm (torchfleet had drained it)" in said["node2"]
        assert "node1 stays drained in Slurm: its drain is not torchfleet's" in said["node1"]
        state = {h: slurm_inventory.fields(slurm.run("scontrol", "-o", "show", "node", h)
                                           .stdout)["State"] for h in ("node1", "node2")}
        assert "DRAIN" not in state["node2"] and "DRAIN" in state["node1"], state
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for host in ("node1", "node2"):  # (one not drained answers an error: no matter)
            slurm.run("scontrol", "update", "nodename=%s" % host, "state=resume", check=False)
        slurm.run("scancel", job)
