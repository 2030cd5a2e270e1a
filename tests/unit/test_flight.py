"""Where each rank is in its collectives (flight.py) and what the one judge makes of it.

The positions here have the shape the watcher writes from torch's Flight Recorder. The first
one below was recorded here (torch 2.13.0 CPU wheel, gloo, torchrun with 4 ranks on one
machine, the run's sitecustomize installed by stacks.install_hook with flight.WATCHER): rank 2
slept before all_reduce #40, rank 1 called all_gather at #40. Faults no recording had are the
same dicts with one value changed, said where.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import summary
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import flight, procs, runstate

from tests.conftest import FIXTURES, examples
from tests.unit.test_runstate import state as runstate_state

RECORDED = {"0": {"0": [40, 39, "gloo:all_reduce", "[[1024]]", "Float"]},
            "1": {"0": [40, 39, "gloo:all_gather", "[[4]]", "Float"]},
            "2": {"0": [39, 39, "", "", ""]},
            "3": {"0": [40, 39, "gloo:all_reduce", "[[1024]]", "Float"]}}


def ranks_of(positions, per_host=2):
    return {int(r): ("cqnode%d" % (int(r) // per_host), g) for r, g in positions.items()}


def test_the_recorded_hang_names_the_rank_that_never_joined_and_the_one_that_called_another():
    f = flight.finding(ranks_of(RECORDED), 4)
    assert (f["seq"], f["op"], f["bytes"], f["group"], f["waiting"]) == (40, "all_reduce",
                                                                         4096, "0", 3)
    assert f["missing"] == [{"rank": 2, "host": "cqnode1", "seq": 39}]
    assert f["mismatch"] == [{"rank": 1, "host": "cqnode0", "op": "all_gather", "bytes": 16,
                              "dtypes": "Float"}]
    assert flight.text(f) == ("collective #40 (all_reduce, 4.0 KiB, group 0): cqnode1 rank 2 "
                              "never joined; cqnode0 rank 1 called all_gather (16 B, Float)")


def test_a_rank_that_passes_another_size_is_named_with_its_size():
    pos = {r: {"0": [7, 6, "gloo:all_reduce", "[[1024]]", "Float"]} for r in "0123"}
    pos["3"] = {"0": [7, 6, "gloo:all_reduce", "[[2048]]", "Float"]}  # changed: the size
    f = flight.finding(ranks_of(pos), 4)
    assert f["missing"] == [] and [m["rank"] for m in f["mismatch"]] == [3]
    assert "cqnode1 rank 3 called all_reduce (8.0 KiB, Float)" in flight.text(f)


def test_two_ranks_that_disagree_are_both_named_none_is_guessed_the_odd_one():
    pos = {"0": {"0": [3, 2, "gloo:all_reduce", "[[4]]", "Float"]},
           "1": {"0": [3, 2, "gloo:broadcast", "[[4]]", "Float"]}}
    f = flight.finding(ranks_of(pos), 2)
    assert sorted(m["rank"] for m in f["mismatch"]) == [0, 1]


def test_nothing_is_named_while_a_rank_has_no_position_or_recording_is_off():
    partial = {k: v for k, v in RECORDED.items() if k != "2"}
    f = flight.finding(ranks_of(partial), 4)
    assert flight.culprits(f) == [] and "rank(s) 2" in f["note"] and flight.text(f) == ""
    off = flight.finding({}, 4)
    assert flight.culprits(off) == [] and "flight_recorder=0" in off["note"]


def test_ranks_in_step_waiting_together_or_between_collectives_name_nobody():
    same = {r: {"0": [9, 8, "gloo:all_reduce", "[[4]]", "Float"]} for r in "0123"}
    between = {r: {"0": [9, 9, "gloo:all_reduce", "[[4]]", "Float"]} for r in "0123"}
    for pos in (same, between):
        assert flight.culprits(flight.finding(ranks_of(pos), 4)) == []


def test_a_rank_that_never_used_the_default_group_never_joined_its_first_collective():
    """Recorded in the lab's hang_rank1.py run: the sleeping rank's pg_status is empty."""
    pos = {"0": {"0": [1, -1, "gloo:barrier", "[]", ""]}, "1": {}}
    f = flight.finding(ranks_of(pos, per_host=1), 2)
    assert f["missing"] == [{"rank": 1, "host": "cqnode1", "seq": -1}]
    assert flight.text(f).startswith("collective #1 (barrier, 0 B, group 0): cqnode1 rank 1")


def test_a_subgroup_counts_only_its_members():
    pos = {"0": {"0": [5, 5, "", "", ""], "1": [3, 2, "gloo:all_reduce", "[[4]]", "Float"]},
           "1": {"0": [5, 5, "", "", ""], "1": [2, 2, "", "", ""]},
           "2": {"0": [5, 5, "", "", ""]}, "3": {"0": [5, 5, "", "", ""]}}
    f = flight.finding(ranks_of(pos), 4)
    assert (f["group"], f["seq"], [m["rank"] for m in f["missing"]]) == ("1", 3, [1])


def test_where_the_others_were_when_a_rank_died():
    pos = {r: {"0": [88, 87, "gloo:all_reduce", "[[4]]", "Float"]} for r in "012345"}
    pos["5"] = {"0": [87, 87, "", "", ""]}
    assert flight.finding(ranks_of(pos), 6, failed_rank=5)["others"] == \
        "all of the other 5 ranks were in all_reduce #88"
    two = {"0": {"0": [4, 3, "gloo:broadcast", "[[4]]", "Float"]}, "1": {"0": [3, 3, "", "", ""]}}
    assert flight.finding(ranks_of(two), 2, failed_rank=1)["others"] == \
        "the other rank was in broadcast #4"


def test_ranks_computing_past_their_collectives_say_nothing_of_a_death():
    # Whether the recorder saw them before the death is timing; it explains nothing either way.
    pos = {r: {"0": [1, 1, "", "", ""]} for r in "01"}
    assert flight.finding(ranks_of(pos), 2, failed_rank=1)["others"] == ""


def test_positions_read_only_what_a_rank_wrote_sanely(tmp_path):
    good, bad, huge = (tmp_path / n for n in ("0", "1", "2"))
    for d in (good, bad, huge):
        d.mkdir()
    (good / flight.POSITION).write_text(json.dumps({"rank": 4, "pid": os.getpid(),
                                                    "pgs": RECORDED["0"]}))
    os.utime(good / flight.POSITION, (990.0, 990.0))
    (bad / flight.POSITION).write_text('{"rank": "4", "pgs": []}')
    (huge / flight.POSITION).write_text(json.dumps({"rank": 5, "pgs": {"0": [1, 0, "x" * (
        flight.FILE_MAX), "", ""]}}))
    coll, steady = flight.positions({0: str(good), 1: str(bad), 2: str(huge), 3: "/nx"}, {},
                                    procs.alive, now=1000.0)
    # A position written without the last started collective (as this one, recorded before
    # the watcher kept it) reads as unknown: -1.
    assert coll == {"4": {"0": RECORDED["0"]["0"] + [-1]}} and steady == {"4": [10.0, True]}


def test_a_dead_ranks_position_held_still_only_until_it_was_seen_dead(tmp_path):
    (tmp_path / flight.POSITION).write_text(json.dumps({"rank": 1, "pid": 1 << 22, "pgs": {}}))
    os.utime(tmp_path / flight.POSITION, (990.0, 990.0))
    first_dead = {}
    read = [flight.positions({0: str(tmp_path)}, first_dead, procs.alive, now=t)[1]
            for t in (990.5, 2000.0)]
    assert read == [{"1": [0.5, False]}, {"1": [0.5, False]}]


def test_the_environment_never_sets_the_recorders_size_empty(tmp_path):
    assert flight.rank_env(0, str(tmp_path)) == {"TORCH_FR_BUFFER_SIZE": "0"}
    on = flight.rank_env(2000, str(tmp_path))
    assert on["TORCH_FR_BUFFER_SIZE"] == "2000" and on["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert on[flight.ENV_TRIGGER] == os.path.join(str(tmp_path), flight.TRIGGER)


def test_the_watcher_is_valid_python_that_does_nothing_outside_a_rank(tmp_path, monkeypatch):
    """Every process of the run's Python imports the watcher (sitecustomize): outside a rank
    of torchrun (no error file, no RANK, or no trigger path) it starts no thread and registers
    nothing at exit; in a rank, its one thread and its exit hook. (It asserted nothing before.)"""
    import atexit
    import threading

    started, at_exit = [], []

    class Thread:
        def __init__(self, target=None, name=None, daemon=None):
            self.name = name

        def start(self):
            started.append(self.name)

    monkeypatch.setattr(threading, "Thread", Thread)
    monkeypatch.setattr(atexit, "register", at_exit.append)
    env = {"TORCHELASTIC_ERROR_FILE": str(tmp_path / "error.json"), "RANK": "3",
           flight.ENV_TRIGGER: str(tmp_path / flight.TRIGGER)}
    for missing in env:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv(missing)
        exec(compile(flight.WATCHER, "sitecustomize.py", "exec"), {})  # returns at once
        assert (started, at_exit) == ([], []), missing
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    exec(compile(flight.WATCHER, "sitecustomize.py", "exec"), {})
    assert started == ["torchfleet-flight"] and len(at_exit) == 1
    assert list(tmp_path.iterdir()) == []  # nothing written before a rank has a process group


# -- the judge ------------------------------------------------------------------------------

HOSTS = ["cqnode0", "cqnode1", "cqnode2"]


def state():
    return runstate_state(hosts=HOSTS, hang_timeout_s=20)


def beat(s, now, positions, idle_s=0.0, steady_s=30.0):
    """Each host's beat with its own ranks' positions, each held still for steady_s; idle_s 0:
    its ranks keep printing."""
    for i, h in enumerate(HOSTS):
        mine = {r: g for r, g in positions.items() if int(r) // 2 == i}
        s.report(h, now, {"t": runstate.BEAT, "alive": 2, "idle_s": idle_s,
                          "last_line": "step", "pid": 1, "coll": mine,
                          "steady": {r: [steady_s, True] for r in mine}})


def stuck(seq=40, late="3"):
    pos = {str(r): {"0": [seq, seq - 1, "gloo:all_reduce", "[[1048576]]", "Float"]}
           for r in range(6)}
    pos[late] = {"0": [seq - 1, seq - 1, "", "", ""]}
    return pos


def test_a_rank_that_keeps_printing_cannot_hide_a_hang():
    s = state()
    for t in range(1001, 1022):
        beat(s, t, stuck())
    assert s.tick(1021) is None  # stalled 20 s: not yet more than hang_timeout_s
    failure = s.tick(1022)
    assert failure["reason"] == runstate.HANG
    assert failure["detail"] == ("hang at collective #40 (all_reduce, 4.0 MiB, group 0): "
                                 "cqnode1 rank 3 never joined")
    assert failure["collective"]["missing"] == [{"rank": 3, "host": "cqnode1", "seq": 39}]


def test_collectives_that_advance_are_no_hang_even_when_every_log_is_quiet_briefly():
    s = state()
    for t in range(1001, 1060):
        beat(s, t, {str(r): {"0": [t, t - 1, "gloo:all_reduce", "[[4]]", "Float"]}
                    for r in range(6)})
        assert s.tick(t) is None


def test_between_collectives_for_long_is_the_logs_rule_not_a_stall():
    """Every rank past its last collective (an evaluation without collectives): only the
    logs decide, and they keep moving."""
    s = state()
    done = {str(r): {"0": [9, 9, "gloo:all_reduce", "[[4]]", "Float"]} for r in range(6)}
    for t in range(1001, 1060):
        beat(s, t, done)
        assert s.tick(t) is None


def test_a_rank_that_died_waiting_is_a_consequence_of_the_one_that_never_joined():
    s = state()
    beat(s, 1001, stuck(late="3"))
    first = s.exited("cqnode0", 1010, 1, root_cause={"rank": 0, "local_rank": 0,
                                                     "exitcode": 1})
    assert first["consequence"] and first["waited"]
    # The rank that never joined is the first failure, on its host, at once (issue 48: the
    # verdict named cqnode0's consequence first, and the restart found no host to explain it).
    assert (s.failure["host"], s.failure["rank"], s.failure["stalled"]) == ("cqnode1", 3, True)
    assert runstate.failure_text(s.failure) == (
        "cqnode1, rank 3 never joined collective #40 (all_reduce, 4.0 MiB, group 0), which "
        "rank 0 on cqnode0 died waiting in")
    assert "it waited in a collective another rank did not join" in \
        runstate.failure_text(first)
    s.exited("cqnode1", 1011, 1, root_cause={"rank": 3, "local_rank": 1, "exitcode": 1})
    assert (s.failure["host"], s.failure["rank"]) == ("cqnode1", 3)  # the cause stays first
    assert sum(1 for f in s.failures if f.get("stalled")) == 1


def test_positions_that_were_still_moving_name_nobody():
    """A rank that runs twenty collectives a second is seen up to a beat late: positions that
    did not hold still are not one moment's, and a rank behind in them proves nothing."""
    s = state()
    beat(s, 1001, stuck(late="3"), steady_s=0.4)
    s.exited("cqnode0", 1001.5, 1, root_cause={"rank": 0, "local_rank": 0, "exitcode": 1})
    assert not s.failure["consequence"] and flight.culprits(s.failure["collective"]) == []
    assert "still moving" in s.failure["collective"]["note"]
    assert runstate.failure_text(s.failure) == "cqnode0, rank 0 exited with 1"


