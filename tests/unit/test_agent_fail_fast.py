"""Fail-fast without waiting for torchrun: a rank's failure is told as soon as its host's agent
knows it for sure (DIED: its exit status, read the moment it ended), torchrun's own exit
completes it, and an abort kills torchrun at once. The review findings that reverted the first
version (issue 58) each have a test here that fails on it."""
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
    # Its script's sys.exit(3), then SIGABRT at interpreter exit: its status -6, its note 3.
    first = s.report("node1", 1005.0, _died(3, 1, exitcode=-6))
    assert first is not None and s.phase == runstate.FAILED
    assert (first["host"], first["rank"], first["detail"]) == (
        "node1", 3, "rank 3 exited with 3 (then SIGABRT at interpreter exit)")
    assert first["at_s"] == 4.8 and first["detected_s"] == 5.0
    # The host still runs (its agent stops it at the abort); the run waits for it.
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
    assert s.report("node2", 1006.0, _died(5, 1, exitcode=1)) is None and len(s.failures) == 2
    # A second death of the same host is not a second failure.
    assert s.report("node1", 1006.0, _died(2, 0, exitcode=1)) is None and len(s.failures) == 2


def test_a_death_without_a_rank_or_a_failing_status_is_not_a_message():
    assert runstate.message({"t": runstate.DIED, "root_cause": {"rank": "x"}}) is None
    assert runstate.message({"t": runstate.DIED}) is None
    assert runstate.message(_died(1, 1, exitcode=None)) is None  # (a note alone)
    assert runstate.message(_died(1, 1, exitcode=0)) is None


def _note(rank_dir, code, ts=None):
    os.makedirs(rank_dir, exist_ok=True)
    with open(os.path.join(rank_dir, exits.NOTE_FILE), "w") as f:
        json.dump({"code": code, "ts": time.time() if ts is None else ts}, f)


