"""Runs that outlive their controller, on the lab with real SSH and torchrun: a detached
3-host training loop runs on with no controller anywhere (past its lease), is read by id
(status, a rank's log) and attached again to its end; a rank that dies in a detached run stops
every host and attach names it; a detached run is stopped by id. The hosts remove their own
port guard when the run ends.

The first test's ranks are real torch (a gloo all_reduce loop): detach and attach, a run that
outlives its lease, with torch. The others' control plane is the same and their ranks import no
torch (steps_notorch.py, its stand-in: tests/fixtures/README.md), still started by the
real torchrun through the real agents; a rank that dies there is stopped by fail-fast alone."""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import end_unattended, parent_of, processes_matching, run_processes
from tests.integration.playbook import BIN, ROOT
from tests.lab.test_guard_lab import guard_tables
from tests.lab.conftest import runs_root
from tests.lab.test_reliability_lab import processes_of, wait_until
from lab.ports import free_port
from torchfleet import ansible_cli

# slow: docs/testing.md's tiers (bash tests/run --all, or --touching a source it covers)
pytestmark = [pytest.mark.lab, pytest.mark.slow]
REMOTE_RUNS = runs_root(Path(__file__).stem)  # its lab's remote_runs_root
SCRIPT = ROOT / "tests" / "fixtures" / "scripts" / "steps_until_file.py"
NOTORCH = ROOT / "tests" / "fixtures" / "scripts" / "steps_notorch.py"
# Short, so that the run outlives it soon (120 s by default), yet above the longest gap between
# two of the controller's looks CI has shown before detaching: 14 s under the suite's load (a
# look waits up to poll_s, 5 s; SSH and Python took the rest).
LEASE_S = 20
# How much later than the lease's end a record must be written to prove the master judged the
# lease out of date: it sees a look's touch at its next loop (every 0.1 s; a loaded machine's
# scheduler adds to it), and writes its record a beat (1 s) at most after the newest report.
LEASE_SLACK_S = 5


def torchfleet(*args, timeout_s=300):
    proc = subprocess.run([str(BIN / "torchfleet"), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout_s, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, PATH="%s:%s" % (BIN, os.environ["PATH"])))
    return proc.returncode, proc.stdout, proc.stderr


def detach(lab, tmp_path, run_id, *script_args, guard=False, extra=(), script=NOTORCH):
    """train --detach on 3 lab hosts; returns once every rank runs, as a user sees it."""
    rc, out, err = torchfleet(
        "train", "-i", str(lab.inventory), "--nnodes", "3", "--detach", "--run-id", run_id,
        "--runs-root", str(tmp_path / "runs"), "-e", "script=%s" % script,
        "-e", "script_args=%s" % json.dumps([str(a) for a in script_args]),
        "-e", "lease_s=%d" % LEASE_S, "-e", "master_port=%d" % free_port(),
        "-e", "guard_ports=%s" % str(guard).lower(), *extra)
    assert rc == 0, (out + err)[-3000:]
    assert "train detached: run %s goes on" % run_id in out and "torchfleet attach" in out
    return tmp_path / "runs"