def test_a_rank_that_died_is_told_with_where_the_others_were():
    s = state()
    pos = {str(r): {"0": [88, 87, "gloo:all_reduce", "[[4]]", "Float"]} for r in range(6)}
    pos["4"] = {"0": [87, 87, "", "", ""]}
    beat(s, 1001, pos)
    s.exited("cqnode2", 1005, 1, root_cause={"rank": 4, "local_rank": 0, "exitcode": 1})
    assert runstate.failure_text(s.failure) == (
        "cqnode2, rank 4 exited with 1; collective #88 (all_reduce, 16 B, group 0): cqnode2 "
        "rank 4 never joined")
    assert s.failure["collective"]["others"] == "all of the other 5 ranks were in all_reduce #88"


def test_a_rank_key_that_is_a_digit_but_no_number_is_dropped_not_raised():
    """'²' passes str.isdigit() and fails int(): it once raised out of the master's loop."""
    assert flight.clean_steady({"\u00b2": [1.0, True], "3": [2.0, True]}, range(2, 4)) == {
        "3": [2.0, True]}
    assert flight.clean({"\u00b2": {}, "2": {}}, range(2, 4)) == {"2": {}}


def test_a_host_cannot_report_another_hosts_ranks():
    s = state()
    s.report("cqnode0", 1001, {"t": runstate.BEAT, "alive": 2, "coll": stuck()})
    assert sorted(s.positions()) == [0, 1]


