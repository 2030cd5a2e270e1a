"""The run's state machine (runstate.RunState), fed the way the master's agent feeds it.

Times are given explicitly (now=...), so each case says exactly when a thing happens.
"""
from __future__ import annotations

from ansible.module_utils.torchfleet import runstate
from ansible.module_utils.torchfleet.runstate import RunState, host_outcome, summary

HOSTS = ["node0", "node1", "node2"]


def state(**kw):
    args = dict(now=1000.0, join_timeout_s=60, lost_after_s=30, hang_timeout_s=300,
                job_timeout_s=3600)
    args.update(kw)
    return RunState("r1", HOSTS, 2, **args)


def all_beat(s, now, progress_ts=None):
    for h in HOSTS:
        s.beat(h, now, alive=2, progress_ts=progress_ts or now, last_line="step", pid=1)


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
    assert [host_outcome(s.phase, s.failure, h) for h in s.record()["hosts"]] == \
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
    outcomes = [host_outcome(s.phase, s.failure, h) for h in s.record()["hosts"]]
    assert outcomes == ["aborted", "failed", "aborted"] and s.all_done()


def test_two_failures_racing_end_the_run_once_naming_the_first():
    s = state()
    all_beat(s, 1001)
    first = s.exited("node2", 1005, 3)
    assert first is not None and first["host"] == "node2"
    assert s.exited("node0", 1005.1, 1) is None  # the second: recorded on its host, not the run
    assert s.tick(2000) is None
    assert s.failure["host"] == "node2" and s.phase == runstate.FAILED
    assert s.record()["hosts"][0]["rc"] == 1


def test_a_vanished_torchrun_is_a_failure():
    s = state()
    all_beat(s, 1001)
    failure = s.exited("node0", 1003, None, vanished=True)
    assert failure["reason"] == runstate.VANISHED and "disappeared" in failure["detail"]


def test_a_silent_host_is_lost_after_lost_after_s():
    s = state()
    all_beat(s, 1001)
    for t in (1011, 1021):
        s.beat("node0", t, progress_ts=t)
        s.beat("node2", t, progress_ts=t)
    assert s.tick(1030) is None
    failure = s.tick(1032)  # node1 silent since 1001: 31 s
    assert (failure["host"], failure["reason"]) == ("node1", runstate.LOST)
    rec = {h["host"]: h for h in s.record()["hosts"]}
    assert rec["node1"]["state"] == runstate.HOST_LOST
    assert host_outcome(s.phase, s.failure, rec["node1"]) == "lost"
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
    assert {host_outcome(s.phase, s.failure, h) for h in s.record()["hosts"]} == {"hung"}


def test_one_rank_progressing_anywhere_is_no_hang():
    s = state(hang_timeout_s=100)
    for t in range(1001, 1300, 10):
        all_beat(s, t, progress_ts=1001)
        s.beat("node2", t, progress_ts=t)  # only node2's ranks print (rank 0 may be the quiet one)
        assert s.tick(t) is None


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
            s.beat(h, 1001, alive=s.nproc, progress_ts=1000 + (i % 7), last_line="step")
    a, b = summary(small.record(), 1010), summary(big.record(), 1010)
    assert set(a) == set(b)
    assert b["ranks_alive"] == b["nranks"] == 4096 and b["hosts_running"] == 512
    assert b["slowest"]["host"] == "n0" and b["slowest"]["idle_s"] == 10.0
    assert len(repr(b)) < 1000
