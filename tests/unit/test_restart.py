"""Restarts (`max_restarts=R`): which failed attempt is started again, on which hosts, and why
not otherwise. The attempts' records come from the real judge (runstate.RunState fed as the
master's store feeds it); the re-check is preflight_checks' real answer or its shape."""
from __future__ import annotations

from ansible_collections.torchfleet.fleet.plugins.modules import preflight_checks
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.torchfleet.fleet.plugins.module_utils.run import restart
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.plan import decide as plan
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.report import verdict
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.runstate import RunState
from tests.unit.modules import run_module
from tests.unit.test_preflight_checks import connect, probe
from tests.unit.test_spares import SIX, plan_params
from tests.conftest import examples

FOUR = SIX[:4]


def record(fail=None, hosts=FOUR):
    """An attempt's record as the master's judge keeps it: every host beating, then `fail`."""
    state = RunState("r1", hosts, 1, now=0.0, lost_after_s=5.0)
    for h in hosts:
        state.beat(h, 1.0, alive=1, idle_s=0.0)
    if fail == "lost n2":
        for h in hosts:
            if h != "n2":
                state.beat(h, 7.0, alive=1, idle_s=0.0)
        state.tick(7.0)
    elif fail == "rank n1":
        state.exited("n1", 2.0, 1, root_cause={"rank": 1, "local_rank": 0, "exitcode": 3})
    elif fail == "hang":
        state.fail(None, "hung", 9.0, "no rank made progress for 300 s (hang_timeout_s)")
    elif fail == "ok":
        for h in hosts:
            state.exited(h, 3.0, 0)
    return state.record()


def first(rec, attempt=0, max_restarts=1, restart_on="host", **more):
    return restart.after_attempt(rec, attempt, max_restarts, restart_on, SIX, FOUR, **more)


def chose(hosts, skipped=None):
    """preflight_checks' answer's shape: the chosen hosts, and the skipped with their ids."""
    return {"ok": True, "nodes": [{"host": h} for h in hosts], "retest": [],
            "choice": {"candidates": SIX, "chosen": hosts, "skipped": skipped or {}}}


def test_a_lost_worker_is_left_out_and_the_next_healthy_spare_takes_its_place(capsys):
    plan_ = first(record("lost n2"))
    assert plan_["recheck"] and plan_["exclude"] == ["n2"]
    assert plan_["hosts"] == ["n0", "n1", "n3", "n4", "n5"]
    assert plan_["left_out"] == {"n2": "host.lost"}
    # The re-check is preflight's own decision over the remaining candidates (n5 one spare).
    rest = plan_["hosts"]
    recheck = run_module(preflight_checks, {
        "hosts": rest, "nnodes": 4, "inventory_size": 6, "spares": 1,
        "probes": {h: probe(h, master=(h == "n0")) for h in rest},
        "connects": {h: connect(h) for h in rest}}, capsys)
    decision = restart.after_recheck(plan_, recheck, FOUR, "host")
    assert decision["restart"] is True
    assert decision["hosts"] == ["n0", "n1", "n3", "n4"]
    assert decision["replaced"] == [{"host": "n2", "reason": "host.lost", "by": "n4"}]
    assert decision["why"] == "n2 host.lost, replaced by n4"


def test_a_lost_master_hands_rank_0_to_the_next_chosen_host():
    rec = record("lost n2")
    rec["failure"] = dict(rec["failure"], host="n0", node_rank=0)
    rec["failures"] = [rec["failure"]]
    plan_ = first(rec)
    assert plan_["hosts"] == ["n1", "n2", "n3", "n4", "n5"]
    decision = restart.after_recheck(plan_, chose(["n1", "n2", "n3", "n4"]), FOUR, "host")
    assert decision["hosts"][0] == "n1" and decision["why"] == "n0 host.lost, replaced by n4"


def test_a_rank_that_died_on_a_host_that_then_fails_its_recheck_is_restarted_without_it():
    plan_ = first(record("rank n1"))
    assert plan_["recheck"] and plan_["suspect"] == "n1" and plan_["exclude"] == []
    decision = restart.after_recheck(plan_, chose(["n0", "n2", "n3", "n4"],
                                                  {"n1": ["shm.size"]}), FOUR, "host")
    assert decision["restart"] and decision["why"] == (
        "n1 failed its re-check (shm.size), replaced by n4")


