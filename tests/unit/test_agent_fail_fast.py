"""Fail-fast without waiting for torchrun: a rank's failure is told as soon as its host's agent
sees it (DIED), torchrun's own exit completes it, and an abort kills torchrun at once."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from ansible_collections.torchfleet.fleet.plugins.module_utils.run import exits, procs, runstate
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.agent import RankDeaths


def _state():
    s = runstate.RunState("r1", ["node0", "node1", "node2"], 2, now=1000.0, lost_after_s=30)
    for host in s.order:
        s.beat(host, 1001.0, alive=2)
    return s


def _died(rank, local_rank, exitcode=None, script_code=3, age_s=0.2):
    return {"t": runstate.DIED, "age_s": age_s, "consequence": False, "root_cause": {
        "rank": rank, "local_rank": local_rank, "exitcode": exitcode,
        "script_code": script_code, "at_exit": script_code is not None}}


def test_a_ranks_death_fails_the_run_before_its_torchrun_ends_and_the_exit_completes_it():
    s = _state()
    first = s.report("node1", 1005.0, _died(3, 1))
    assert first is not None and s.phase == runstate.FAILED
    assert (first["host"], first["rank"], first["detail"]) == ("node1", 3, "rank 3 exited with 3")
    assert first["at_s"] == 4.8 and first["detected_s"] == 5.0
    # The host still runs (its torchrun ends by itself); the run waits for it.
    assert s.hosts["node1"]["state"] == runstate.STARTED and not s.all_done()
    # torchrun's exit: its code of the rank and its rc fill in the failure, not a second one.
    s.exited("node0", 1005.5, -9, stopped=True)
    assert s.exited("node1", 1006.0, 1, root_cause={"rank": 3, "local_rank": 1, "exitcode": -6,
                                                     "script_code": 3, "at_exit": True}) is None
    s.exited("node2", 1006.0, -9, stopped=True)
    assert len(s.failures) == 1 and s.all_done()
    failure = s.record()["failure"]
    assert (failure["rc"], failure["exitcode"]) == (1, -6)
    assert runstate.failure_text(failure).startswith(
        "node1, rank 3 exited with 3 (then SIGABRT at interpreter exit)")
    outcomes = [runstate.host_outcome(s.phase, s.failures, h) for h in s.record()["hosts"]]
    assert outcomes == ["aborted", "failed", "aborted"]


def test_a_death_after_another_hosts_failure_is_kept_not_first_and_a_dead_hosts_is_ignored():
    s = _state()
    s.exited("node2", 1004.0, 1, root_cause={"rank": 4, "local_rank": 0, "exitcode": 1})
    assert s.report("node1", 1005.0, _died(3, 1, exitcode=1, script_code=None)) is None
    assert s.failure["host"] == "node2" and len(s.failures) == 2
    assert s.failures[1]["detail"] == "rank 3 exited with 1"
    # Once a host's torchrun ended, a late word of its ranks changes nothing.
    assert s.report("node2", 1006.0, _died(5, 1)) is None and len(s.failures) == 2
    # A second death of the same host is not a second failure.
    assert s.report("node1", 1006.0, _died(2, 0)) is None and len(s.failures) == 2


def test_a_death_without_a_rank_is_not_a_message():
    assert runstate.message({"t": runstate.DIED, "root_cause": {"rank": "x"}}) is None
    assert runstate.message({"t": runstate.DIED}) is None


def _note(rank_dir, code, ts=None):
    os.makedirs(rank_dir, exist_ok=True)
    with open(os.path.join(rank_dir, exits.NOTE_FILE), "w") as f:
        json.dump({"code": code, "ts": time.time() if ts is None else ts}, f)


def test_a_rank_that_noted_a_failure_is_found_while_its_interpreter_still_exits(tmp_path):
    alive = subprocess.Popen(["sleep", "30"])
    try:
        deaths = RankDeaths()
        deaths.ranks = {alive.pid: (1, 5)}
        dirs = {1: str(tmp_path / "1")}
        assert deaths.failed(dirs, time.monotonic()) is None  # no note yet
        _note(dirs[1], 0)
        assert deaths.failed(dirs, time.monotonic()) is None  # its script ended well
        _note(dirs[1], 2, ts=time.time() - 0.5)
        cause, age_s = deaths.failed(dirs, time.monotonic())
        assert cause == {"rank": 5, "local_rank": 1, "exitcode": None, "script_code": 2,
                         "at_exit": True} and age_s >= 0.5
    finally:
        alive.kill()
        alive.wait()


def test_a_rank_killed_by_a_signal_is_found_by_its_status_before_torchrun_reaps_it(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        deaths = RankDeaths()
        deaths.ranks = {child.pid: (0, 4)}
        os.kill(child.pid, signal.SIGKILL)
        while procs.state(child.pid) != "Z":  # dead, not yet waited for (as torchrun's monitor)
            time.sleep(0.01)
        deaths.look(os.getpid(), time.monotonic(), stopping=False, refresh=False)
        cause, _age = deaths.failed({}, time.monotonic())
        assert (cause["rank"], cause["exitcode"], cause["at_exit"]) == (4, -9, False)
        assert exits.words(4, -9) == "rank 4 exited with -9"
    finally:
        child.wait()


def test_a_rank_that_died_of_our_own_stop_or_ended_well_is_no_failure(tmp_path):
    stopped = subprocess.Popen(["sleep", "30"])
    done = subprocess.Popen(["true"])
    try:
        deaths = RankDeaths()
        deaths.ranks = {stopped.pid: (0, 0), done.pid: (1, 1)}
        while procs.state(done.pid) != "Z":
            time.sleep(0.01)
        os.kill(stopped.pid, signal.SIGTERM)
        while procs.state(stopped.pid) != "Z":
            time.sleep(0.01)
        deaths.look(os.getpid(), time.monotonic(), stopping=True, refresh=False)
        assert deaths.status == {stopped.pid: -15, done.pid: 0}
        assert deaths.failed({}, time.monotonic()) is None
    finally:
        stopped.wait()
        done.wait()


def test_exit_status_is_read_only_while_the_process_is_a_zombie():
    child = subprocess.Popen(["sh", "-c", "exit 3"])
    while procs.state(child.pid) != "Z":
        time.sleep(0.01)
    assert procs.exit_status(child.pid) == 3
    child.wait()
    assert procs.exit_status(child.pid) is None
    assert procs.exit_status(os.getpid()) is None


def test_an_abort_kills_torchrun_at_once_and_terminates_its_ranks():
    """torchrun's own shutdown on SIGTERM outlasts the grace on a busy host: it is SIGKILLed;
    the ranks get SIGTERM (and the grace) as before."""
    run_id = "r-abort-%d" % os.getpid()
    env = {"TORCHFLEET_RUN_ID": run_id, "TORCHFLEET_HOST": "node0", "PATH": "/usr/bin:/bin"}
    # A stand-in torchrun: its command line names torch.distributed.run and the run id, it
    # ignores SIGTERM, and it has a rank.
    torchrun = subprocess.Popen(
        [sys.executable, "-c", "import signal, subprocess, sys, time; "
         "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
         "subprocess.Popen(['sleep', '60']); time.sleep(60)",
         "torch.distributed.run", "--rdzv-id", run_id], env=env)
    try:
        while len(procs.children(torchrun.pid)) < 1:
            time.sleep(0.01)
        rank = procs.children(torchrun.pid)[0]
        result = procs.stop_run(run_id, torchrun.pid, grace_s=0.5, host="node0",
                                all_at_once=True)
        assert torchrun.wait(timeout=10) == -signal.SIGKILL
        assert result["killed"][0] == torchrun.pid and torchrun.pid not in result["signalled"]
        assert rank in result["signalled"] and not procs.alive(rank)
    finally:
        torchrun.kill()
        torchrun.wait()


# A rank that ends its script with sys.exit(3), then takes a while in its interpreter's exit (a
# global's finalizer, as torch's teardown takes a second or more on a busy host).
SLOW_EXIT = """
import sys, time
class Slow:
    def __del__(self):
        time.sleep(1.5)