def _until(condition, what, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _ended(proc):
    """proc is dead and not waited for (as torchrun has not reaped it yet)."""
    _until(lambda: procs.state(proc.pid) == "Z", "pid %d never ended" % proc.pid)


def _read(deaths, pid):
    """The agent's exit watch has read how pid ended (its status is the agent's from then
    on, whatever a loaded machine does to the watch's thread)."""
    _until(lambda: pid in getattr(deaths, "exits", None).ended if hasattr(deaths, "exits")
           else True, "the exit watch never read pid %d" % pid)


def _gated(path, code):
    """A rank that ends with `code` once `path` exists."""
    return subprocess.Popen(["sh", "-c", "while [ ! -e %s ]; do sleep 0.01; done; exit %d"
                             % (path, code)])


def test_a_note_counts_only_beside_a_failing_exit_status_of_the_ranks_own_process(tmp_path):
    """Review finding 2: an os.fork child's sys.exit(3), or a SystemExit the script caught,
    noted 3 for a rank that then ended 0: a failure told at once aborted a healthy run. The
    note alone is never told; a rank still in its interpreter's exit is told once it ended,
    and only if its status is a failure."""
    healthy = _gated(tmp_path / "go0", 0)
    failing = _gated(tmp_path / "go1", 3)
    try:
        deaths = RankDeaths()
        deaths.ranks = {healthy.pid: (0, 4)}
        dirs = {0: str(tmp_path / "0"), 1: str(tmp_path / "1")}
        deaths.look(os.getpid(), time.monotonic(), stopping=False, refresh=False)
        _note(dirs[0], 3)
        assert deaths.failed(dirs, time.monotonic()) is None  # alive: not (yet) a failure
        (tmp_path / "go0").touch()
        _ended(healthy)
        _read(deaths, healthy.pid)
        deaths.look(os.getpid(), time.monotonic(), stopping=False, refresh=False)
        assert deaths.failed(dirs, time.monotonic()) is None  # it ended 0: no failure
        # A rank whose note and status both say 3 is told, with its words.
        deaths.ranks[failing.pid] = (1, 5)
        deaths.look(os.getpid(), time.monotonic(), stopping=False, refresh=False)
        _note(dirs[1], 3, ts=time.time())
        (tmp_path / "go1").touch()
        _ended(failing)
        _read(deaths, failing.pid)
        deaths.look(os.getpid(), time.monotonic(), stopping=False, refresh=False)
        cause, _age = deaths.failed(dirs, time.monotonic())
        assert cause == {"rank": 5, "local_rank": 1, "exitcode": 3, "script_code": 3,
                         "at_exit": True}
        assert exits.words(5, 3, 3, True) == "rank 5 exited with 3"
    finally:
        for proc in (healthy, failing):
            proc.kill()
            proc.wait()


def test_a_sibling_stopped_by_torchrun_is_never_named_for_a_rank_reaped_unread(tmp_path):
    """Review finding 1: a rank killed by a signal leaves no note and torchrun reaps it, then
    SIGTERMs its siblings: a sibling's -15 was told as the failure and the rank that crashed
    was never named. A first death whose status was not read leaves this host to torchrun's
    own report, and so does a death by the signal torchrun stops its ranks with."""
    crashed = subprocess.Popen(["sleep", "30"])
    sibling = subprocess.Popen(["sleep", "30"])
    later = _gated(tmp_path / "go", 3)
    try:
        crashed.kill()
        crashed.wait()  # torchrun's monitor reaped it before this host's agent looked
        deaths = RankDeaths()
        deaths.ranks = {crashed.pid: (0, 0), sibling.pid: (1, 1), later.pid: (2, 2)}
        sibling.terminate()  # torchrun stops the rest
        _ended(sibling)
        deaths.look(os.getpid(), time.monotonic(), stopping=False, refresh=False)
        assert deaths.failed({}, time.monotonic()) is None
        # Nor is any later death of this host (torchrun is ending: it names the first).
        (tmp_path / "go").touch()
        _ended(later)
        deaths.look(os.getpid(), time.monotonic(), stopping=False, refresh=False)
        assert deaths.failed({}, time.monotonic()) is None
    finally:
        for proc in (sibling, later):
            proc.kill()
            proc.wait()


def test_a_sigterm_death_alone_is_no_cause_and_ranks_ended_together_are_told_only_when_sure():
    deaths = RankDeaths()
    deaths.ranks = {11: (0, 4), 12: (1, 5)}
    deaths.dead = {11: (1.0, True), 12: (2.0, True)}
    deaths.status = {11: -signal.SIGTERM, 12: 1}
    assert deaths.failed({}, 3.0) is None and deaths.unsure
    # Seen ended in one round, one of them by SIGTERM: which was first is not known.
    deaths = RankDeaths()
    deaths.ranks = {11: (0, 4), 12: (1, 5)}
    deaths.dead = {11: (1.0, True), 12: (1.0, True)}
    deaths.status = {11: -signal.SIGSEGV, 12: -signal.SIGTERM}
    assert deaths.failed({}, 3.0) is None
    # Two failing in one round (the fail-fast review: local rank 5 crashed, rank 2's CUDA
    # error followed within the watch's wake-up): which came first is not known, torchrun says.
    deaths = RankDeaths()
    deaths.ranks = {10: (2, 6), 11: (0, 4), 12: (1, 5)}
    deaths.dead = {10: (0.5, True), 11: (1.0, True), 12: (1.0, True)}
    deaths.status = {10: 0, 11: 1, 12: -signal.SIGSEGV}
    assert deaths.failed({}, 3.0) is None and deaths.unsure
    # One failing alone, after one that ended well: it is the cause.
    deaths = RankDeaths()
    deaths.ranks = {10: (2, 6), 11: (0, 4)}
    deaths.dead = {10: (0.5, True), 11: (1.0, True)}
    deaths.status = {10: 0, 11: 1}
    cause, age_s = deaths.failed({}, 3.0)
    assert (cause["rank"], cause["exitcode"], age_s) == (4, 1, 2.0)
    # A rank that handled torchrun's SIGTERM (a checkpoint) and exited 143 may have died of a
    # stop from outside (stop.yml): torchrun says.
    deaths = RankDeaths()
    deaths.ranks = {11: (0, 4)}
    deaths.dead = {11: (1.0, True)}
    deaths.status = {11: 128 + signal.SIGTERM}
    assert deaths.failed({}, 3.0) is None and deaths.unsure


def test_a_death_after_the_abort_is_of_the_stop_unless_its_rank_was_ending_with_a_failure():
    """The fail-fast review: a hang at 512 hosts; a host still dumping its stacks when the
    other hosts kill their ranks sees a rank here die of the NCCL error that follows. It died
    of the run's stop: told as this host's failure it named the wrong host."""
    deaths = RankDeaths()
    deaths.ranks = {11: (0, 4), 12: (1, 5)}
    deaths.abort_m = 2.0
    deaths.dead = {11: (2.5, True)}
    deaths.status = {11: 1}
    assert deaths.failed({}, 3.0) is None and deaths.first_own() is None
    # A rank that was already ending with a failing note when the abort came is still told.
    deaths.awaited = {1}
    deaths.dead[12], deaths.status[12] = (2.6, True), 3
    cause, _age = deaths.failed({}, 3.0)
    assert (cause["rank"], cause["exitcode"]) == (5, 3)


def test_a_rank_killed_by_a_signal_is_named_by_its_status_read_before_torchrun_reaps_it():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    sibling = subprocess.Popen(["sleep", "30"])
    try:
        deaths = RankDeaths()
        deaths.ranks = {child.pid: (0, 4), sibling.pid: (1, 5)}
        deaths.look(os.getpid(), time.monotonic(), stopping=False, refresh=False)  # watched
        os.kill(child.pid, signal.SIGKILL)
        _ended(child)
        _read(deaths, child.pid)
        deaths.look(os.getpid(), time.monotonic(), stopping=False, refresh=False)
        child.wait()  # torchrun reaps it: its status was read already
        sibling.terminate()  # then stops its siblings: later, and by SIGTERM
        _ended(sibling)
        _read(deaths, sibling.pid)
        deaths.look(os.getpid(), time.monotonic(), stopping=False, refresh=False)
        cause, _age = deaths.failed({}, time.monotonic())
        assert (cause["rank"], cause["exitcode"], cause["at_exit"]) == (4, -9, False)
        assert exits.words(4, -9) == "rank 4 exited with -9"
    finally:
        sibling.kill()
        sibling.wait()
        child.wait()


def test_a_rank_that_died_of_our_own_stop_or_ended_well_is_no_failure():
    stopped = subprocess.Popen(["sleep", "30"])
    done = subprocess.Popen(["sleep", "0.3"])
    try:
        deaths = RankDeaths()
        deaths.ranks = {stopped.pid: (0, 0), done.pid: (1, 1)}
        deaths.look(os.getpid(), time.monotonic(), stopping=False, refresh=False)
        _ended(done)
        _read(deaths, done.pid)
        deaths.stopped_m = time.monotonic()  # as the agent's stop: before its signal
        os.kill(stopped.pid, signal.SIGTERM)
        _ended(stopped)
        _read(deaths, stopped.pid)
        deaths.look(os.getpid(), time.monotonic(), stopping=True, refresh=False)
        assert deaths.status == {stopped.pid: -15, done.pid: 0}
        assert not deaths.dead[stopped.pid][1]
        assert deaths.failed({}, time.monotonic()) is None and deaths.first_own() is None
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


# A stand-in torchrun: its command line names torch.distributed.run and the run id; it starts
# its ranks (argv after "--", one shell line each, LOCAL_RANK i, RANK 2 + i) and never reaps
# them (its monitor has not looked yet).
STAND_IN = """
import os, subprocess, sys, time
lines = sys.argv[sys.argv.index("--") + 1:]
for i, line in enumerate(lines):
    subprocess.Popen(["sh", "-c", line], env=dict(os.environ, LOCAL_RANK=str(i), RANK=str(2 + i)))
time.sleep(60)
"""


def _stand_in(run_id, *ranks):
    env = {"TORCHFLEET_RUN_ID": run_id, "TORCHFLEET_HOST": "node1", "PATH": "/usr/bin:/bin"}
    return subprocess.Popen([sys.executable, "-c", STAND_IN, "torch.distributed.run",
                             "--rdzv-id", run_id, "--", *ranks], env=env)


def _gated_agent(tmp_path, name):
    """node1's agent over a stand-in torchrun whose local rank 0 ends with 3 once
    tmp_path/go exists (its pid) and rank 1 sleeps; what the agent sends is kept in `sent`."""
    from ansible_collections.torchfleet.fleet.plugins.module_utils.run.agent import (
        HostAgent, Timings)

    run_id = "%s-%d" % (name, os.getpid())
    torchrun = _stand_in(run_id, "while [ ! -e %s ]; do sleep 0.01; done; exit 3"
                         % (tmp_path / "go"), "sleep 60")
    p = {"host": "node1", "python": sys.executable, "flight_recorder": 0, "max_restarts": 0,
         "run_dir": str(tmp_path), "run_id": run_id, "nproc_per_node": 2, "stack_dump": False,
         "lost_after_s": 30, "join_timeout_s": 30, "abort_grace_s": 0.5, "lease_s": 0}
    sent = []
    try:
        agent = HostAgent(p, torchrun, None, Timings(p), lambda body: sent.append(body) or True,
                          None)
        _until(lambda: agent.deaths.look(torchrun.pid, time.monotonic(), False, True) or
               len(agent.deaths.ranks) == 2, "the ranks never started")
    except BaseException:
        torchrun.kill()
        torchrun.wait()
        raise
    pid = next(pid for pid, (lr, _r) in agent.deaths.ranks.items() if lr == 0)
    return run_id, torchrun, agent, sent, pid


def test_a_failure_that_comes_with_the_abort_is_told_before_the_stop_not_died_of_it(tmp_path):
    """Review finding 3: node1's rank ended with 3 just as node0's failure brought the abort;
    it was counted as dead of the stop and its failure lost. obey() tells it first."""
    run_id, torchrun, agent, sent, pid = _gated_agent(tmp_path, "r-with-abort")
    try:
        (tmp_path / "go").touch()
        _until(lambda: procs.state(pid) == "Z", "rank 2 never ended")
        _read(agent.deaths, pid)
        agent.obey({"t": runstate.ABORT, "failure": {"host": "node0"}})
        died = [m for m in sent if m["t"] == runstate.DIED]
        assert [(m["root_cause"]["rank"], m["root_cause"]["exitcode"]) for m in died] == [(2, 3)]
        assert agent.stopped and torchrun.wait(timeout=10) != 0
        # The judge keeps it as node1's own failure, after node0's.
        s = runstate.RunState("r1", ["node0", "node1"], 2, now=1000.0, lost_after_s=30)
        for host in s.order:
            s.beat(host, 1001.0, alive=2)
        s.exited("node0", 1002.0, 1, root_cause={"rank": 0, "local_rank": 0, "exitcode": 1})
        s.report("node1", 1002.1, died[0])
        assert s.failure["host"] == "node0"
        assert [(f["host"], f["detail"]) for f in s.failures] == [
            ("node0", "rank 0 exited with 1"), ("node1", "rank 2 exited with 3")]
        assert runstate.host_outcome(s.phase, s.failures, s.hosts["node1"]) == "failed"
    finally:
        torchrun.kill()
        torchrun.wait()


def test_a_rank_that_ignores_sigterm_and_hides_its_environment_is_killed_by_the_sweep():
    """Review finding 4: torchrun SIGKILLed first orphans its ranks; the sweep found them by
    torchrun's descendants (gone) and the run id in their environment, so a rank that ignores
    SIGTERM with an environment that cannot be read (here: cleared) outlived the abort."""
    run_id = "r-hidden-%d" % os.getpid()
    torchrun = _stand_in(run_id, "exec env -i %s -c 'import signal, time; signal.signal("
                         "signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'" % sys.executable)
    rank = None
    try:
        _until(lambda: [c for c in procs.children(torchrun.pid)
                        if b"SIG_IGN" in procs.cmdline(c).encode()], "the rank never started")
        rank = procs.children(torchrun.pid)[0]
        _until(lambda: _ignores_sigterm(rank), "the rank never ignored SIGTERM")
        assert procs.environ(rank) == {}
        result = procs.stop_run(run_id, torchrun.pid, grace_s=0.3, host="node1",
                                all_at_once=True)
        assert torchrun.wait(timeout=10) == -signal.SIGKILL
        assert rank in result["killed"] and not procs.alive(rank)
    finally:
        torchrun.kill()
        torchrun.wait()
        if rank is not None and procs.alive(rank):
            os.kill(rank, signal.SIGKILL)


def _ignores_sigterm(pid):
    for line in procs._read("/proc/%d/status" % pid).splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


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


def test_the_masters_own_failing_rank_is_named_with_its_code_once(tmp_path):
    """The master's agent tells its own store (the abort comes back within the telling, and
    stops its own torchrun at once): the rank's exit code 3, read when it ended, is the one
    failure, completed by the EXIT. (On a loaded machine torchrun may reap the rank before
    its status is read: torchrun's own report then names it, with the same words.)"""
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
    assert [h["state"] for h in record["hosts"]] == ["exited"]


def _hang_judged():
    """Two hosts of 2 ranks in a barrier that rank 3 (node1) never joined, held past
    hang_timeout_s: the judge has named the hang."""
    s = runstate.RunState("r1", ["node0", "node1"], 2, now=1000.0, lost_after_s=30,
                          hang_timeout_s=20)
    pos = {str(r): {"0": [40, 39, "gloo:barrier", "[]", ""]} for r in range(4)}
    pos["3"] = {"0": [39, 39, "", "", ""]}
    for t in range(1001, 1024):
        for i, h in enumerate(s.order):
            mine = {r: g for r, g in pos.items() if int(r) // 2 == i}
            s.report(h, t, {"t": runstate.BEAT, "alive": 2, "idle_s": 0.0, "last_line": "x",
                            "pid": 1, "coll": mine, "steady": {r: [30.0, True] for r in mine}})
        s.tick(t)
    assert s.failure["reason"] == runstate.HANG
    return s


def test_a_rank_that_died_waiting_after_a_hang_was_judged_died_of_the_stop():
    """A hang judged, its stop under way: rank 0, waiting in the barrier that rank 3 never
    joined, fails as rank 3 is killed, and its agent tells it before it heard the abort. The
    run stays the hang, and the hung rank's host stays hung, not failed (the full suite's
    test_a_hang_is_diagnosed_with_stacks_then_stopped under load, 2026-11-28)."""
    s = _hang_judged()
    died = {"t": runstate.DIED, "root_cause": {"rank": 0, "local_rank": 0, "exitcode": 1,
                                               "script_code": 1, "at_exit": True},
            "age_s": 0.0}
    s.report("node0", s.started + s.failure["detected_s"] + 0.5, died)
    assert [f["reason"] for f in s.failures] == [runstate.HANG]
    assert runstate.host_outcome(s.phase, s.failures, s.hosts["node1"]) == \
        runstate.host_outcome(s.phase, s.failures, s.hosts["node0"]) == "hung"


def test_the_exit_of_a_host_stopped_at_once_for_a_rank_that_died_of_the_stop_is_a_stop():
    """The same death, told by the EXIT of its host (its agent stops its torchrun at once on
    a rank's failure, before it heard the abort): a stop, not a failure."""
    s = _hang_judged()
    decided = s.started + s.failure["detected_s"]
    s.exited("node0", decided + 1.5, -9, root_cause={"rank": 0, "local_rank": 0,
                                                     "exitcode": 1}, age_s=1.0)
    assert [f["reason"] for f in s.failures] == [runstate.HANG]
    assert s.hosts["node0"]["state"] == runstate.STOPPED
    assert runstate.host_outcome(s.phase, s.failures, s.hosts["node1"]) == "hung"
    # A rank that failed before the hang was decided is still a failure of its own.
    s.exited("node1", decided + 2.0, 1, root_cause={"rank": 2, "local_rank": 0,
                                                    "exitcode": 1}, age_s=3.0)
    assert ("node1", 2, "rank 2 exited with 1") in [(f["host"], f["rank"], f["detail"])
                                                    for f in s.failures]


def test_a_rank_still_ending_with_a_failure_at_the_abort_is_told_after_it_as_a_consequence(
        tmp_path):
    """Finding 3's other half: a rank that noted a failing code but had not ended when the
    abort came is told once it ends, kept on its host, but as a consequence: it may have
    failed of the run's stop (a peer's collective broken), so it never makes its host failed
    (the fail-fast review, finding 1)."""
    run_id, torchrun, agent, sent, pid = _gated_agent(tmp_path, "r-ending")
    try:
        note_dir = tmp_path / "logs" / run_id / "attempt_0" / "0"
        note_dir.mkdir(parents=True)
        (note_dir / "exit.json").write_text(json.dumps({"code": 3, "ts": time.time()}))
        agent.obey({"t": runstate.ABORT, "failure": {"host": "node0"}})
        assert agent.deaths.awaited == {0} and not agent.stopped  # waited for, not stopped
        (tmp_path / "go").touch()
        _until(lambda: procs.state(pid) == "Z", "rank 0 never ended")
        _read(agent.deaths, pid)
        agent.deaths.look(torchrun.pid, time.monotonic(), agent.stopped, False)
        agent._tell_death(time.monotonic(), refresh=True)
        died = [m for m in sent if m["t"] == runstate.DIED]
        assert [(m["root_cause"]["exitcode"], m["consequence"]) for m in died] == [(3, True)]
    finally:
        torchrun.kill()
        torchrun.wait()


# A stand-in torchrun whose local rank 0 (RANK 2) notes 1 and exits 1 at once, reaped by
# torchrun before any look of its agent (its status never read), as steps_notorch.py without
# its argument does at start; torchrun then prints its summary (torch 2.x's words, as the
# ledger lab's node1 printed them), stops rank 1 after argv[1] seconds of teardown and exits 1.
REAPING_STAND_IN = """
import json, os, subprocess, sys, time
teardown_s, rank_dir, log = float(sys.argv[1]), sys.argv[2], sys.argv[3]
sibling = subprocess.Popen(["sleep", "60"], env=dict(os.environ, LOCAL_RANK="1", RANK="3"))
os.makedirs(rank_dir)
with open(os.path.join(rank_dir, "exit.json"), "w") as f:
    json.dump({"code": 1, "ts": time.time()}, f)
subprocess.run(["sh", "-c", "exit 1"], env=dict(os.environ, LOCAL_RANK="0", RANK="2"))
with open(log, "w") as f:
    f.write("Root Cause (first observed failure):\\n[0]:\\n  time      : 2026-12-07_10:03:32\\n"
            "  host      : node1\\n  rank      : 2 (local_rank: 0)\\n"
            "  exitcode  : 1 (pid: 3826)\\n  error_file: <N/A>\\n")
time.sleep(teardown_s)
sibling.terminate()
sibling.wait()
sys.exit(1)
"""


class _NoWatch:
    def look(self, now_m, ranks):
        pass

    def take(self, now_m):
        return []

    def status(self):
        return {}


def _after_an_unseen_death(tmp_path, teardown_s, stop_after_s):
    """node1's agent told to abort (node0's rank failed) after its rank 2 ended, noting 1, and
    was reaped by torchrun unseen; then stepped until its torchrun ended. Returns its EXIT."""
    from ansible_collections.torchfleet.fleet.plugins.module_utils.run.agent import (
        HostAgent, Timings)

    run_id = "r-unseen-%d" % os.getpid()
    rank_dir = tmp_path / "logs" / run_id / "attempt_0" / "0"
    log = tmp_path / "torchrun.log"
    torchrun = subprocess.Popen(
        [sys.executable, "-c", REAPING_STAND_IN, str(teardown_s), str(rank_dir), str(log),
         "torch.distributed.run", "--rdzv-id", run_id],
        env={"TORCHFLEET_RUN_ID": run_id, "TORCHFLEET_HOST": "node1", "PATH": "/usr/bin:/bin"})
    p = {"host": "node1", "python": sys.executable, "flight_recorder": 0, "max_restarts": 0,
         "run_dir": str(tmp_path), "run_id": run_id, "nproc_per_node": 2, "stack_dump": False,
         "lost_after_s": 30, "join_timeout_s": 30, "abort_grace_s": 0.5, "lease_s": 0}
    sent = []
    try:
        timings = Timings(p)
        timings.TEARDOWN_S = stop_after_s
        agent = HostAgent(p, torchrun, None, timings, lambda body: sent.append(body) or True,
                          _NoWatch())
        _until(log.exists, "rank 2 never ended")
        agent.obey({"t": runstate.ABORT, "failure": {"host": "node0"}})
        assert not [m for m in sent if m["t"] == runstate.DIED]  # (its death was not seen)
        _until(lambda: agent.step(time.monotonic()) is not None, "torchrun never ended", 60)
    finally:
        torchrun.kill()
        torchrun.wait()
    exits_sent = [m for m in sent if m["t"] == runstate.EXIT]
    assert len(exits_sent) == 1, sent
    return agent, exits_sent[0]


def _judged(exit_body):
    """node1's outcome once node0's rank 0 failed first and node1's EXIT came."""
    s = runstate.RunState("r1", ["node0", "node1"], 2, now=1000.0, lost_after_s=30)
    for host in s.order:
        s.beat(host, 1001.0, alive=2)
    s.exited("node0", 1003.0, 1, root_cause={"rank": 0, "local_rank": 0, "exitcode": 1,
                                             "script_code": 1, "at_exit": True})
    s.report("node1", 1003.2, exit_body)
    return [runstate.host_outcome(s.phase, s.failures, s.hosts[h]) for h in s.order]


def test_a_ranks_failure_before_the_abort_that_no_look_saw_is_its_hosts_own(tmp_path):
    """The ledger lab (issue 65): a script every rank dies of at start, on 2 hosts. node1's
    rank ended 160 ms before node0's failure brought the abort, between two looks of its
    agent, and torchrun reaped it: the agent stopped torchrun at once as a healthy host and
    said "stopped"; node1 was "aborted", the script's failure node0's alone (a strike in the
    ledger, never the shared cause). Its note and torchrun's own words now make it node1's own
    failure: torchrun, ending by itself, is given TEARDOWN_S to say it."""
    agent, body = _after_an_unseen_death(tmp_path, teardown_s=0.3, stop_after_s=10.0)
    assert not agent.stopped  # torchrun ended by itself
    assert (body["stopped"], body["root_cause"]["rank"], body["root_cause"]["exitcode"]) == (
        False, 2, 1)
    assert _judged(body) == ["failed", "failed"]


def test_a_ranks_failure_before_the_abort_stays_its_own_when_torchrun_is_stopped_after(
        tmp_path):
    """The same, torchrun slower to end than TEARDOWN_S: stopped by its agent, its log names
    the rank that ended before the abort, and that is still node1's own failure."""
    agent, body = _after_an_unseen_death(tmp_path, teardown_s=30.0, stop_after_s=0.3)
    assert agent.stopped
    assert (body["stopped"], body["root_cause"]["rank"]) == (False, 2)
    assert _judged(body) == ["failed", "failed"]


def _boxed_agent(tmp_path, child, runtime, command=None):
    """node1's agent whose child is `child`, a container runtime's process (apptainer,
    enroot) that runs torchrun in the host's own tree; `command` runs the runtime's
    commands (podman's inspect)."""
    from ansible_collections.torchfleet.fleet.plugins.module_utils.run.agent import (
        Box, HostAgent, Timings)
    p = {"host": "node1", "python": sys.executable, "flight_recorder": 0, "max_restarts": 0,
         "run_dir": str(tmp_path), "run_id": "r1", "nproc_per_node": 2, "stack_dump": False,
         "lost_after_s": 30, "join_timeout_s": 30, "abort_grace_s": 0.5, "lease_s": 0,
         "container_runtime": runtime, "container_image": "/images/pt.sqsh", "attempt": 0,
         "chdir": "", "data_paths": [], "container_mounts": [], "container_options": [],
         "container_gpus": False, "network": "tcp", "checkpoint_dir": ""}
    return HostAgent(p, child, command, Timings(p), lambda body: True, None,
                     Box(p, str(tmp_path / "train.py")))


def _kill_tree(proc):
    for pid in procs.tree(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    proc.kill()
    proc.wait()


def test_apptainers_and_enroots_ranks_are_found_below_the_runtimes_process_at_once(tmp_path):
    """Issue 68: under apptainer (its starter forks the container's process) or an image
    whose entrypoint does not exec, torchrun is a descendant of the agent's child, not the
    child itself: the agent looked for ranks among the child's children only and never found
    them. A real tree: a shell that does not exec (it has more to run after), a stand-in
    torchrun below it, and ranks that each have a child of their own (a DataLoader worker,
    with the rank's environment) which must not be taken for a rank."""
    worker = "sleep 60 & sleep 60; wait"  # (a rank with a child of its own)
    wrapper = subprocess.Popen(
        ["sh", "-c", '"$0" -c "$1" torch.distributed.run -- "$2" "$2"; echo ended',
         sys.executable, STAND_IN, worker], env={"PATH": "/usr/bin:/bin"})
    try:
        agent = _boxed_agent(tmp_path, wrapper, "apptainer")
        # (found at the look the ranks run at: no beat, no command run)
        _until(lambda: agent.root() != wrapper.pid, "torchrun was never found below the child")
        torchrun = agent.root()
        assert procs.parent(torchrun) == wrapper.pid  # the shell did not exec into it
        _until(lambda: agent.deaths.look(agent.root(), time.monotonic(), False, True) or
               len(agent.deaths.ranks) == 2, "the ranks were never found")
        assert sorted(agent.deaths.ranks.values()) == [(0, 2), (1, 3)]
        assert all(procs.parent(pid) == torchrun for pid in agent.deaths.ranks)
        # The bound: torchrun one level below is out of reach at depth 0.
        assert procs.find_torchrun(wrapper.pid, depth=0) is None
        assert procs.find_torchrun(wrapper.pid, depth=1) == torchrun
    finally:
        _kill_tree(wrapper)


def test_enroots_exec_chain_makes_the_agents_child_torchrun_itself(tmp_path):
    """enroot start exec's all the way into the container's command (enroot-nsenter,
    enroot-switchroot, /etc/rc's exec): the agent's child is torchrun, found at depth 0."""
    torchrun = _stand_in("r1", "sleep 60", "sleep 60")
    try:
        agent = _boxed_agent(tmp_path, torchrun, "enroot")
        _until(lambda: agent.deaths.look(agent.root(), time.monotonic(), False, True) or
               len(agent.deaths.ranks) == 2, "the ranks were never found")
        assert agent.root() == torchrun.pid
    finally:
        _kill_tree(torchrun)


def test_podmans_torchrun_below_the_images_init_is_found_with_its_ranks(tmp_path):
    """An image's init (tini, --init) or an entrypoint script that does not exec is the
    container's first process (podman inspect's .State.Pid), torchrun its child: the agent
    took the first process for torchrun and never saw a rank. A real tree: a shell that
    does not exec stands for the init (podman's client, the agent's child, is another
    process: here a sleep)."""
    init = subprocess.Popen(
        ["sh", "-c", '"$0" -c "$1" torch.distributed.run -- "$2" "$2"; echo ended',
         sys.executable, STAND_IN, "sleep 60"], env={"PATH": "/usr/bin:/bin"})
    client = subprocess.Popen(["sleep", "60"])
    asked = []

    def inspect(argv, timeout_s):
        asked.append(argv)
        return "%d\n" % init.pid, None
    try:
        agent = _boxed_agent(tmp_path, client, "podman", inspect)
        # (before the ranks run nothing is torchrun: the init is no live rank)
        _until(lambda: agent.root() not in (0, init.pid), "torchrun was never found below "
               "the init")
        torchrun = agent.root()
        assert procs.parent(torchrun) == init.pid
        _until(lambda: agent.deaths.look(agent.root(), time.monotonic(), False, True) or
               len(agent.deaths.ranks) == 2, "the ranks were never found")
        assert all(procs.parent(pid) == torchrun for pid in agent.deaths.ranks)
        assert len(asked) == 1 and asked[0][:2] == ["podman", "inspect"]  # (asked once)
        assert agent.box.first == init.pid
    finally:
        _kill_tree(init)
        client.kill()
        client.wait()