def test_a_failure_no_host_explains_is_not_restarted_unless_restart_on_any():
    plan_ = first(record("rank n1"))
    same = chose(FOUR)
    decision = restart.after_recheck(plan_, same, FOUR, "host")
    assert decision["restart"] is False
    assert decision["why"] == ("not restarted: n1 passed its re-check, so no host explains the "
                               "failure (restart_on=any restarts it)")
    again = restart.after_recheck(first(record("rank n1"), restart_on="any"), same, FOUR, "any")
    assert again["restart"] and again["hosts"] == FOUR
    assert again["why"] == "n1 run.exit, the same hosts again (restart_on=any)"
    hang = first(record("hang"))
    assert not hang["recheck"] and "no host explains a run that ended hung" in hang["why"]
    assert first(record("hang"), restart_on="any")["recheck"]


def test_no_restart_for_a_success_for_restarts_used_or_too_few_hosts_left():
    assert first(record("ok")) == first(None) == {
        "recheck": False, "hosts": [], "probe": [], "exclude": [], "left_out": {},
        "suspect": None, "cause": None, "why": ""}
    used = first(record("lost n2"), attempt=1, max_restarts=1)
    assert not used["recheck"] and used["why"] == "not restarted: max_restarts=1 used"
    # Restarts not asked for: nothing said.
    assert first(record("lost n2"), max_restarts=0)["why"] == ""
    short = restart.after_attempt(record("lost n2"), 0, 1, "host", FOUR, FOUR)
    assert not short["recheck"] and short["why"] == (
        "not restarted: 3 candidate(s) remain without n2 and the run needs 4 (add spares: -e "
        "spares=K)")
    # Left out once, left out of every later attempt too.
    later = first(record("lost n2"), excluded=["n5"])
    assert later["exclude"] == ["n5", "n2"] and later["hosts"] == ["n0", "n1", "n3", "n4"]


def test_a_host_the_gather_could_not_reach_is_left_out():
    plan_ = first(record("rank n1"), unreachable=["n3"])
    assert plan_["exclude"] == ["n3"] and plan_["left_out"] == {"n3": "host.unreachable"}


def test_a_cut_host_explains_the_failure_even_when_a_peers_error_was_judged_first():
    """n1's rank errored out first; n3, cut off, was unreachable at the gather: the restart
    answers n3 (n1 passing its re-check does not refuse it), and a hang with n3 unreachable
    is explained by n3 too."""
    plan_ = first(record("rank n1"), unreachable=["n3"])
    assert plan_["recheck"] and plan_["suspect"] is None
    decision = restart.after_recheck(plan_, chose(["n0", "n1", "n2", "n4"]), FOUR, "host")
    assert decision["restart"] and decision["why"] == "n3 host.unreachable, replaced by n4"
    hang = first(record("hang"), unreachable=["n3"])
    assert hang["recheck"] and hang["left_out"] == {"n3": "host.unreachable"}


def test_a_failed_recheck_or_a_broken_next_master_says_why_there_is_no_restart():
    plan_ = first(record("lost n2"))
    bad = {"ok": False, "verdict": "preflight failed: 1 problem(s) on controller (host.skipped)"}
    assert restart.after_recheck(plan_, bad, FOUR, "host")["why"] == (
        "not restarted: the re-check failed (preflight failed: 1 problem(s) on controller "
        "(host.skipped))")
    retest = dict(chose([]), retest=["n1", "n3"], choice={"skipped": {"n0": ["shm.size"]}})
    assert restart.after_recheck(plan_, retest, FOUR, "host")["why"] == (
        "not restarted: the re-check found n0, the next master, failing shm.size")