positions_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 1 << 70) | st.floats() | st.text(max_size=30),
    lambda children: st.lists(children, max_size=6)
    | st.dictionaries(st.text(max_size=4), children, max_size=6), max_leaves=40)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(coll=positions_json, other=positions_json)
def test_any_positions_from_a_host_leave_the_judge_standing_and_name_only_its_ranks(coll,
                                                                                   other):
    s = state()
    s.report("cqnode1", 1001, {"t": runstate.BEAT, "alive": 2, "coll": coll})
    s.report("cqnode2", 1001, {"t": runstate.BEAT, "alive": 2, "coll": {"4": other, "5": coll},
                               "steady": {"4": other, "5": [coll, True]}})
    assert set(s.positions()) <= {2, 3, 4, 5}
    s.tick(1100)
    f = s.finding(1100)
    assert set(flight.culprits(f)) <= {2, 3, 4, 5}
    flight.text(f)
    runstate.failure_text(s.failure)


FLIGHT = Path(__file__).resolve().parent.parent / "fixtures" / "flight"


def watcher_namespace():
    """The watcher's functions, from the sitecustomize text itself (outside a rank it only
    defines them)."""
    namespace = {}
    env = {k: os.environ.pop(k) for k in ("TORCHELASTIC_ERROR_FILE", "RANK", flight.ENV_TRIGGER)
           if k in os.environ}
    try:
        exec(compile(flight.WATCHER, "sitecustomize.py", "exec"), namespace)
    finally:
        os.environ.update(env)
    return namespace


