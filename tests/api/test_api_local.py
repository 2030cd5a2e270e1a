"""torchfleet's Python API against the embedded default inventory, through real ansible-runner
runs of the bundled playbooks (two nodes on this machine, gloo over loopback).

A rank's exit status, Ctrl-C, cancel and detach run steps_notorch.py: the real torchrun starts it
through the real agents, but it imports no torch (tests/fixtures/README.md), since only the
control plane is under test. The collective keeps real torch ranks; the other behaviours keep
theirs in test_launch_local (a rank's exit: the cascade; a stop from outside, as Ctrl-C's is:
test_stop_during_a_run_..., ranks in a gloo all_reduce) and tests/lab (detach and attach:
test_detach_lab's first test)."""
from __future__ import annotations

import json
import os
import socket
import stat
import tempfile
import time

import pytest

import torchfleet
from lab.ports import free_port
from tests.conftest import FIXTURES, end_unattended, run_processes

pytestmark = pytest.mark.integration
NOTORCH = str(FIXTURES / "scripts" / "steps_notorch.py")


def test_preflight_ok_with_every_hosts_checks_as_events(runs_root, tmp_path, monkeypatch):
    # The runner's private data dir goes to this test's own temporary directory (other tests'
    # runs make theirs beside it at the same time in the machine's).
    private_parent = tmp_path / "tmp"
    private_parent.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private_parent))
    during = []
    events = []

    def on_event(event):
        during.append(len(list(private_parent.glob("torchfleet-runner-*"))))
        events.append(event)

    result = torchfleet.preflight(on_event=on_event, runs_root=runs_root,
                                  master_port=free_port())
    assert result.ok is True and result.failures == []
    assert result.kind == "preflight" and result.run_dir == runs_root / result.run_id
    assert [h.host for h in result.hosts] == ["node0", "node1"]
    assert {h.socket_ifname for h in result.hosts} == {"lo"}
    assert {"host.unreachable", "python.torch", "port.blocked", "shm.size"} <= {
        c.id for c in result.checks}
    seen = {(e.check.host, e.check.id) for e in events if e.kind == "check"}
    assert {("node0", "port.in_use"), ("node1", "port.blocked")} <= seen
    assert {e.host for e in events if e.kind == "task"} >= {"node0", "node1"}
    # Nothing of ansible-runner is left: no private data dir, no env files, no keys.
    assert during and during[0] == 1 and list(private_parent.iterdir()) == []
    names = {p.name for p in result.run_dir.rglob("*")}
    # (ledger.key: the run directory's token in the fleet's ledger, docs/ledger.md)
    assert names == {"preflight.json", "ansible.log", "ledger.key"}
    assert "PRIVATE KEY" not in (result.run_dir / "ansible.log").read_text()
    # The playbooks' run directory contract: 0750, reports 0640, runs/latest moved to it.
    assert stat.S_IMODE(result.run_dir.stat().st_mode) == 0o750
    assert stat.S_IMODE((result.run_dir / "preflight.json").stat().st_mode) == 0o640
    assert (runs_root / "latest").resolve() == result.run_dir.resolve()


def test_failing_preflight_returns_port_in_use_on_the_master(runs_root):
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = torchfleet.preflight(runs_root=runs_root, master_port=port)
    assert result.ok is False
    assert [(c.host, c.id) for c in result.failures] == [("node0", "port.in_use")]
    (check,) = result.failures
    assert "pid %d" % os.getpid() in check.detail and check.fix


def test_collective_returns_a_busbw_table_for_every_op(collective_run):
    result, events = collective_run
    assert result.ok is True, result.failures
    table = result.busbw_by_op()
    assert set(table) == {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "gather",
                          "barrier"}
    for op, rows in table.items():
        assert rows and all(r.wrong == 0 for r in rows), op
        if op != "barrier":
            assert all(0 < r.busbw_min <= r.busbw_median <= r.busbw_max for r in rows), op
    assert result.preflight is not None and result.preflight.ok
    # The watch on the master reported the run while it ran, and how it ended on both hosts.
    looks = [e for e in events if e.kind == "run"]
    assert looks and looks[0].status == "running", events
    assert looks[-1].status == "succeeded" and looks[-1].summary["hosts_done"] == 2


