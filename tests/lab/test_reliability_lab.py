"""Faults during a run, for real: a node's network cut, the controller interrupted, a stale
torchrun holding the port. Each ends with no process of the run left on any node."""
from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import processes_matching
from tests.integration.playbook import BIN, ROOT, Run, playbook

pytestmark = pytest.mark.lab
REMOTE_RUNS = Path.home() / ".torchfleet" / "runs"


processes_of = processes_matching


def wait_until(predicate, timeout_s, interval_s=0.5):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


def start_long_train(lab, tmp_path, *extra):
    """train.yml with a run that would last hours; returns (process, run id) once it trains."""
    started = time.time()
    proc = subprocess.Popen(
        [str(BIN / "ansible-playbook"), "train.yml", "-i", str(lab.inventory), "-e", "nnodes=2",
         "-e", "train_steps=100000000", "-e", "run_dir=%s" % (tmp_path / "run"), *extra],
        cwd=ROOT, env=dict(os.environ, PATH="%s:%s" % (BIN, os.environ["PATH"])),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def training():
        logs = [p for p in REMOTE_RUNS.glob("*/node*/logs/*/attempt_0/0/stdout.log")
                if p.stat().st_mtime >= started and "step" in p.read_text()]
        return len(logs) == 2

    assert wait_until(training, 180), "the run never started training"
    run_id = next(p for p in REMOTE_RUNS.glob("*/node1/torchrun.pid")
                  if p.stat().st_mtime >= started).parent.parent.name
    return proc, run_id


def test_network_cut_mid_run_names_the_node_and_stops_the_rest(healthy_lab, tmp_path):
    # lost_after_s=10: the mechanism is the same at the default 30 s, the test 20 s shorter.
    proc, run_id = start_long_train(healthy_lab, tmp_path, "-e", "lost_after_s=10")
    healthy_lab.cut_network("node1")
    cut = time.monotonic()
    out, _ = proc.communicate(timeout=240)
    took = time.monotonic() - cut
    run = Run(proc.returncode, out, tmp_path / "run")
    print("network cut -> play exit: %.1f s" % took)
    assert run.rc != 0
    report = run.report("train.json")
    outcomes = {h["host"]: h["outcome"] for h in report["hosts"]}
    assert outcomes["node1"] == "lost", outcomes
    assert "node1" in report["first_failure"]["host"]
    assert ("host.lost", "node1") in {(c["id"], c["host"]) for c in report["checks"]}
    assert (run.run_dir / "logs" / "node0" / "torchrun.log").exists()
    # node0 was stopped by its agent; node1, cut off, stops itself once the master is silent.
    assert wait_until(lambda: not processes_of(run_id), 90), processes_of(run_id)


def test_interrupted_controller_leaves_nothing_running(healthy_lab, tmp_path):
    proc, run_id = start_long_train(healthy_lab, tmp_path)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground process group
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    stop = playbook("stop.yml", tmp_path / "stop", "-e", "run_id=%s" % run_id,
                    inventory=healthy_lab.inventory)
    assert stop.rc == 0, stop.out
    assert "stopped run(s) %s" % run_id in stop.out or "nothing of torchfleet" in stop.out
    assert wait_until(lambda: not processes_of(run_id), 60), processes_of(run_id)


def test_a_stale_torchrun_on_the_port_is_named_and_train_refuses(healthy_lab, tmp_path):
    node0 = healthy_lab.nodes[0]
    # An earlier run's torchrun, started by hand over ssh, still waiting for its peers.
    remote = " ".join(shlex.quote(a) for a in [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "%s:29500" % node0.address,
        "--rdzv-id", "stale-run", "--local-addr", node0.address,
        str(ROOT / "src" / "torchfleet" / "workloads" / "collective.py")])
    stale = subprocess.Popen(
        ["ssh", "-i", str(healthy_lab.root / "keys" / "id_lab"), "-o", "IdentitiesOnly=yes",
         "-o", "UserKnownHostsFile=%s" % (healthy_lab.root / "known_hosts"),
         "root@" + node0.address, remote],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        def holds_port():
            try:
                socket.create_connection((node0.address, 29500), timeout=1).close()
                return True
            except OSError:
                return False

        assert wait_until(holds_port, 60)
        run = playbook("train.yml", tmp_path, "-e", "nnodes=2", inventory=healthy_lab.inventory)
        assert run.rc != 0
        assert run.failing() == [("port.in_use", "node0")]
        (check,) = [c for c in run.report()["checks"] if c["id"] == "port.in_use"]
        assert "torch.distributed.run" in check["detail"] and "pid" in check["detail"]
        assert "Start this host's agent" not in run.out
    finally:
        os.killpg(stale.pid, signal.SIGKILL)
        stale.wait()
