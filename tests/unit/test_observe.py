"""actions=observe and the audit of actions (issue 65 "Observe-only" and "An audit"): every
judge runs and records; torchfleet itself stops, drains, quarantines and restarts nothing, and
each would-be action is listed with done false. A rank's own death still ends the run."""
from __future__ import annotations

import json
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import ledger
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import restart, runstate
from tests.conftest import examples
from tests.unit.test_hw_judge import beat, running, xid79
from tests.unit.test_runstate import all_beat, state

HOSTS = ["node0", "node1", "node2"]


def observed(hosts, **kw):
    s = running(hosts, nproc=8)
    s.observe = True  # (as RunState(actions="observe") sets it: the agent passes the variable)
    return s


def test_a_fatal_xid_is_a_stop_in_enforce_and_a_would_be_stop_in_observe():
    enforce = running(HOSTS)
    assert beat(enforce, "node1", 1002.0, [xid79()]) is not None
    assert enforce.phase == runstate.HARDWARE
    (stop,) = enforce.record()["actions"]
    assert (stop["action"], stop["host"], stop["check"], stop["done"]) == (
        "stop", "node1", "run.hardware", True)
    assert "Xid 79" in stop["why"] and stop["at"].endswith("Z")

    s = runstate.RunState("r", HOSTS, 8, now=1000.0, hang_timeout_s=600, actions="observe")
    for h in HOSTS:
        s.report(h, 1001.0, {"t": runstate.BEAT, "alive": 8, "idle_s": 0.0, "pid": 1})
    assert beat(s, "node1", 1002.0, [xid79()]) is None
    beat(s, "node1", 1003.0, [xid79(age_s=0.5)])  # the same event again: recorded once
    assert s.phase == runstate.RUNNING and s.failure is None and s.failures == []
    (would,) = s.record()["actions"]
    assert (would["action"], would["host"], would["check"], would["done"]) == (
        "stop", "node1", "run.hardware", False)
    assert [e["code"] for e in s.events] == [79]  # the event itself is kept as ever


def test_in_observe_a_ranks_own_death_ends_the_run_and_the_hardware_observed_explains_it():
    s = observed(HOSTS)
    beat(s, "node1", 1002.0, [xid79(rank=9)])
    assert s.phase == runstate.RUNNING
    failure = s.exited("node1", 1010.0, 1, root_cause={"rank": 9, "exitcode": 1})
    assert failure is not None  # torchrun's fail-fast: the run ends, as without torchfleet
    assert s.failure["reason"] == runstate.HARDWARE and s.failure["host"] == "node1"
    assert [(a["action"], a["done"]) for a in s.record()["actions"]] == [("stop", False)]


def test_an_observed_hang_is_recorded_once_and_the_run_still_ends_at_job_timeout():
    s = state(hang_timeout_s=100, job_timeout_s=400, actions="observe")
    all_beat(s, 1001, progress_ts=1001)
    for t in range(1010, 1400, 10):
        all_beat(s, t, progress_ts=1001)
        assert s.tick(t) is None
    assert s.phase == runstate.RUNNING
    assert [(a["action"], a["host"], a["check"], a["done"]) for a in s.record()["actions"]] \
        == [("stop", None, "run.hang", False)]
    all_beat(s, 1402, progress_ts=1001)
    assert s.tick(1402)["reason"] == runstate.TIMEOUT  # the user's bound is not torchfleet's


def test_observe_restarts_nothing_and_says_what_it_would_have_done():
    record = {"phase": "lost", "failure": {"host": "n1", "reason": "lost"},
              "failures": [{"host": "n1", "reason": "lost"}], "hosts": []}
    enforce = restart.after_attempt(record, 0, 1, "host", ["n0", "n1", "n2"], ["n0", "n1"])
    assert enforce["recheck"] is True and enforce["exclude"] == ["n1"]
    out = restart.after_attempt(record, 0, 1, "host", ["n0", "n1", "n2"], ["n0", "n1"],
                                observe=True)
    assert out["recheck"] is False and out["would"] is True
    assert out["why"] == ("not restarted: actions=observe (would have re-checked 2 "
                          "candidate(s) for a restart without n1)")
    final = restart.after_recheck(out, {}, ["n0", "n1"], "host")  # attempt.yml's second call
    assert (final["restart"], final["would"], final["why"]) == (False, True, out["why"])


def test_observe_quarantines_nobody_and_keeps_what_it_would_have(tmp_path):
    f = ledger.Fleet("fleet.db", str(tmp_path), observe=True)
    from tests.unit.test_ledger import T0, train
    for i in range(3):
        assert f.record_run(train("r%d" % i, "node3"), now=T0 + i) == []
    assert [q["host"] for q in f.would] == ["node3"]
    assert not f.health(["node3"], now=T0 + 10)["node3"]["quarantined_until"]
    assert f.health(["node3"], now=T0 + 10)["node3"]["score"] > 2.5  # judged all the same
    f.close()


