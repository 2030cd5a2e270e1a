"""The run's state machine (runstate.RunState), fed the way the master's agent feeds it.

Times are given explicitly (now=...), so each case says exactly when a thing happens.
"""
from __future__ import annotations

import json

from ansible_collections.torchfleet.fleet.plugins.module_utils.run import runstate
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.runstate import RunState, host_outcome, summary

HOSTS = ["node0", "node1", "node2"]


def state(hosts=HOSTS, **kw):
    args = dict(now=1000.0, join_timeout_s=60, lost_after_s=30, hang_timeout_s=300,
                job_timeout_s=3600)
    args.update(kw)
    return RunState("r1", hosts, 2, **args)


def all_beat(s, now, progress_ts=None):
    for h in HOSTS:
        s.beat(h, now, alive=2, idle_s=now - (progress_ts or now), last_line="step", pid=1)


def test_rank_order_is_inventory_order():
    s = state()
    assert [(h["host"], h["node_rank"], h["ranks"]) for h in s.record()["hosts"]] == [
        ("node0", 0, [0, 1]), ("node1", 1, [2, 3]), ("node2", 2, [4, 5])]


def test_every_host_exiting_zero_is_success_and_the_run_is_done():
    s = state()
    all_beat(s, 1001)
    for h in HOSTS:
        assert s.exited(h, 1010, 0) is None
    assert s.phase == runstate.SUCCEEDED and s.failure is None and s.all_done()
    assert [host_outcome(s.phase, s.failures, h) for h in s.record()["hosts"]] == \
        ["succeeded"] * 3


def test_a_host_that_never_reports_is_not_started_after_the_join_timeout():
    s = state()
    for t in (1001, 1030, 1059):
        s.beat("node0", t)
        s.beat("node2", t)
    assert s.tick(1059) is None
    failure = s.tick(1061)
    assert (failure["host"], failure["reason"]) == ("node1", runstate.NOT_STARTED)
    assert "join_timeout_s=60" in failure["detail"]


def test_an_agent_that_could_not_start_fails_the_run_at_once():
    s = state()
    failure = s.not_started("node2", 1002, "script /x.py does not exist on node2")
    assert (failure["host"], failure["reason"]) == ("node2", runstate.NOT_STARTED)
    assert s.phase == runstate.NOT_STARTED


def test_a_failed_host_is_named_with_its_exit_code_and_root_cause():
    s = state()
    all_beat(s, 1001)
    failure = s.exited("node1", 1005, 1, root_cause={"rank": 3, "local_rank": 1, "exitcode": 3},
                       last_line="giving up")
    assert failure["host"] == "node1" and failure["node_rank"] == 1 and failure["rc"] == 1
    assert failure["root_cause"]["rank"] == 3 and failure["detected_s"] == 5.0
    # The others are stopped by their agents: they report, and are 'aborted', not failed.
    s.exited("node0", 1006, -15, stopped=True)
    s.exited("node2", 1006, -15, stopped=True)
    outcomes = [host_outcome(s.phase, s.failures, h) for h in s.record()["hosts"]]
    assert outcomes == ["aborted", "failed", "aborted"] and s.all_done()


def test_two_failures_racing_end_the_run_once_naming_the_first():
    s = state()
    all_beat(s, 1001)
    first = s.exited("node2", 1005, 3)
    assert first is not None and first["host"] == "node2"
    assert s.exited("node0", 1005.1, 1) is None  # the second: kept, but not the run's first
    s.exited("node1", 1005.3, -15, stopped=True)
    assert s.tick(2000) is None
    assert s.failure["host"] == "node2" and s.phase == runstate.FAILED
    assert [f["host"] for f in s.failures] == ["node2", "node0"]
    assert s.record()["hosts"][0]["rc"] == 1