def watcher_reader(names=None):
    """The watcher's reading of dumps (status dumps, entry dumps) -> positions; names: the
    {(source, pg_id): group} it learned so far."""
    namespace = watcher_namespace()
    names = {} if names is None else names
    return lambda status, entries: namespace["_torchfleet_pgs"](
        [("_dump_fr_trace", d) for d in status], [("_dump_fr_trace", d) for d in entries],
        names)[0]


def test_the_watcher_reads_a_recorded_gloo_dump_of_a_rank_waiting_in_a_collective():
    read = watcher_reader()
    status = json.loads((FLIGHT / "gloo_2.13_rank0_waiting_in_4_status.json").read_text())
    full = json.loads((FLIGHT / "gloo_2.13_rank0_waiting_in_4.json").read_text())
    assert read([status], []) == {}  # pg 0's name is not known before an entry names it
    assert read([status], [full]) == {"0": [4, 3, "gloo:all_reduce", "[[1024]]", "Float", -1]}
    assert read([status], []) == {"0": [4, 3, "", "", "", -1]}  # gloo starts nothing apart
    assert flight.clean_groups(read([status], [full])) is not None


def test_the_watcher_reads_the_nccl_dump_of_torchs_tutorial():
    dump = json.loads((FLIGHT / "nccl_tutorial_dump.json").read_text())
    assert watcher_reader()([dump], [dump]) == {"0": [2, 2, "", "", "", -1]}  # #2 done
    dump["pg_status"]["0"]["last_enqueued_collective"] = 1  # changed: #1 pending
    dump["pg_status"]["0"]["last_completed_collective"] = 0
    assert watcher_reader()([dump], [dump]) == {"0": [1, 0, "nccl:all_reduce", "[[3, 4]]",
                                                      "Float", -1]}
    assert flight.nbytes("[[3, 4]]", "Float") == 48


