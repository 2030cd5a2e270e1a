"""Faults during a run, for real: a node's network cut, the controller interrupted, a stale
torchrun holding the port. Each ends with no process of the run left on any node.

Where only the control plane is under test (a cut, a kill, a freeze, the lease, Ctrl-C, a
flood, a start that fails), the ranks run steps_notorch.py: the real torchrun starts it through the real agents, but
it imports no torch (tests/fixtures/README.md). Real torch ranks stay where their collectives
are the subject: a cut host whose peers' collectives time out, a killed agent whose peers lose
their gloo connections (a kill, with torch), a rank's own exit while its peers die of the broken
connection (slow_sibling.py)."""
from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.lab.conftest import runs_root
from tests.conftest import WORKLOADS, run_processes, until_stopped
from tests.integration.playbook import BIN, ROOT, Run, playbook
from bench.fuzz_control import Flood
from bench.harness import wait_until  # (the other lab modules import it from here)
from lab.ports import free_port
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import procs
from torchfleet import ansible_cli


pytestmark = pytest.mark.lab
REMOTE_RUNS = runs_root(Path(__file__).stem)  # its lab's remote_runs_root
SCRIPTS = ROOT / "tests" / "fixtures" / "scripts"
NOTORCH = SCRIPTS / "steps_notorch.py"
TORCH_STEPS = SCRIPTS / "steps_until_file.py"  # its ranks all-reduce each step


processes_of = run_processes