def test_a_silent_host_is_lost_after_lost_after_s():
    s = state()
    all_beat(s, 1001)
    for t in (1011, 1021):
        s.beat("node0", t, idle_s=0)
        s.beat("node2", t, idle_s=0)
    assert s.tick(1030) is None
    failure = s.tick(1032)  # node1 silent since 1001: 31 s
    assert (failure["host"], failure["reason"]) == ("node1", runstate.LOST)
    rec = {h["host"]: h for h in s.record()["hosts"]}
    assert rec["node1"]["state"] == runstate.HOST_LOST
    assert host_outcome(s.phase, s.failures, rec["node1"]) == "lost"
    # A lost host that comes back is not taken back into the run.
    s.beat("node1", 1033)
    assert rec["node1"]["state"] == runstate.HOST_LOST


def test_no_progress_anywhere_for_hang_timeout_is_a_hang():
    s = state(hang_timeout_s=100)
    all_beat(s, 1001, progress_ts=1001)
    for t in range(1010, 1100, 10):  # heartbeats go on, logs stay silent
        all_beat(s, t, progress_ts=1001)
    assert s.tick(1100) is None
    all_beat(s, 1102, progress_ts=1001)
    failure = s.tick(1102)
    assert failure["reason"] == runstate.HANG and failure["host"] is None
    assert {host_outcome(s.phase, s.failures, h) for h in s.record()["hosts"]} == {"hung"}


def test_a_start_slower_than_hang_timeout_is_no_hang_silence_counts_from_the_ranks_up():
    """A loaded host's torchrun imports torch for longer than hang_timeout_s before its ranks
    exist (seen in CI with hang_timeout_s=6): starting, not hung, and no stacks to take."""
    s = state(hang_timeout_s=100)
    for t in range(1001, 1200, 10):  # the agents beat; no rank is alive yet
        for h in HOSTS:
            s.beat(h, t, alive=0, pid=1)
        assert s.tick(t) is None
    all_beat(s, 1201, progress_ts=1201)  # the ranks are up, then silent
    for t in range(1211, 1301, 10):
        all_beat(s, t, progress_ts=1201)
        assert s.tick(t) is None
    all_beat(s, 1302, progress_ts=1201)
    failure = s.tick(1302)
    assert failure["reason"] == runstate.HANG and "for 101 s" in failure["detail"]


def test_one_rank_progressing_anywhere_is_no_hang():
    s = state(hang_timeout_s=100)
    for t in range(1001, 1300, 10):
        all_beat(s, t, progress_ts=1001)
        s.beat("node2", t, idle_s=0)  # only node2's ranks print (rank 0 may be the quiet one)
        assert s.tick(t) is None


def test_torchruns_ending_after_every_rank_ended_are_no_hang():
    """Every rank printed its last line and exited; the torchruns take longer than
    hang_timeout_s to end (their exit barrier, their own interpreter's exit: 10-13 s measured
    at load 18 on 2 CPUs, against the hang lab's hang_timeout_s=6): ending, not hung. The
    agents' beats count no rank alive; the run then succeeds."""
    s = state(hang_timeout_s=6)
    for t in range(1001, 1020):  # the ranks run and print, then end at 1019
        all_beat(s, t, progress_ts=t)
        assert s.tick(t) is None
    for t in range(1020, 1036):  # no rank alive anywhere; every torchrun still running
        for h in HOSTS:
            s.beat(h, t, alive=0, idle_s=t - 1019, pid=1)
        assert s.tick(t) is None, t
    for h in HOSTS:
        s.exited(h, 1036, 0)
    assert s.phase == runstate.SUCCEEDED and s.failure is None


def test_silent_live_ranks_are_a_hang_while_other_hosts_ranks_ended():
    """A host whose ranks ended does not keep another host's silent live ranks from being a
    hang."""
    s = state(hang_timeout_s=6)
    all_beat(s, 1001, progress_ts=1001)
    for t in range(1002, 1008):
        for h in HOSTS:
            s.beat(h, t, alive=0 if h == "node0" else 2, idle_s=t - 1001, pid=1)
        assert s.tick(t) is None
    s.beat("node1", 1008, alive=2, idle_s=7, pid=1)
    assert s.tick(1008)["reason"] == runstate.HANG