# Recorded on a real GPU host (tests/fixtures/h200-1gpu/hang-nccl/, one H200, NCCL 2.28.9):
# after 20 all_reduces a GPU kernel spins, so all_reduce #21 is enqueued and never completes.
H200_HANG = FIXTURES / "h200-1gpu" / "hang-nccl"


def test_a_collective_every_rank_joined_that_never_completed_is_said_so_recorded_nccl(tmp_path):
    position = json.loads((H200_HANG / "fr_position.json").read_text())
    s = runstate.RunState("r1", ["gpuhost"], 1, now=1000.0, join_timeout_s=60,
                          lost_after_s=30, hang_timeout_s=20, job_timeout_s=3600)
    for t in range(1001, 1023):
        s.report("gpuhost", t, {"t": runstate.BEAT, "alive": 1, "idle_s": t - 1001.0,
                                "last_line": "warm: 20 all_reduce done", "pid": 1,
                                "coll": {"0": position["pgs"]}, "steady": {"0": [30.0, True]}})
        failure = s.tick(t)
    assert failure["reason"] == runstate.HANG and failure["host"] is None
    assert failure["detail"] == (
        "hang at collective #21 (all_reduce, 4.0 MiB, group 0): every rank joined it and it "
        "never completed: a GPU, NCCL or the network is stuck, not a rank")
    # Where the rank waits, from its recorded py-spy dump gathered with its logs.
    dump = tmp_path / "logs" / "gpuhost" / "attempt_0" / "0" / "py-spy-dump.txt"
    dump.parent.mkdir(parents=True)
    dump.write_text((H200_HANG / "py-spy-dump.txt").read_text())
    first = summary.first_failure(s.record(), str(tmp_path), 20)
    assert first["reason"].startswith(failure["detail"] + "; gpuhost rank 0 is in <module> "
                                      "(gpu_hang.py:19)")
    assert summary.hang_detail(failure, "gpuhost").startswith(
        "its ranks waited in collective #21 (all_reduce), which every rank joined and none "
        "completed")
    # The recorded master's record kept the same finding (its words were the old ones).
    kept = json.loads((H200_HANG / "run_state.json").read_text())["failure"]["collective"]
    assert flight.all_in(kept) and flight.text(dict(kept, backend="nccl")) == \
        failure["detail"][len("hang at "):]


def test_every_rank_in_a_gloo_collective_that_stalled_blames_no_rank():
    s = state()
    pos = {str(r): {"0": [40, 39, "gloo:all_reduce", "[[256]]", "Float"]} for r in range(6)}
    for t in range(1001, 1023):
        beat(s, t, pos)
        failure = s.tick(t)
    assert failure["detail"].endswith("every rank joined it and it never completed: gloo or "
                                      "the network is stuck, not a rank")
    assert flight.culprits(failure["collective"]) == []
    # A rank that died with every rank in the collective is no hang: its words stay its own.
    assert runstate.collective_words({"reason": runstate.FAILED,
                                      "collective": failure["collective"]}) == ""