held = Slow()
print("rank done", flush=True)
sys.exit(3)
"""


def test_the_masters_own_failing_rank_is_left_to_end_and_its_torchrun_says_its_code(tmp_path):
    """The master's agent tells its own store (the abort comes back within the telling): its
    torchrun is not stopped while the rank exits, so torchrun's summary names exit code 3 and
    its EXIT completes the one failure its DIED made."""
    from tests.unit.test_run_modules import agent_args, start_agent

    script = tmp_path / "slow_exit.py"
    script.write_text(SLOW_EXIT)
    args = agent_args(tmp_path, "unit-slow-exit-%d" % os.getpid(), script=str(script))
    job = start_agent(args)
    try:
        result = json.loads(job.communicate(timeout=120)[0])
    finally:
        job.kill()
    record = json.loads(open(os.path.join(args["run_dir"], "control.json")).read())
    failure = record["failure"]
    # (Stopped while its interpreter exits, the rank's code would be -15, or none at all.)
    assert (failure["rank"], failure["exitcode"]) == (0, 3), failure
    assert runstate.failure_text(failure).startswith("node0, rank 0 exited with 3"), failure
    assert len(record["failures"]) == 1 and result["rc"] == failure["rc"]
    log = open(os.path.join(args["run_dir"], "agent.log")).read()
    assert "rank 0 failed (rank 0 exited with 3): told the master" in log, log