def test_the_job_timeout_and_the_controllers_lease():
    s = state(job_timeout_s=50)
    all_beat(s, 1049)
    assert s.tick(1049) is None
    assert s.tick(1051)["reason"] == runstate.TIMEOUT
    s = state()
    all_beat(s, 1001)
    assert s.tick(1002, lease_age_s=10, lease_s=30) is None
    failure = s.tick(1003, lease_age_s=31, lease_s=30)
    assert failure["reason"] == runstate.CONTROLLER_LOST


def test_the_summary_is_the_same_few_fields_at_any_size():
    small, big = state(), RunState("r1", ["n%d" % i for i in range(512)], 8, now=1000.0)
    for s, hosts in ((small, HOSTS), (big, ["n%d" % i for i in range(512)])):
        for i, h in enumerate(hosts):
            s.beat(h, 1001, alive=s.nproc, idle_s=1 - (i % 7), last_line="step")
    a, b = summary(small.record(), 1010), summary(big.record(), 1010)
    assert set(a) == set(b)
    assert b["ranks_alive"] == b["nranks"] == 4096 and b["hosts_running"] == 512
    assert b["slowest"]["host"] == "n0" and b["slowest"]["idle_s"] == 10.0
    assert len(repr(b)) < 1000


CAUSE = {"rank": 5, "local_rank": 1, "exitcode": 3}


def test_a_cascade_names_the_rank_that_failed_not_the_peers_that_lost_it():
    """node2's rank exits 3; node0's and node1's ranks die of the broken connection and their
    reports reach the master first. The run failed at the first report; the judged first
    failure is the cause, whichever report came first."""
    s = state()
    all_beat(s, 1001)
    peer = {"rank": 0, "local_rank": 0, "exitcode": 1}
    assert s.exited("node0", 1005.00, 1, root_cause=peer, consequence=True) is not None
    assert s.failure["host"] == "node0"  # all that is known yet: the run fails now
    s.exited("node1", 1005.05, 1, root_cause=dict(peer, rank=2), consequence=True)
    s.exited("node2", 1005.40, 1, root_cause=CAUSE, age_s=0.3)
    f = s.failure
    assert (f["host"], f["rank"], f["exitcode"], f["consequence"]) == ("node2", 5, 3, False)
    assert runstate.failure_text(f) == "node2, rank 5 exited with 3"
    outcomes = [host_outcome(s.phase, s.failures, h) for h in s.record()["hosts"]]
    assert outcomes == ["aborted", "aborted", "failed"]
    # Two causes: the earlier one by when it happened (arrival less the host's own age).
    t = state()
    all_beat(t, 1001)
    t.exited("node1", 1006.0, 1, root_cause=dict(CAUSE, rank=2), age_s=0.1)
    t.exited("node2", 1006.2, 1, root_cause=CAUSE, age_s=0.5)
    assert t.failure["host"] == "node2"


def test_a_killed_agent_is_lost_when_its_connection_closes_for_good_and_comes_first():
    s = state()
    all_beat(s, 1001)
    s.closed("node1", 1002.0)  # its agent killed: the kernel closes its socket
    # Its torchrun died with it; the others' ranks die of the broken connection.
    s.exited("node0", 1002.3, 1, root_cause={"rank": 0, "local_rank": 0, "exitcode": 1},
             consequence=True)
    assert s.tick(1004.0) is None  # not yet: an agent may reconnect after a broken connection
    s.tick(1005.5)
    f = s.failure
    assert (f["host"], f["reason"], f["at_s"]) == ("node1", runstate.LOST, 2.0)
    assert "connection to the master closed" in f["detail"]
    # A host that reconnects in time is not lost.
    t = state()
    all_beat(t, 1001)
    t.closed("node1", 1002.0)
    t.report("node1", 1002.5, {"t": "hello", "host": "node1"})
    all_beat(t, 1003)
    assert t.tick(1010) is None and t.phase == runstate.RUNNING


def test_every_lost_host_is_in_the_record():
    s = state()
    all_beat(s, 1001)
    for t in (1011, 1021, 1031):
        s.beat("node0", t, idle_s=0)
    s.beat("node2", 1001.5, idle_s=0)  # node2 falls silent half a second after node1
    assert s.tick(1031.2)["host"] == "node1"
    assert s.tick(1031.8) is None  # the run had already failed: node2 is kept, not first
    assert [(f["host"], f["reason"]) for f in s.failures] == [("node1", runstate.LOST),
                                                               ("node2", runstate.LOST)]
    assert s.failure["host"] == "node1"
    assert [host_outcome(s.phase, s.failures, h) for h in s.record()["hosts"]] == \
        ["aborted", "lost", "lost"]


