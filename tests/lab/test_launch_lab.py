"""train.yml across lab nodes over real SSH, torchrun over real TCP between distinct
addresses, each node binding its own eth0. (collective.yml across two lab nodes is molecule's
lab scenario, tests/scenarios.)

The built-in workload trains with real torch; a torchrun killed on one node runs
steps_notorch.py (tests/fixtures/README.md): the kill, its report and fail-fast are the control
plane's. A kill with torch ranks, whose peers lose their gloo connections, is
test_reliability_lab's killed agent."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.lab.conftest import runs_root
from tests.conftest import FIXTURES, run_processes, until_stopped
from tests.integration.playbook import BIN, ROOT, Run, playbook
from lab import netns as labmod
from torchfleet import ansible_cli

pytestmark = pytest.mark.lab
REMOTE_RUNS = runs_root(Path(__file__).stem)  # its lab's remote_runs_root


def exit_barrier_race_removed(log):
    """torchrun's log less the exception its agent logs when the master's torchrun closes the
    store as this host leaves the exit barrier (pytorch/pytorch#69520, after a run that ended
    ok): every line logged from where that exception was logged (pid and source line)."""
    where = {line.split("] ", 1)[0].split(" ", 2)[-1] for line in log.splitlines()
             if "] Error waiting on exit barrier" in line}
    return "\n".join(line for line in log.splitlines()
                     if line.split("] ", 1)[0].split(" ", 2)[-1] not in where)


def test_train_across_two_lab_nodes(healthy_lab, tmp_path):
    run = playbook("train.yml", tmp_path, "-e", "nnodes=2", "-e", "train_steps=40",
                   inventory=healthy_lab.inventory)
    assert run.rc == 0, run.out
    report = run.report("train.json")
    node0, node1 = healthy_lab.nodes[:2]
    assert report["ok"] and report["settings"]["master_addr"] == node0.address
    # Each rank ran inside its own node: its own UTS hostname, rendezvous over the lab network.
    assert [(r["host"], r["rank"]) for r in report["ranks"]] == [("node0", 0), ("node1", 1)]
    torchrun_log = (run.run_dir / "logs" / "node1" / "torchrun.log").read_text()
    assert "Traceback" not in exit_barrier_race_removed(torchrun_log)
    pidfile = json.loads(next(REMOTE_RUNS.glob("%s/node1/torchrun.pid" % report["run_id"]))
                         .read_text())
    assert "--local-addr" in pidfile["argv"]
    assert pidfile["argv"][pidfile["argv"].index("--local-addr") + 1] == node1.address
    assert pidfile["argv"][pidfile["argv"].index("--rdzv-endpoint") + 1] == "%s:29500" % (
        node0.address)


def test_torchrun_killed_on_one_node_stops_the_others(healthy_lab, tmp_path):
    started = time.time()
    proc = subprocess.Popen(
        [*ansible_cli.command("ansible-playbook"), "train.yml", "-i", str(healthy_lab.inventory),
         "-e", "nnodes=2", *until_stopped(FIXTURES / "scripts" / "steps_notorch.py"),
         "-e", "run_dir=%s" % (tmp_path / "run")],
        cwd=ROOT, env=dict(os.environ, PATH="%s:%s" % (BIN, os.environ["PATH"])),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        pidfile = None
        while time.monotonic() < deadline and pidfile is None:
            found = list(REMOTE_RUNS.glob("*/node1/torchrun.pid"))
            fresh = [f for f in found if f.stat().st_mtime >= started]
            pidfile = fresh[0] if fresh else None
            time.sleep(0.5)
        assert pidfile is not None
        # Into training: a rank on node1 has logged a step.
        while time.monotonic() < deadline and not any(
                "step " in log.read_text(errors="replace")
                for log in pidfile.parent.glob("logs/**/stdout.log")):
            time.sleep(0.2)
        os.kill(json.loads(pidfile.read_text())["pid"], signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    run = Run(proc.returncode, out, tmp_path / "run")
    assert run.rc != 0
    report = run.report("train.json")
    assert report["first_failure"]["host"] == "node1"
    assert "node1" in run.out and "-9" in run.out
    run_id = report["run_id"]
    assert run_processes(run_id) == []
    assert (run.run_dir / "logs" / "node0" / "torchrun.log").exists()


def test_taking_down_a_lab_that_is_not_there_leaves_the_others(healthy_lab, tmp_path):
    """molecule's destroy runs `down` before its lab exists: the labs running beside it (this
    one) keep every namespace."""
    before = labmod.our_namespaces(healthy_lab.tag)
    proc = subprocess.run([sys.executable, "-m", "lab", "--dir", str(tmp_path / "none"), "down"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "no lab at" in proc.stdout, proc.stdout + proc.stderr
    assert labmod.our_namespaces(healthy_lab.tag) == before and len(before) == 4