def test_the_verdict_names_every_restart_and_why_a_failure_was_not_restarted():
    assert verdict("train", [], None, [
        {"restart": "n2 host.lost, replaced by n4", "not_restarted": ""},
        {"restart": "", "not_restarted": ""}]) == (
        "train ok after 1 restart: n2 host.lost, replaced by n4")
    failed = {"host": "n1", "rank": 1, "reason": "rank 1 exited with 3"}
    attempts = [{"restart": "a", "not_restarted": ""}, {"restart": "b", "not_restarted": ""},
                {"restart": "", "not_restarted": "not restarted: max_restarts=2 used"}]
    assert verdict("train", [], failed, attempts) == (
        "train failed after 2 restarts (a; b): first failure on n1, rank 1: rank 1 exited "
        "with 3; not restarted: max_restarts=2 used")


def test_max_restarts_and_restart_on_are_checked_before_any_host():
    assert plan(plan_params(max_restarts=5, restart_on="any"))["input_errors"] == []
    for bad in (-1, "two", 6, "1.5", True):
        errors = plan(plan_params(max_restarts=bad))["input_errors"]
        assert [e["id"] for e in errors] == ["input.max_restarts"], bad
        assert errors[0]["detail"] == "max_restarts=%s is not a whole number from 0 to 5" % bad
    errors = plan(plan_params(restart_on="sometimes"))["input_errors"]
    assert [(e["id"], e["detail"]) for e in errors] == [
        ("input.restart_on", "restart_on=sometimes is neither host nor any")]


# Any JSON: the record is the master's, read from another host.
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(max_size=8) | st.sampled_from(SIX + ["lost", "not_started",
                                                                   "failed", "hung", "stopped",
                                                                   "exited"]),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.sampled_from(["failure", "failures", "phase", "host",
                                                       "reason", "consequence", "hosts",
                                                       "state", "x"]),
                                      inner, max_size=5), max_leaves=30)


@settings(max_examples=examples(400), deadline=None)
@given(JSON, st.booleans())
def test_a_record_of_any_shape_never_raises_and_leaves_out_only_named_hosts(rec, any_):
    plan_ = first(rec, restart_on="any" if any_ else "host", probed=SIX)
    assert set(plan_) == {"recheck", "hosts", "probe", "exclude", "left_out", "suspect", "cause",
                          "why"}
    assert all(isinstance(h, str) for h in plan_["exclude"])
    # Fewer hosts probed again only after a host lost or never started, never without the master.
    assert set(plan_["probe"]) <= set(plan_["hosts"])
    if plan_["probe"] != plan_["hosts"]:
        assert plan_["cause"]["reason"] in ("lost", "not_started") and plan_["probe"][0] == "n0"
    assert set(plan_["hosts"]) <= set(SIX) and not set(plan_["hosts"]) & set(plan_["exclude"])
    assert restart.after_recheck(plan_, chose(FOUR), FOUR, "any" if any_ else "host")["why"] \
        is not None


def stopped(rec, hosts=("n0", "n1", "n3")):
    """The record once the other hosts' agents stopped their torchrun (as the watch returns it)."""
    state = RunState("r1", FOUR, 1, now=0.0, lost_after_s=5.0)
    for h in FOUR:
        state.beat(h, 1.0, alive=1, idle_s=0.0)
    for h in FOUR:
        if h != "n2":
            state.beat(h, 7.0, alive=1, idle_s=0.0)
    state.tick(7.0)
    for h in hosts:
        state.exited(h, 8.0, -9, stopped=True)
    return state.record() if rec is None else rec(state.record())


def test_after_a_lost_worker_only_the_master_and_the_spares_are_probed_again():
    plan_ = first(stopped(None), probed=SIX)
    assert plan_["recheck"] and plan_["left_out"] == {"n2": "host.lost"}
    # Every remaining candidate is re-checked (decided); n1 and n3, stopped by their agents,
    # keep their probe; the master's port is tested again and the spares probed.
    assert plan_["hosts"] == ["n0", "n1", "n3", "n4", "n5"]
    assert plan_["probe"] == ["n0", "n4", "n5"]
    # Never started: the same.
    rec = stopped(None)
    rec["failures"][0]["reason"] = rec["failure"]["reason"] = "not_started"
    assert first(rec, probed=SIX)["probe"] == ["n0", "n4", "n5"]
    # attach.yml's restart of a detached run holds no probe of the others: all are probed.
    assert first(stopped(None))["probe"] == plan_["hosts"]
    assert first(stopped(None), probed=["n0", "n1"])["probe"] == plan_["hosts"]