def test_with_nccl_timing_the_rank_whose_gpu_never_started_the_collective_is_named():
    """Recorded on the H200 (tests/fixtures/h200-1gpu/flight/): all_reduce #21 queued behind a
    spinning kernel. With TORCH_NCCL_ENABLE_TIMING=1, pg_status says enqueued 21 / started 20
    / completed 20: that rank's GPU never started #21. Without timing, started is -1 and
    nobody is named."""
    read = watcher_reader()
    timed = json.loads((FIXTURES / "h200-1gpu" / "flight" / "stuck_timing_during.json").read_text())
    plain = json.loads((FIXTURES / "h200-1gpu" / "flight" / "stuck_plain_during.json").read_text())
    timed_pos, plain_pos = read([timed], [timed]), read([plain], [plain])
    assert timed_pos["0"][:2] + timed_pos["0"][5:] == [21, 20, 20]
    assert plain_pos["0"][5] == -1
    found = flight.finding({0: ("gpuhost", flight.clean_groups(timed_pos))}, 1)
    assert found["not_started"] == [{"rank": 0, "host": "gpuhost"}]
    assert flight.text(found) == (
        "collective #21 (all_reduce, 4.0 MiB, group 0): every rank joined it and it never "
        "completed: it never started on the GPU of gpuhost rank 0 (a GPU still busy with "
        "earlier work, or stuck), not a rank")
    untimed = flight.finding({0: ("gpuhost", flight.clean_groups(plain_pos))}, 1)
    assert untimed["not_started"] == [] and "a GPU, NCCL or the network is stuck" in \
        flight.text(untimed)


def test_a_rank_behind_in_one_group_because_it_waits_in_another_is_not_named():
    """3 hosts x 2 ranks: tensor-parallel groups [0, 1] ("1"), [2, 3] ("2"), [4, 5] ("3"),
    data-parallel [0, 2, 4] ("4") and [1, 3, 5] ("5"), both all-reduced every step (the hang
    lab's `groups` case). Rank 3 stopped between its tensor-parallel #15 and its
    data-parallel #15: ranks 1 and 5 wait for it there; ranks 0, 2 and 4 went on to the
    tensor-parallel #16, where their partners 1 and 5 are "behind" only because they wait in
    #15 of group 5. Rank 3 is named, never rank 1 or 5 (before, group 1's rank 1 was)."""
    op, size, dtype = "gloo:all_reduce", "[[262144]]", "Float"

    def at(enq, done):
        return [enq, done, op, size, dtype]
    ranks = {
        0: ("node0", {"1": at(16, 15), "4": at(15, 15)}),
        1: ("node0", {"1": at(15, 15), "5": at(15, 14)}),
        2: ("node1", {"2": at(16, 15), "4": at(15, 15)}),
        3: ("node1", {"2": at(15, 15), "5": at(14, 14)}),
        4: ("node2", {"3": at(16, 15), "4": at(15, 15)}),
        5: ("node2", {"3": at(15, 15), "5": at(15, 14)}),
    }
    f = flight.finding(ranks, 6)
    assert flight.culprits(f) == [3], f
    assert (f["group"], f["seq"]) in (("2", 16), ("5", 15))
    # Where every rank behind waits elsewhere (two ranks that called two groups' collectives
    # in opposite orders: no rank is free), the first group's finding stands, as before.
    cycle = {0: ("node0", {"1": at(5, 4), "2": at(4, 4)}),
             1: ("node1", {"1": at(4, 4), "2": at(5, 4)})}
    f = flight.finding(cycle, 2)
    assert flight.culprits(f) == [1] and (f["group"], f["seq"]) == ("1", 5)