def test_train_returns_every_ranks_exit_status(runs_root):
    """Rank 1 exits 3 at its first step (/ exists); rank 0 would step on: it is stopped. Every
    rank's 0 of a run that succeeded: the detached run's end, below."""
    # restart_on=any: a rank's own error is started again once (on the same two hosts).
    failed = torchfleet.train(runs_root=runs_root, master_port=free_port(), script=NOTORCH,
                              script_args=["/", "1"], max_restarts=1, restart_on="any")
    assert failed.ok is False
    by_rank = {r.rank: r for r in failed.ranks if r.rank is not None}
    assert by_rank[1].exit_code == 3 and by_rank[1].state == "failed"
    assert len(failed.ranks) == 2  # the other rank is there too, stopped or killed
    assert failed.first_failure.rank == 1 and "exited with 3" in failed.first_failure.reason
    assert [(a.attempt, a.hosts, a.phase) for a in failed.attempts] == [
        (0, ["node0", "node1"], "failed"), (1, ["node0", "node1"], "failed")]
    assert failed.verdict == (
        "train failed after 1 restart (node1 run.exit, the same hosts again (restart_on=any)): "
        "first failure on node1, rank 1: rank 1 exited with 3; not restarted: max_restarts=1 "
        "used") == failed.to_dict()["verdict"]
    assert all((failed.run_dir / ("attempt_%d" % a.attempt) / "run_state.json").exists()
               for a in failed.attempts)


def test_cancel_during_train_stops_torchrun_on_every_host(runs_root):
    running = []

    def on_event(event):
        if event.kind == "run":
            running.append(event.summary["hosts_running"])

    def cancel():  # as soon as both hosts' torchrun runs
        return 2 in running

    result = torchfleet.train(on_event=on_event, cancel=cancel, runs_root=runs_root,
                              master_port=free_port(), script=NOTORCH,
                              script_args=["/nonexistent/torchfleet-never"])
    assert result.cancelled is True and result.ok is False
    assert ("controller", "run.cancelled") in {(c.host, c.id) for c in result.failures}
    assert run_processes(result.run_id) == []