def test_skewed_clocks_change_nothing_the_idle_age_is_measured_on_each_host():
    """Each host says how long ago its ranks wrote (its own clock against its own files): a
    host whose clock is an hour off is no more or less hung than the others."""
    s = state(hang_timeout_s=100)
    for t in range(1001, 1300, 10):
        for h in HOSTS:
            # node2's clock runs 3600 s ahead; its files carry its clock too: the age is the same
            skew = 3600 if h == "node2" else 0
            s.beat(h, t, alive=2, idle_s=(t + skew) - (t - 5 + skew))
        assert s.tick(t) is None
    assert {h["progress_ts"] for h in s.record()["hosts"]} == {1291 - 5}


def test_the_lease_counts_from_the_controllers_first_look():
    """Many fork batches: no look for longer than lease_s after the start is no lost
    controller; the start is bounded by join_timeout_s + lease_s instead."""
    s = state()
    all_beat(s, 1049)
    assert s.tick(1050, lease_age_s=None, lease_s=30, start_bound_s=90) is None
    all_beat(s, 1069)
    assert s.tick(1070, lease_age_s=5, lease_s=30, start_bound_s=90) is None
    t = state()
    all_beat(t, 1001)
    for now in range(1010, 1090, 10):
        all_beat(t, now)
        assert t.tick(now, lease_age_s=None, lease_s=30, start_bound_s=90) is None
    all_beat(t, 1091)
    f = t.tick(1091, lease_age_s=None, lease_s=30, start_bound_s=90)
    assert f["reason"] == runstate.CONTROLLER_LOST and "never looked" in f["detail"]


def test_a_start_that_failed_on_the_controller_is_named_with_ansibles_reason():
    s = state()
    all_beat(s, 1001)
    f = s.not_started("node2", 1003, "its start failed: Failed to connect to the host via ssh")
    assert (f["host"], f["reason"]) == ("node2", runstate.NOT_STARTED)
    record = runstate.controller_record("r1", HOSTS, 2, {
        "host": "node0", "reason": runstate.NOT_STARTED, "detail": "its start failed: x"})
    assert record["final"] and record["failure"]["host"] == "node0"
    assert [h["host"] for h in record["hosts"]] == HOSTS


def test_a_signed_message_with_odd_fields_cannot_break_the_master():
    s = state()
    for body in ({"t": "beat", "alive": "many", "idle_s": [1], "pid": {}},
                 {"t": "exit", "rc": "x", "root_cause": {"rank": "0"}, "age_s": -5},
                 {"t": "exit", "rc": 2, "root_cause": [1, 2]}, {"t": "nonsense"}, {},
                 {"t": "not_started", "detail": 12}):
        s.report("node1", 1002, body)
    assert s.failure["host"] == "node1" and runstate.failure_text(s.failure)
    assert s.report("nobody", 1003, {"t": "exit", "rc": 1}) is None


def test_nan_and_infinity_from_a_hosts_bytes_are_no_number():
    # json.loads takes them: a beat saying so must not date the ranks or an exit at infinity.
    body = json.loads('{"t": "beat", "alive": 2, "idle_s": NaN, "up_s": Infinity, "pid": 1}')
    checked = runstate.message(body)
    assert checked["idle_s"] is None and checked["up_s"] == 0.0
    ended = runstate.message(json.loads('{"t": "exit", "rc": 0, "age_s": -Infinity, '
                                        '"ended_s": NaN}'))
    assert ended["age_s"] == 0.0 and ended["ended_s"] == 0.0


def test_no_sentence_for_people_holds_a_none_or_a_question_mark():
    s = state(hang_timeout_s=5)
    all_beat(s, 1001)
    f = s.tick(1010)
    text = runstate.failure_text(f)
    assert "None" not in text and "?" not in text and "no rank made progress" in text