def test_the_audit_and_the_verdict_of_an_observed_run(tmp_path, capsys):
    """run_summary (as the results role calls it): a run that a rank's own death ended after
    an observed Xid 79, with slurm_drain: nothing drained, the audit lists the stop and the
    drain with done false, the verdict says what torchfleet would have done."""
    from ansible_collections.torchfleet.fleet.plugins.modules import run_summary
    from tests.unit.modules import run_module

    hosts = ["n0", "n1", "n2", "n3"]
    t0 = time.time() - 60  # (the ledger's history reads the last 20 half-lives)
    s = runstate.RunState("obs", hosts, 1, now=t0, hang_timeout_s=600, actions="observe")
    for h in hosts:
        beat(s, h, t0 + 1, [])
    beat(s, "n2", t0 + 2, [xid79()])
    s.exited("n2", t0 + 10, 1, root_cause={"rank": 2, "exitcode": 1})
    end = run_module(run_summary, {
        "kind": "train", "run_id": "obs", "hosts": hosts, "state": s.record(),
        "world_size": 4, "settings": {"nproc_per_node": 1}, "expect_results": False,
        "run_dir": str(tmp_path / "runs" / "obs"), "fleet_db": "fleet.db", "slurm_drain": True,
        "actions": "observe"}, capsys)
    assert end["drain"] == []
    assert [(a["action"], a["host"], a["check"], a["done"]) for a in end["actions"]] == [
        ("stop", "n2", "run.hardware", False), ("drain", "n2", "run.hardware", False)]
    assert "actions=observe: would have stopped n2 (run.hardware), drained n2 (run.hardware)" \
        in end["verdict"]
    report = json.loads((tmp_path / "runs" / "obs" / "train.json").read_text())
    assert report["actions"] == end["actions"] and report["verdict"] == end["verdict"]
    # The same audit in the ledger, and `torchfleet hosts n2` prints it.
    from torchfleet import cli
    fleet = ledger.Fleet("fleet.db", str(tmp_path / "runs"))
    assert sorted((a["action"], a["check"], a["done"]) for a in fleet.history("n2")["actions"]) \
        == [("drain", "run.hardware", False), ("stop", "run.hardware", False)]
    fleet.close()
    assert cli.main(["hosts", "n2", "--runs-root", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "obs: stop not done (run.hardware): " in out and "Xid 79" in out
    assert "obs: drain not done (run.hardware)" in out
    assert cli.main(["hosts", "n2", "extra", "--runs-root", str(tmp_path / "runs")]) == 2


def test_an_enforced_run_audits_its_stop_and_drain_as_done(tmp_path, capsys):
    from ansible_collections.torchfleet.fleet.plugins.modules import run_summary
    from tests.unit.modules import run_module
    from tests.unit.test_fleet_memory import fake_scontrol

    scontrol, _log = fake_scontrol(tmp_path)  # (a drain is done where Slurm drained the node)

    hosts = ["n0", "n1", "n2", "n3"]
    s = runstate.RunState("enf", hosts, 1, now=100.0, hang_timeout_s=600)
    for h in hosts:
        beat(s, h, 101.0, [])
    beat(s, "n2", 102.0, [xid79()])
    end = run_module(run_summary, {
        "kind": "train", "run_id": "enf", "hosts": hosts, "state": s.record(),
        "world_size": 4, "settings": {"nproc_per_node": 1}, "expect_results": False,
        "run_dir": str(tmp_path / "runs" / "enf"), "fleet_db": "", "slurm_drain": True,
        "slurm_scontrol": scontrol}, capsys)
    assert [d["host"] for d in end["drain"]] == ["n2"]
    assert [(a["action"], a["host"], a["done"]) for a in end["actions"]] == [
        ("stop", "n2", True), ("drain", "n2", True)]
    assert "would have" not in end["verdict"]


@settings(max_examples=examples(200), deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda inner: st.lists(inner, max_size=5)
                    | st.dictionaries(st.sampled_from(["action", "host", "check", "at", "why",
                                                       "done", "x"]), inner, max_size=7),
                    max_leaves=30))
def test_a_records_actions_from_another_host_are_checked_never_raise(value):
    out = runstate.checked_actions(value)
    assert len(out) <= runstate.ACTIONS_MAX
    for a in out:
        assert a["action"] in runstate.ACTIONS and isinstance(a["done"], bool)
        assert all(isinstance(a[k], str) for k in ("check", "at", "why"))
        json.dumps(a)


def test_a_restart_is_audited_with_each_host_it_replaced_and_an_observed_one_as_not_done():
    from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import summary

    record = {"updated": 1_900_000_000.0}
    done = summary.restart_actions({"restart": True, "why": "n2 host.lost, replaced by n4",
                                    "replaced": [{"host": "n2", "by": "n4",
                                                  "reason": "host.lost"}]}, record)
    assert [(a["action"], a["host"], a["why"], a["done"]) for a in done] == [
        ("restart", None, "n2 host.lost, replaced by n4", True),
        ("exclude", "n2", "host.lost, replaced by n4", True)]
    assert done[0]["at"] == "2030-03-17T17:46:40Z"
    would = summary.restart_actions({"restart": False, "would": True, "why": "not restarted: "
                                     "actions=observe (would have ...)"}, record)
    assert [(a["action"], a["done"]) for a in would] == [("restart", False)]
    assert summary.restart_actions({"restart": False, "why": "max_restarts=1 used"},
                                   record) == []


def test_a_lost_host_is_an_audited_stop_in_either_mode():
    for actions in ("enforce", "observe"):
        s = state(actions=actions)
        all_beat(s, 1001)
        for h in ("node0", "node2"):
            s.beat(h, 1040, alive=2, idle_s=0.0, last_line="step", pid=1)
        assert s.tick(1040)["reason"] == runstate.LOST
        assert [(a["action"], a["host"], a["check"], a["done"]) for a in s.record()["actions"]] \
            == [("stop", "node1", "host.lost", True)]


def test_an_observed_hardware_event_long_before_a_ranks_death_is_not_its_cause():
    """An Xid the run went on past for an hour does not explain a script's failure after it
    (torch's NCCL watchdog would have ended a rank the fault hung within 10 minutes)."""
    s = observed(HOSTS)
    beat(s, "node1", 1002.0, [xid79(rank=9)])
    assert s.exited("node1", 1002.0 + 3600, 1, root_cause={"rank": 9, "exitcode": 1})
    assert s.failure["reason"] == runstate.FAILED and s.failures[0]["reason"] == runstate.FAILED