def _with(**change):
    def edit(rec):
        rec["failures"].append(dict(rec["failures"][0], consequence=False, **change))
        return rec
    return edit


def test_every_candidate_is_probed_again_when_the_failure_could_have_changed_another_host():
    everyone = ["n0", "n1", "n3", "n4", "n5"]
    # A survivor whose agent has not said its torchrun ended: it may still run the ranks.
    assert first(stopped(None, hosts=("n0", "n1")), probed=SIX)["probe"] == everyone
    assert first(record("lost n2"), probed=SIX)["probe"] == everyone
    # A second failure of the host's own beside the lost one: run.oom, run.exit, run.hardware,
    # run.straggler.
    for reason in ("oom", "failed", "hardware", "straggler"):
        plan_ = first(stopped(_with(host="n1", reason=reason)), restart_on="any", probed=SIX)
        assert plan_["recheck"] and plan_["probe"] == plan_["hosts"], reason
    # A rank's exit, a hang, a lost master: every candidate, as before.
    rank = stopped(None)
    rank["failure"] = rank["failures"][0] = dict(rank["failure"], reason="failed", host="n1")
    assert first(rank, restart_on="any", probed=SIX)["probe"] == SIX
    assert first(record("hang"), restart_on="any", probed=SIX)["probe"] == SIX
    master = RunState("r1", FOUR, 1, now=0.0, lost_after_s=5.0)
    for h in FOUR:
        master.beat(h, 1.0, alive=1, idle_s=0.0)
    for h in FOUR[1:]:
        master.beat(h, 7.0, alive=1, idle_s=0.0)
    master.tick(7.0)
    for h in FOUR[1:]:
        master.exited(h, 8.0, -9, stopped=True)
    plan_ = first(master.record(), probed=SIX)
    assert plan_["left_out"] == {"n0": "host.lost"}
    assert plan_["probe"] == plan_["hosts"] == ["n1", "n2", "n3", "n4", "n5"]
    # A host unreachable at the gather beside the lost one is left out too; still only the
    # master and the spares.
    assert first(stopped(None), unreachable=["n3"], probed=SIX)["probe"] == ["n0", "n4", "n5"]


def test_after_a_lost_worker_the_others_stopped_by_their_agents_are_gathered_later(tmp_path):
    import json

    from ansible_collections.torchfleet.fleet.plugins.filter.gather_later import FilterModule

    rec = stopped(None)
    # The master (n0) is stopped and gathered at once while the record is not final (its
    # agent may still hold the control port), later with the others once it is.
    assert not rec["final"] and restart.gather_later(rec, FOUR, ["n2"]) == ["n1", "n3"]
    assert restart.gather_later(dict(rec, final=True), FOUR, ["n2"]) == ["n0", "n1", "n3"]
    # A host whose torchrun ended by itself, or that is still running, is stopped now.
    assert restart.gather_later(stopped(None, hosts=("n0", "n1")), FOUR, ["n2"]) == ["n1"]
    rec2 = stopped(None)
    next(h for h in rec2["hosts"] if h["host"] == "n3")["state"] = "exited"
    assert restart.gather_later(rec2, FOUR, ["n2"]) == ["n1"]
    # No host lost (a rank's exit, a hang...), no record, a garbled one: everyone now.
    assert restart.gather_later(rec, FOUR, []) == []
    for bad in (None, [], {"hosts": "n1"}, {"hosts": [None, 3, {"host": "n1"}]}):
        assert restart.gather_later(bad, FOUR, ["n2"]) == []
    # The filter reads the attempt's record on the controller.
    state = tmp_path / "run_state.json"
    state.write_text(json.dumps(rec))
    gather = FilterModule().filters()["gather_later"]
    assert gather(str(state), FOUR, ["n2"]) == ["n1", "n3"]
    assert gather(str(tmp_path / "none.json"), FOUR, ["n2"]) == []