def test_a_hang_in_one_of_two_tensor_parallel_groups_names_the_rank_that_never_joined():
    """Recorded here (tests/fixtures/flight/tp_dp_hang.py, README there): tensor-parallel
    groups [0, 1] ("1") and [2, 3] ("2"), data-parallel [0, 2] ("3") and [1, 3] ("4"); rank 0
    stopped before its data-parallel all_reduce #11. pg_id 1 is "1" on ranks 0-1 and "2" on
    ranks 2-3: matched by pg_id, rank 2 (in step in its own group) was "behind" rank 1's #12
    and was named beside rank 0."""
    ranks = {}
    for rank in range(4):
        dump = json.loads((FLIGHT / ("gloo_2.13_tp_dp_hang_rank%d.json" % rank)).read_text())
        status = {k: v for k, v in dump.items() if k != "entries"}
        read = watcher_reader()  # each rank's watcher learns its own pg_ids' names
        assert read([status], []) == {}
        groups = flight.clean_groups(read([status], [dump]))
        # From then on without the entries (the op is read from them only).
        assert {g: v[:2] for g, v in read([status], []).items()} == \
            {g: v[:2] for g, v in groups.items()}
        ranks[rank] = ("cqnode%d" % (rank // 2), groups)
    assert {r: sorted(g) for r, (_h, g) in ranks.items()} == {
        0: ["1", "3"], 1: ["1", "4"], 2: ["2", "3"], 3: ["2", "4"]}
    f = flight.finding(ranks, 4)
    assert flight.culprits(f) == [0] and (f["group"], f["seq"]) == ("1", 12)
    assert flight.text(f).startswith("collective #12 (all_reduce, 4.0 KiB, group 1): "
                                     "cqnode0 rank 0 never joined")


def test_the_watcher_dates_a_ranks_first_collective_from_a_recorded_gloo_dump():
    """Goodput's init ends when every rank's first collective completed: with gloo, the first
    one runs in its caller and completes when the last rank calls it, so each rank's own call
    time (the earliest entry's time_created_ns; gloo's entries say 0 for when each
    completed), the latest over the ranks, is that moment."""
    first = watcher_namespace()["_torchfleet_first"]
    dump = json.loads((FLIGHT / "gloo_2.13_rank1_late_rank0.json").read_text())
    assert all(e["time_discovered_completed_ns"] == 0 for e in dump["entries"])
    want = min(e["time_created_ns"] for e in dump["entries"]) / 1e9
    assert first([("_dump_fr_trace", dump)]) == want == 1795770013.989346261
    # The entries in any order, a p2p entry and an entry without a time change nothing.
    dump["entries"] = dump["entries"][::-1] + [
        {"is_p2p": True, "time_created_ns": 1}, {"time_created_ns": 0}]
    assert first([("_dump_fr_trace", dump)]) == want
    assert first([("_dump_fr_trace", {"entries": []})]) is None
    # NCCL (torch's tutorial dump): the first collective's completion, which its watchdog
    # recorded after the call (the communicator's set-up happens there).
    nccl = json.loads((FLIGHT / "nccl_tutorial_dump.json").read_text())
    head = min(nccl["entries"], key=lambda e: e["time_created_ns"])
    assert first([("_dump_nccl_trace", nccl)]) == head["time_discovered_completed_ns"] / 1e9 \
        > head["time_created_ns"] / 1e9


def test_positions_pass_each_ranks_first_collective_as_an_age_on_the_hosts_clock(tmp_path):
    dirs = {}
    for lr, first in enumerate((990.25, "x", -5.0, 2000.0, True)):
        d = tmp_path / str(lr)
        d.mkdir()
        (d / flight.POSITION).write_text(json.dumps({"rank": lr, "pid": os.getpid(),
                                                     "pgs": RECORDED["0"], "first": first}))
        dirs[lr] = str(d)
    firsts = {}
    coll, _steady = flight.positions(dirs, {}, procs.alive, now=1000.0, firsts=firsts)
    assert sorted(coll) == ["0", "1", "2", "3", "4"]  # (a bad "first" spoils no position)
    assert firsts == {"0": 9.75}
    # The master dates it on its own clock, once a rank, and init is done once every rank
    # of the run has one.
    s = runstate.RunState("r", ["a"], 2, now=5000.0)
    s.report("a", 5010.0, {"t": runstate.BEAT, "alive": 2, "coll": coll, "first": firsts})
    assert s.record()["timeline"]["init_done"] is None
    s.report("a", 5011.0, {"t": runstate.BEAT, "alive": 2, "first": {"1": 0.5, "0": 0.0}})
    assert s.record()["timeline"]["init_done"] == 5010.5 and s.firsts[0] == 5000.25
