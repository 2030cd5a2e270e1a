"""guard_ports on the lab: while a run lives, its master's ports and every host's ephemeral
ports answer only the run's hosts; after it, no rule of it is left. The ranks import no torch
(steps_notorch.py): the guard is what is under test, with a listener of the test's own in the
ephemeral range; a guarded run whose gloo ranks talk across hosts through it is
test_detach_lab's first test."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.playbook import BIN, ROOT, Run
from tests.lab.conftest import runs_root
from tests.lab.test_reliability_lab import wait_until
from lab.ports import free_port
from torchfleet import ansible_cli

# slow: docs/testing.md's tiers (bash tests/run --all, or --touching a source it covers)
pytestmark = [pytest.mark.lab, pytest.mark.slow]
REMOTE_RUNS = runs_root(Path(__file__).stem)  # its lab's remote_runs_root
SCRIPT = ROOT / "tests" / "fixtures" / "scripts" / "steps_notorch.py"


def connects(ns, addr, port):
    """Whether a TCP connection from namespace ns to addr:port opens."""
    probe = "import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 3)"
    return subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", probe, addr,
                           str(port)], capture_output=True).returncode == 0


def guard_tables(ns):
    out = subprocess.run(["ip", "netns", "exec", ns, "nft", "list", "tables"],
                         capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "torchfleet_guard_" in line]


def test_guarded_ports_answer_only_the_runs_hosts_and_no_rule_is_left(healthy_lab, tmp_path):
    node0, node1, outsider = healthy_lab.nodes[0], healthy_lab.nodes[1], healthy_lab.nodes[3]
    go, master_port, control_port = tmp_path / "go", free_port(), free_port()
    started = time.time()
    proc = subprocess.Popen(
        [*ansible_cli.command("ansible-playbook"), "train.yml", "-i", str(healthy_lab.inventory),
         "-e", "nnodes=2", "-e", "guard_ports=true", "-e", "master_port=%d" % master_port,
         "-e", "control_port=%d" % control_port, "-e", "script=%s" % SCRIPT,
         "-e", json.dumps({"script_args": [str(go)]}), "-e", "run_dir=%s" % (tmp_path / "run")],
        cwd=ROOT, env=dict(os.environ, PATH="%s:%s" % (BIN, os.environ["PATH"])),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def stepping():
            return sum(1 for p in REMOTE_RUNS.glob("*/node*/logs/*/attempt_0/0/stdout.log")
                       if p.stat().st_mtime >= started and "step" in p.read_text()) == 2

        assert wait_until(stepping, 180), "the run never started"
        assert len(guard_tables(node0.ns)) == 1 and len(guard_tables(node1.ns)) == 1
        for port in (master_port, control_port):
            assert connects(node1.ns, node0.address, port), port
            assert not connects(outsider.ns, node0.address, port), port
        # A listener on node1 in its ephemeral range, as gloo's and NCCL's are: the run's
        # master gets in, the outsider is reset; node1's own connections out still work.
        eph = 45000 + os.getpid() % 10000
        listener = subprocess.Popen(
            ["ip", "netns", "exec", node1.ns, sys.executable, "-c",
             "import socket, time; s = socket.create_server(('0.0.0.0', %d)); "
             "[s.accept() for _ in range(99)]" % eph])
        try:
            assert wait_until(lambda: connects(node0.ns, node1.address, eph), 30)
            assert not connects(outsider.ns, node1.address, eph)
            assert connects(node1.ns, outsider.address, 22)  # its sshd: replies come back
        finally:
            listener.kill()
            listener.wait()
    finally:
        go.touch()
        out, _ = proc.communicate(timeout=240)
    run = Run(proc.returncode, out, tmp_path / "run")
    assert run.rc == 0, run.out[-3000:]
    assert guard_tables(node0.ns) == [] and guard_tables(node1.ns) == []