def start_long_train(lab, tmp_path, *extra, nnodes=2, inventory=None, runs=REMOTE_RUNS,
                     script=NOTORCH, go=None):
    """train.yml with a run that lasts until it is stopped (tests.conftest.until_stopped), or
    until the file go exists; returns (process, run id) once it trains. script:
    steps_notorch.py (no torch), steps_until_file.py (torch), or a copy of either where the
    login can read it. runs: where the hosts keep their run directories (the lab's
    remote_runs_root)."""
    started = time.time()
    args = until_stopped(script) if go is None else (
        "-e", "script=%s" % script, "-e", json.dumps({"script_args": [str(go)]}))
    proc = subprocess.Popen(
        [*ansible_cli.command("ansible-playbook"), "train.yml", "-i", str(inventory or lab.inventory),
         "-e", "nnodes=%d" % nnodes, *args,
         "-e", "run_dir=%s" % (tmp_path / "run"), *extra],
        cwd=ROOT, env=dict(os.environ, PATH="%s:%s" % (BIN, os.environ["PATH"])),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def training():
        logs = [p for p in runs.glob("*/node*/logs/*/attempt_0/0/stdout.log")
                if p.stat().st_mtime >= started and "step" in p.read_text()]
        return len(logs) == nnodes

    assert wait_until(training, 180), "the run never started training"
    run_id = next(p for p in runs.glob("*/node1/torchrun.pid")
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


@pytest.mark.slow
def test_a_cut_host_is_named_even_when_its_peers_errors_reach_the_master_first(healthy_lab,
                                                                               tmp_path):
    """collective_timeout_s=5, lost_after_s=25: node0's and node1's ranks time out in their
    collective and report their errors (measured: 8.5 s after the cut) some 16 s before node2,
    cut off, can be judged lost, longer than the master's usual settle time (8 s). The record
    waits for node2: the verdict names node2 host.lost, its peers are its consequence."""
    proc, run_id = start_long_train(healthy_lab, tmp_path, "-e", "lost_after_s=25",
                                    "-e", "collective_timeout_s=5", nnodes=3,
                                    script=TORCH_STEPS)
    healthy_lab.cut_network("node2")
    out, _ = proc.communicate(timeout=240)
    run = Run(proc.returncode, out, tmp_path / "run")
    assert run.rc != 0
    report = run.report("train.json")
    assert report["first_failure"]["host"] == "node2", report["first_failure"]
    outcomes = {h["host"]: h["outcome"] for h in report["hosts"]}
    assert outcomes["node2"] == "lost", outcomes
    assert "train failed" in out and "node2" in out.split("train failed", 1)[1].splitlines()[0]
    assert wait_until(lambda: not processes_of(run_id), 90), processes_of(run_id)


@pytest.mark.slow
def test_a_ranks_own_exit_is_named_though_its_sibling_takes_seconds_to_stop(healthy_lab,
                                                                            tmp_path):
    """2 hosts x 2 ranks: node1's rank 3 exits 3 while its sibling (rank 2) takes 8 s to stop
    on SIGTERM; node0's ranks die of the broken connection and report first. The verdict names
    node1, rank 3, with its own code, not node0's consequence."""
    go = tmp_path / "go"
    proc = subprocess.Popen(
        [*ansible_cli.command("ansible-playbook"), "train.yml", "-i", str(healthy_lab.inventory),
         "-e", "nnodes=2", "-e", "nproc_per_node=2",
         "-e", "script=%s" % (SCRIPTS / "slow_sibling.py"),
         "-e", json.dumps({"script_args": [str(go)]}), "-e", "run_dir=%s" % (tmp_path / "run"),
         "-e", "lease_s=%d" % CUT_LEASE_S],
        cwd=ROOT, env=dict(os.environ, PATH="%s:%s" % (BIN, os.environ["PATH"])),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    started = time.time()

    def ranks_started():
        return sum(1 for p in REMOTE_RUNS.glob("*/node*/logs/*/attempt_0/*/stdout.log")
                   if p.stat().st_mtime >= started and "started" in p.read_text()) == 4

    try:
        assert wait_until(ranks_started, 180), "the ranks never started"
        go.touch()
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    run = Run(proc.returncode, out, tmp_path / "run")
    assert run.rc != 0
    report = run.report("train.json")
    first = report["first_failure"]
    assert (first["host"], first["rank"]) == ("node1", 3), first
    assert "train failed: first failure on node1, rank 3: rank 3 exited with 3" in out
    assert wait_until(lambda: not processes_of(report["run_id"]), 90), \
        processes_of(report["run_id"])


# A cut shorter than the lease, as the default's 60 s cut against its 120 s lease: longer
# than SSH takes to give up on a host, so the watch's looks fail for real and it looks again
# (the relations are checked in tests/unit/test_timings.py).
CUT_S, CUT_LEASE_S = 15, 30


@pytest.mark.slow
def test_a_cut_shorter_than_the_lease_between_the_controller_and_the_hosts_loses_nothing(
        healthy_lab, tmp_path):
    """3 hosts step (ranks that import no torch); the controller's traffic to and from every
    host is dropped for CUT_S (the hosts still reach each other): the watch looks again until
    the cut ends, the run goes on, and it ends ok once told to."""
    go = tmp_path / "go"
    hosts = ("node0", "node1", "node2")
    proc, _ = start_long_train(healthy_lab, tmp_path, "-e", "lease_s=%d" % CUT_LEASE_S,
                               nnodes=3, go=go)
    try:
        healthy_lab.cut_controller(*hosts)
        time.sleep(CUT_S)  # the fault's length is the case itself, not a wait for a condition
        healthy_lab.mend_controller(*hosts)
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        go.touch()
        out, _ = proc.communicate(timeout=240)
    finally:
        healthy_lab.mend_controller(*hosts)
        go.touch()
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    run = Run(proc.returncode, out, tmp_path / "run")
    assert run.rc == 0, out[-3000:]
    report = run.report("train.json")
    assert {h["outcome"] for h in report["hosts"]} == {"succeeded"}
    assert wait_until(lambda: not processes_of(report["run_id"]), 90)


@pytest.mark.slow
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
        str(WORKLOADS / "collective.py")])
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
        failing = run.failing()
        assert ("port.in_use", "node0") in failing
        # On the loaded 2-CPU CI machine node1's probe of the master's ephemeral port has
        # twice missed the listener's window as well (port.ephemeral, its own timing check;
        # alone this test names node0 only): nothing else may fail.
        assert set(failing) <= {("port.in_use", "node0"), ("port.ephemeral", "node1")}, failing
        (check,) = [c for c in run.report()["checks"] if c["id"] == "port.in_use"]
        assert "torch.distributed.run" in check["detail"] and "pid" in check["detail"]
        assert "Start this host's agent" not in run.out
    finally:
        os.killpg(stale.pid, signal.SIGKILL)
        stale.wait()


def master_record(run_id):
    """The master's record of the run (its host's control.json), {} until it is readable."""
    try:
        return json.loads((REMOTE_RUNS / run_id / "node0" / "control.json").read_text())
    except (OSError, ValueError):
        return {}


def _agent_and_torchrun(run_id, host):
    """(the agent's PID, its torchrun's PID) of one host's part of the run. Lab nodes share
    this machine's files: the host's run directory is readable here."""
    pid = json.loads((REMOTE_RUNS / run_id / host / "torchrun.pid").read_text())["pid"]
    return procs.parent(pid), pid


@pytest.mark.slow
def test_a_flooded_control_port_changes_nothing(healthy_lab, tmp_path):
    """Three hosts step (ranks that import no torch) while another process floods the
    master's control port with garbage and holds hundreds of idle connections, until the
    master has refused each kind: the run then ends ok, and the master counts what it refused
    in its record and its agent.log."""
    port, go = free_port(), tmp_path / "go"
    flood = Flood(healthy_lab.node("node0").address, port)
    flood.start()  # it dials until the master listens
    proc = None
    kinds = ("garbled", "over_cap", "unsigned")
    try:
        proc, run_id = start_long_train(healthy_lab, tmp_path, "-e", "control_port=%d" % port,
                                        nnodes=3, go=go)

        def refused_each():
            refused = (master_record(run_id).get("channel") or {}).get("refused") or {}
            return all(refused.get(k, 0) > 0 for k in kinds)

        assert wait_until(refused_each, 120), master_record(run_id)
        go.touch()
        out, _ = proc.communicate(timeout=240)
    finally:
        go.touch()
        flood.done.set()
        flood.join(30)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            proc.communicate(timeout=120)
    run = Run(proc.returncode, out, tmp_path / "run")
    assert run.rc == 0, run.out[-3000:]
    report = run.report("train.json")
    assert report["ok"] and {h["outcome"] for h in report["hosts"]} == {"succeeded"}
    record = json.loads((run.run_dir / "run_state.json").read_text())
    refused = record["channel"]["refused"]
    # Garbage closes its connection; idle connections over the caps go (the flood keeps
    # opening more, so they are pushed out before the hello deadline); a forged frame after a
    # valid nonce is unsigned.
    assert flood.sent > 0 and all(refused.get(k, 0) > 0 for k in kinds), refused
    log = (REMOTE_RUNS / record["run_id"] / "node0" / "agent.log").read_text()
    assert "control port: refused" in log and "over_cap" in log


def test_a_killed_agent_takes_its_torchrun_down_and_is_named_first(healthy_lab, tmp_path):
    """node2's agent is SIGKILLed mid-run: its torchrun dies with it, and every output names
    node2 host.lost, not the ranks on the other hosts that lost a peer."""
    proc, run_id = start_long_train(healthy_lab, tmp_path, "-e", "lost_after_s=10", nnodes=3,
                                    script=TORCH_STEPS)
    try:
        agent, torchrun = _agent_and_torchrun(run_id, "node2")
        os.kill(agent, signal.SIGKILL)
        assert wait_until(lambda: not procs.alive(torchrun), 30), "torchrun outlived its agent"
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:  # an assertion failed before the run ended
            os.killpg(proc.pid, signal.SIGINT)
            proc.communicate(timeout=120)
    run = Run(proc.returncode, out, tmp_path / "run")
    assert run.rc != 0
    report = run.report("train.json")
    record = json.loads((run.run_dir / "run_state.json").read_text())
    assert (record["failure"]["host"], record["failure"]["reason"]) == ("node2", "lost")
    assert report["first_failure"]["host"] == "node2"
    assert report["verdict"].startswith("train failed: first failure on node2: ")
    assert {h["host"]: h["outcome"] for h in report["hosts"]}["node2"] == "lost"
    assert ("host.lost", "node2") in {(c["id"], c["host"]) for c in report["checks"]}
    assert wait_until(lambda: not processes_of(run_id), 90), processes_of(run_id)


@pytest.mark.slow
def test_a_frozen_host_is_lost_and_nothing_of_the_run_is_left_after_it_thaws(healthy_lab,
                                                                              tmp_path):
    proc, run_id = start_long_train(healthy_lab, tmp_path, "-e", "lost_after_s=10")
    agent, torchrun = _agent_and_torchrun(run_id, "node1")
    frozen = [agent] + procs.run_processes(run_id, torchrun, host="node1")
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
    run = Run(proc.returncode, out, tmp_path / "run")
    report = run.report("train.json")
    assert report["first_failure"]["host"] == "node1", report["first_failure"]
    assert ("host.lost", "node1") in {(c["id"], c["host"]) for c in report["checks"]}
    assert wait_until(lambda: not processes_of(run_id), 90), processes_of(run_id)


@pytest.mark.slow
def test_a_start_longer_than_the_lease_is_no_lost_controller(healthy_lab, tmp_path):
    """Four hosts started one at a time (forks 1) under a 3 s lease: the start outlasts the
    lease, which counts from the controller's first look, so the run is not aborted."""
    run = playbook("train.yml", tmp_path, "-e", "nnodes=4", "-e", "script=%s" % NOTORCH,
                   "-e", json.dumps({"script_args": ["/"]}),  # (/ exists: the ranks end)
                   "-e", "launch_lease_s=3", "-e", "launch_poll_s=1", "-f", "1",
                   inventory=healthy_lab.inventory)
    assert run.rc == 0, run.out[-3000:]
    record = json.loads((run.run_dir / "run_state.json").read_text())
    assert record["phase"] == "succeeded" and record["failures"] == []
    # It was a start longer than the lease: the last agent started > 3 s after the first.
    starts = sorted(json.loads((REMOTE_RUNS / record["run_id"] / h / "torchrun.pid")
                               .read_text())["started"] for h in ("node0", "node3"))
    assert starts[1] - starts[0] > 3, starts


@pytest.mark.slow
def test_a_host_whose_start_task_fails_is_the_first_failure_with_ansibles_reason(
        healthy_lab, tmp_path):
    """node2's async start cannot make its job directory: Ansible fails the task there; the
    master's record names node2 with Ansible's reason, and nothing is left anywhere."""
    inventory = yaml.safe_load(healthy_lab.inventory.read_text())
    inventory["all"]["children"]["nodes"]["hosts"]["node2"]["ansible_async_dir"] = \
        "/proc/torchfleet-no-async-dir"
    broken = tmp_path / "inventory.yml"
    broken.write_text(yaml.safe_dump(inventory))
    # (The others' ranks never start: their torchrun waits for node2's in the rendezvous.)
    run = playbook("train.yml", tmp_path, "-e", "nnodes=3", *until_stopped(NOTORCH),
                   inventory=broken)
    assert run.rc != 0
    report = run.report("train.json")
    failure = report["first_failure"]
    assert failure["host"] == "node2" and failure["failure"] == "not_started", failure
    assert "its start failed: could not create" in failure["reason"], failure
    assert report["verdict"].startswith("train failed: first failure on node2: its start "
                                        "failed")
    assert {h["host"]: h["outcome"] for h in report["hosts"]}["node2"] == "failed"
    run_id = report["run_id"]
    assert wait_until(lambda: not processes_of(run_id), 90), processes_of(run_id)