def test_a_detached_run_is_read_by_id_attached_cancelled_and_attached_to_its_end(
        runs_root, tmp_path):
    go = tmp_path / "go"
    result = torchfleet.train(runs_root=runs_root, master_port=free_port(), detach=True,
                              script=NOTORCH, script_args=[str(go)])
    run_id = result.run_id
    try:
        assert result.ok and result.detached and result.verdict.startswith("train detached")
        # The controller's unattended finisher owns the run; an attach follows beside it with
        # the finisher's live progress, and its cancel (Ctrl-C) ends that attach only.
        lock, deadline = runs_root / run_id / "attach.lock", time.monotonic() + 120
        while not lock.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        finisher = json.loads(lock.read_text())["pid"]
        seen: list = []
        beside = torchfleet.attach(run_id, runs_root=runs_root,
                                   on_event=lambda e: seen.append(e.kind == "run"),
                                   cancel=lambda: any(seen))
        assert beside.cancelled and not beside.ok and any(seen)
        assert json.loads(lock.read_text())["pid"] == finisher
        end_unattended(runs_root / run_id)
        assert [(r.run_id, r.phase) for r in torchfleet.runs(runs_root)
                if r.run_id == run_id] == [(run_id, "detached")]
        status = torchfleet.status(run_id, runs_root=runs_root)
        assert status.phase == "running" and status.source == "master"
        assert [(h.host, h.state) for h in status.hosts] == [("node0", "running"),
                                                             ("node1", "running")]
        pieces = []
        text = torchfleet.logs(run_id, rank=1, tail=3, runs_root=runs_root,
                               on_text=pieces.append)
        assert "[rank 1] step" in text and "[rank 0]" not in text and "".join(pieces) == text
        with pytest.raises(ValueError, match="ranks 0 to 1; rank 7"):
            torchfleet.logs(run_id, rank=7, runs_root=runs_root)
        # An attach cancelled once it saw the run: the run goes on.
        looked = []
        left = torchfleet.attach(run_id, runs_root=runs_root,
                                 on_event=lambda e: looked.append(e.kind == "run"),
                                 cancel=lambda: any(looked))
        assert left.cancelled and left.detached and not left.ok
        assert torchfleet.status(run_id, runs_root=runs_root).phase == "running"
        go.touch()
        done = torchfleet.attach(run_id, runs_root=runs_root)
    finally:
        go.touch()
    assert done.ok and [h.outcome for h in done.hosts] == ["succeeded", "succeeded"]
    assert [(r.rank, r.exit_code, r.state) for r in done.ranks] == [(0, 0, "succeeded"),
                                                                    (1, 0, "succeeded")]
    assert run_processes(run_id) == []
    assert torchfleet.status(run_id, runs_root=runs_root).source == "report"
    assert "[rank 0] last step" in torchfleet.logs(run_id, rank=0, tail=2, runs_root=runs_root)
    assert torchfleet.attach(run_id, runs_root=runs_root).ok  # gathered: its report, at once


# SIGINT as a terminal's Ctrl-C finds it: a test run started in the background (nohup, &)
# would otherwise pass on an ignored SIGINT, which torchfleet leaves ignored.
TRAIN_THEN_REPORT = """
import json, signal, sys, torchfleet
signal.signal(signal.SIGINT, signal.default_int_handler)
r = torchfleet.train(runs_root=sys.argv[1], run_id=sys.argv[2], master_port=int(sys.argv[3]),
                     script=sys.argv[4], script_args=sys.argv[5:])
print(json.dumps({"cancelled": r.cancelled, "ok": r.ok}))
"""


def test_ctrl_c_during_train_stops_torchrun_on_every_host_then_returns(runs_root):
    import json
    import signal
    import subprocess
    import sys
    import time

    run_id = "ctrl-c-%d" % os.getpid()
    progress = runs_root / run_id / "progress.jsonl"
    # Ranks that step until stopped (a file never made).
    proc = subprocess.Popen([sys.executable, "-c", TRAIN_THEN_REPORT, str(runs_root), run_id,
                             str(free_port()), NOTORCH, "/nonexistent/torchfleet-never"],
                            stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # both hosts' torchrun running
            lines = progress.read_text().splitlines() if progress.exists() else []
            if any(json.loads(x)["hosts_running"] == 2 for x in lines):
                break
            time.sleep(0.2)
        else:
            pytest.fail("the run never started")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert json.loads(out.strip().splitlines()[-1]) == {"cancelled": True, "ok": False}
    assert run_processes(run_id) == []


@pytest.mark.parametrize("call, message", [
    (lambda: torchfleet.preflight("/nonexistent/inventory.yml"), "does not exist"),
    (lambda: torchfleet.preflight(variables={"bad-name": 1}), "not a valid Ansible variable"),
    (lambda: torchfleet.preflight(**{"bad-name": 1}), "unknown argument"),
    (lambda: torchfleet.preflight(run_id="../escape"), "cannot name a directory"),
    (lambda: torchfleet.train(on_event="print"), "must be callable"),
    (lambda: torchfleet.preflight(data_paths={1, 2}), "data_paths.*cannot be converted"),
    (lambda: torchfleet.preflight(variables={"tags": {1, 2}}), "not JSON-serialisable"),
])
def test_misuse_raises_one_clear_sentence(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()