def holder(run_dir):
    """The PID in the run's attach lock, None without one."""
    try:
        return json.loads((run_dir / "attach.lock").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


def attach_in_background(runs, run_id):
    """`torchfleet attach ID` as a user starts it, in a session of its own."""
    return subprocess.Popen(
        [str(BIN / "torchfleet"), "attach", run_id, "--runs-root", str(runs)], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env=dict(os.environ, PATH="%s:%s" % (BIN, os.environ["PATH"])))


def end_attach(attach):
    """What a test's attach left running, killed (its whole session)."""
    if attach is not None and attach.poll() is None:
        os.killpg(attach.pid, signal.SIGKILL)
        attach.communicate()


def master_record(run_id):
    try:
        return json.loads((REMOTE_RUNS / run_id / "node0" / "control.json").read_text())
    except (OSError, ValueError):
        return {}


def past_its_lease(run_id):
    """The master's record, once one was written past the lease's end: more than LEASE_S (and
    the slack) after the controller's last look touched the lease; None before (or while a
    controller still looks: the lease stays fresh)."""
    record = master_record(run_id)
    try:
        last_look = (REMOTE_RUNS / run_id / "node0" / "lease").stat().st_mtime
    except OSError:
        return None
    return record if record.get("updated", 0) - last_look > LEASE_S + LEASE_SLACK_S else None


def test_a_detached_run_needs_no_controller_and_is_attached_again(healthy_lab, tmp_path):
    run_id, go = "detach-%d" % os.getpid(), tmp_path / "go"
    runs = detach(healthy_lab, tmp_path, run_id, go, guard=True, script=SCRIPT)
    attach = beside = None
    try:
        # The controller's unattended finisher killed (the controller shut down): no process of
        # the controller is left, and the run outlives its lease: a record the master wrote
        # after the lease ran out (its every tick judges the lease) still says running.
        finisher = end_unattended(runs / run_id)
        assert not [p for p in processes_matching(str(runs)) + run_processes(run_id)
                    if "ansible" in p]
        record = wait_until(lambda: past_its_lease(run_id), 120)
        assert record and record["phase"] == "running", master_record(run_id)

        rc, out, err = torchfleet("status", run_id, "--runs-root", str(runs))
        assert rc == 0, err
        assert "run %s  running" % run_id in out
        assert [line.split()[1] for line in out.splitlines() if line.startswith("node")] \
            == ["running"] * 3
        rc, listed, _ = torchfleet("status", "--runs-root", str(runs))
        assert rc == 0 and run_id in listed and "detached" in listed

        rc, out, err = torchfleet("logs", run_id, "--rank", "2", "--tail", "5",
                                  "--runs-root", str(runs))
        assert rc == 0, err
        assert "[rank 2] step" in out and "[rank 0]" not in out

        attach = attach_in_background(runs, run_id)
        # Once the new attach holds the lock (the killed finisher's is stale).
        assert wait_until(lambda: holder(runs / run_id) not in (None, finisher), 120)
        # A second attach follows beside the one that owns the run, to the same verdict.
        beside = attach_in_background(runs, run_id)

        go.touch()
        # Every host ends its part and removes its own guard before any gather.
        assert wait_until(lambda: not processes_of(run_id), 120), processes_of(run_id)
        assert all(guard_tables(n.ns) == [] for n in healthy_lab.nodes)
        out, _ = attach.communicate(timeout=300)
        assert attach.returncode == 0, out[-3000:]
        followed, _ = beside.communicate(timeout=300)
        assert beside.returncode == 0 and "train ok" in followed, followed[-3000:]
    finally:
        go.touch()
        end_attach(attach)
        end_attach(beside)
    report = json.loads((runs / run_id / "train.json").read_text())
    assert [h["outcome"] for h in report["hosts"]] == ["succeeded"] * 3
    for rank in range(3):
        rc, out, _ = torchfleet("logs", run_id, "--rank", str(rank), "--tail", "2",
                                "--runs-root", str(runs))
        assert rc == 0 and "[rank %d] last step" % rank in out


def test_a_rank_that_dies_in_a_detached_run_stops_every_host_and_attach_names_it(
        healthy_lab, tmp_path):
    run_id, go = "detach-die-%d" % os.getpid(), tmp_path / "go"
    runs = detach(healthy_lab, tmp_path, run_id, go, 2)
    end_unattended(runs / run_id)  # no controller anywhere
    go.touch()
    try:
        assert wait_until(lambda: not processes_of(run_id), 60), processes_of(run_id)
        # The master's agent closes its record once every host reported its end.
        assert wait_until(lambda: master_record(run_id).get("final"), 120), master_record(run_id)
    finally:
        subprocess.run(["pkill", "-f", run_id], check=False)
    record = master_record(run_id)
    assert record["failure"]["host"] == "node2", record["failure"]
    rc, out, err = torchfleet("attach", run_id, "--runs-root", str(runs))
    assert rc == 1, (out + err)[-3000:]
    assert "first failure on node2, rank 2" in out and "exited with 3" in out


def run_record(runs, run_id):
    try:
        return json.loads((runs / run_id / "run.json").read_text())
    except (OSError, ValueError):
        return {}


def kill_agent(run_id, host):
    """SIGKILL of a host's agent (torchrun's parent; torchrun and its rank follow it): the host
    falls silent as a host that died would. `host` must run the run's attempt (run.json's
    hosts): its agent wrote torchrun.pid before it first reported a rank running."""
    torchrun = json.loads((REMOTE_RUNS / run_id / host / "torchrun.pid").read_text())["pid"]
    os.kill(parent_of(torchrun), signal.SIGKILL)


def victim_and_spare(runs, run_id):
    """(the run's hosts, the one of them whose agent the test kills, the spare that takes its
    place, the hosts after the restart), from the run's record: with spares=1 preflight runs
    the first 3 healthy of the 4 candidates, so a candidate that fails a check at the start
    (unreachable for a moment on a loaded machine) leaves its place to the spare, and no fixed
    name is sure to run the attempt (node2's torchrun.pid was once missing)."""
    record = run_record(runs, run_id)
    hosts, (spare,) = list(record["hosts"]), list(record["spares"])
    victim = hosts[-1]
    return hosts, victim, spare, sorted(set(hosts) - {victim} | {spare})  # (inventory order)


def test_a_detached_run_restarts_on_a_spare_with_no_launching_play(healthy_lab, tmp_path):
    """detach with a spare and max_restarts=1: node2 dies after the launching play returned.
    The controller's unattended finisher re-checks the candidates and starts the run again,
    detached, on node0, node1 and the spare node3 (status, logs and attach by id follow the new
    attempt), then gathers and reports it: ok after 1 restart."""
    run_id, go = "detach-restart-%d" % os.getpid(), tmp_path / "go"
    runs = detach(healthy_lab, tmp_path, run_id, go, extra=(
        "-e", "spares=1", "-e", "max_restarts=1", "-e", "lost_after_s=5"))
    try:
        hosts, victim, spare, after = victim_and_spare(runs, run_id)
        kill_agent(run_id, victim)
        assert wait_until(lambda: run_record(runs, run_id).get("watch", {}).get("attempt") == 1,
                          240), (runs / run_id / "attach-unattended.log").read_text()[-3000:]
        assert list(run_record(runs, run_id)["hosts"]) == after
        rc, out, err = torchfleet("status", run_id, "--runs-root", str(runs))
        assert rc == 0, err
        assert sorted(line.split()[0] for line in out.splitlines()
                      if line.startswith("node")) == after, out
        go.touch()
        assert wait_until(lambda: (runs / run_id / "train.json").exists(), 240), \
            (runs / run_id / "attach-unattended.log").read_text()[-3000:]
        assert wait_until(lambda: not processes_of(run_id), 60), processes_of(run_id)
    finally:
        go.touch()
    report = json.loads((runs / run_id / "train.json").read_text())
    assert report["verdict"] == "train ok after 1 restart: %s host.lost, replaced by %s" % (
        victim, spare)
    first, second = report["attempts"]
    assert (first["hosts"], first["outcomes"][victim]) == (hosts, "lost")
    assert (second["hosts"], second["ok"]) == (after, True)
    rc, out, _ = torchfleet("logs", run_id, "--host", spare, "--tail", "2",
                            "--runs-root", str(runs))
    assert rc == 0 and "[rank %d] last step" % after.index(spare) in out, out


def test_attach_restarts_a_detached_run_that_failed_with_no_controller(healthy_lab, tmp_path):
    """The same restart done by a user's attach: the finisher killed, a host dies, every host
    stops; `torchfleet attach` gathers the failed attempt, restarts the run on the spare (run.json
    then names it) and follows it to its end: exit 0, ok after 1 restart. node2 fails preflight
    at the start (its data missing, mended before the restart): the spare, node3, runs the first
    attempt in its place, as it does when a loaded machine keeps node2 from answering."""
    run_id, go = "detach-reattach-%d" % os.getpid(), tmp_path / "go"
    healthy_lab.remove_data("node2")
    runs = detach(healthy_lab, tmp_path, run_id, go, extra=(
        "-e", "spares=1", "-e", "max_restarts=1", "-e", "lost_after_s=5"))
    healthy_lab.restore_data("node2")
    end_unattended(runs / run_id)
    attach = None
    try:
        hosts, victim, spare, after = victim_and_spare(runs, run_id)
        assert (hosts, victim, spare) == (["node0", "node1", "node3"], "node3", "node2")
        kill_agent(run_id, victim)
        assert wait_until(lambda: master_record(run_id).get("final"), 120), master_record(run_id)
        assert wait_until(lambda: not processes_of(run_id), 60), processes_of(run_id)
        attach = attach_in_background(runs, run_id)
        assert wait_until(lambda: run_record(runs, run_id).get("watch", {}).get("attempt") == 1
                          or attach.poll() is not None, 240)
        assert list(run_record(runs, run_id)["hosts"]) == after
        go.touch()
        out, _ = attach.communicate(timeout=300)
        assert attach.returncode == 0, out[-3000:]
        assert "train ok after 1 restart: %s host.lost, replaced by %s" % (victim, spare) in out
        assert wait_until(lambda: not processes_of(run_id), 60), processes_of(run_id)
    finally:
        go.touch()
        end_attach(attach)
    report = json.loads((runs / run_id / "train.json").read_text())
    assert [a["hosts"] for a in report["attempts"]] == [hosts, after]


def test_a_detached_run_is_stopped_by_id_gathered_and_reported(healthy_lab, tmp_path):
    """With the controller's unattended finisher following it: stop asks the master, the
    finisher gathers and reports, and stop answers with that report."""
    run_id, go = "detach-stop-%d" % os.getpid(), tmp_path / "go"
    runs = detach(healthy_lab, tmp_path, run_id, go, guard=True)
    assert wait_until(lambda: (runs / run_id / "attach.lock").exists(), 120)
    try:
        rc, out, err = torchfleet("stop", run_id, "-i", str(healthy_lab.inventory),
                                  "--runs-root", str(runs))
        assert rc == 0, (out + err)[-3000:]
        assert "stopped by the user" in out
        # The finisher that reported it ends just after its report.
        assert wait_until(lambda: not processes_of(run_id), 60), processes_of(run_id)
        assert all(guard_tables(n.ns) == [] for n in healthy_lab.nodes)
    finally:
        go.touch()
    report = json.loads((runs / run_id / "train.json").read_text())
    assert report["first_failure"]["reason"].startswith("stopped by the user")
    for bad, words in (("nosuch", "no run nosuch under"), ("../x", "is not a torchfleet run id")):
        rc, out, err = torchfleet("attach", bad, "--runs-root", str(runs))
        assert rc == 2 and words in err and len(err.strip().splitlines()) == 1


def test_stop_without_the_runs_variables_removes_a_guard_its_killed_agents_left(healthy_lab,
                                                                                tmp_path):
    """A guarded run whose every process is killed (SIGKILL: no agent removes its guard): a
    plain stop.yml, knowing nothing of the run, finds the guards by their markers and removes
    them."""
    run_id, go = "detach-kill-%d" % os.getpid(), tmp_path / "go"
    runs = detach(healthy_lab, tmp_path, run_id, go, guard=True)
    end_unattended(runs / run_id)
    try:
        # Each host's agent is torchrun's parent; killed, torchrun follows it (PDEATHSIG).
        for pidfile in REMOTE_RUNS.glob("%s/*/torchrun.pid" % run_id):
            kill_agent(run_id, pidfile.parent.name)
        assert wait_until(lambda: not processes_of(run_id), 60), processes_of(run_id)
        assert all(guard_tables(n.ns) for n in healthy_lab.nodes[:3])
        stop = subprocess.run([*ansible_cli.command("ansible-playbook"), "stop.yml", "-i",
                               str(healthy_lab.inventory)], cwd=ROOT, capture_output=True,
                              text=True, timeout=300,
                              env=dict(os.environ, PATH="%s:%s" % (BIN, os.environ["PATH"])))
        assert stop.returncode == 0, (stop.stdout + stop.stderr)[-3000:]
        assert all(guard_tables(n.ns) == [] for n in healthy_lab.nodes)
        assert not list(REMOTE_RUNS.glob("%s/*/guarded" % run_id))
    finally:
        go.touch()
