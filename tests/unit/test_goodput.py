"""Goodput (issue 59): a run's buckets add up to its wall time whatever its timeline says, the
worked cases come out as a person computes them by hand, the advice and the one-line summary
say what they should, and `torchfleet goodput` reads a runs root, hostile files included."""
from __future__ import annotations

import json
import math
import os
import time

from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import goodput as gp
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.goodput import (
    BLIND, BUCKETS, NO_CHECKPOINT_DIR, advice, duration, goodput, line, runs_goodput)
from hypothesis import given, settings
from hypothesis import strategies as st

from torchfleet import cli
from tests.conftest import examples

T0 = 1_790_000_000.0  # 2026-09


def ckpt(began, ended, step=None, stall=False, path=None):
    return {"path": path or "step_%s.pt" % step, "began": T0 + began, "ended": T0 + ended,
            "step": step, "kind": "file", "bytes": 1, "stall": stall}


def attempt(n, launch, running, init_done, failed, stopped, failure=None, checkpoints=()):
    at = {"attempt": n, "failure": failure, "checkpoints": list(checkpoints),
          "checkpoint_warnings": []}
    for key, value in (("launch", launch), ("running", running), ("init_done", init_done),
                       ("failed", failed), ("stopped", stopped)):
        at[key] = None if value is None else T0 + value
    return at


def timeline(*attempts, checkpoint_dir="/shared/ckpt", now=None):
    return {"started": T0, "now": None if now is None else T0 + now,
            "checkpoint_dir": checkpoint_dir, "attempts": list(attempts)}


def adds_up(g):
    return math.isclose(sum(v or 0.0 for v in g["buckets"].values()), g["wall_s"],
                        abs_tol=1e-6)


# ---- any timeline: no bucket negative, the buckets add up to the wall time

TIME = st.one_of(st.none(), st.floats(0, 1e7).map(lambda x: T0 + x),
                 st.sampled_from([float("nan"), float("inf"), -5.0, 1e300, 10**400, True, "10",
                                  [1]]))
CHECKPOINT = st.fixed_dictionaries({"began": TIME, "ended": TIME, "stall": st.booleans(),
                                    "step": st.one_of(st.none(), st.integers(0, 10**6)),
                                    "path": st.text(max_size=5)},
                                   optional={"stall_s": st.one_of(TIME, st.floats(0, 1e4)),
                                             "files": st.one_of(st.integers(-2, 10), TIME),
                                             "partial": st.one_of(st.booleans(), TIME),
                                             "of": st.one_of(st.integers(-2, 10), TIME)})
FOLDED = st.one_of(TIME, st.fixed_dictionaries({
    "saves": st.one_of(st.integers(-1, 10**6), TIME), "stall_s": TIME, "save_s": TIME,
    "first": TIME, "last": TIME}))
ATTEMPT = st.fixed_dictionaries({
    "attempt": st.integers(0, 9), "launch": TIME, "running": TIME, "init_done": TIME,
    "failed": TIME, "stopped": TIME,
    "failure": st.one_of(st.none(), st.fixed_dictionaries({"check": st.sampled_from(
        ["run.hardware", "host.lost", "run.exit", "run.stopped_by_user", ""]), "host": st.text(max_size=4)})),
    "checkpoints": st.lists(CHECKPOINT, max_size=5),
    "checkpoint_warnings": st.lists(st.text(max_size=10), max_size=2),
    "checkpoint_blind": st.booleans()},
    optional={"last_collective": TIME, "checkpoints_folded": FOLDED})


@settings(max_examples=examples(400), deadline=None)
@given(started=TIME, now=TIME, attempts=st.lists(ATTEMPT, max_size=4),
       checkpoint_dir=st.sampled_from(["", "/ckpt", None]), reported=TIME,
       nnodes=st.one_of(TIME, st.integers(-1, 600)),
       history=st.one_of(TIME, st.fixed_dictionaries({"host_s": TIME, "failures": st.one_of(
           st.integers(-1, 100), TIME)})))
def test_any_timeline_gives_buckets_that_add_up_to_the_wall_time(started, now, attempts,
                                                                 checkpoint_dir, reported,
                                                                 nnodes, history):
    g = goodput({"started": started, "now": now, "checkpoint_dir": checkpoint_dir,
                 "attempts": attempts, "reported": reported, "nnodes": nnodes},
                history=history)
    assert g["wall_s"] >= 0 and 0 <= g["ratio"] <= 1
    assert all(v is None or v >= 0 for v in g["buckets"].values())
    assert adds_up(g), g
    assert len(g["attempts"]) == len(attempts)
    for a in g["attempts"]:
        assert all(v is None or v >= 0 for v in a["buckets"].values())
    # The run's buckets are its attempts' summed.
    for k in BUCKETS:
        if g["buckets"][k] is not None and g["attempts"]:
            assert math.isclose(g["buckets"][k], sum(a["buckets"][k] or 0.0 for a in g["attempts"]),
                                abs_tol=1e-6)
    unknown = NO_CHECKPOINT_DIR in g["unknown"] or any(BLIND in u for u in g["unknown"]) or \
        any(u.startswith("lost work is unknown: the checkpoint watch saw no save")
            for u in g["unknown"])
    assert g["buckets"]["lost_work"] is not None or unknown
    assert unknown == any(a["buckets"]["lost_work"] is None for a in g["attempts"])
    assert isinstance(line(g), str)
    json.dumps(g, allow_nan=False)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.floats(0, 1e6), min_size=5, max_size=5), st.booleans(), st.booleans())
def test_a_monotonic_timeline_is_read_as_it_is(offsets, fails, watched):
    launch, running, init_done, failed, stopped = sorted(offsets)
    g = goodput(timeline(attempt(0, launch, running, init_done, failed if fails else None,
                                 stopped, {"check": "run.exit", "host": "a"} if fails else None),
                         checkpoint_dir="/c" if watched else ""))
    b = g["buckets"]

    def near(x, y):
        return math.isclose(x, y, abs_tol=2e-3)  # (ms rounding)

    assert near(g["wall_s"], stopped)
    assert near(b["preflight"], launch) and near(b["launch"], running - launch)
    assert near(b["init"], init_done - running)
    if fails:
        assert near(b["detection"], stopped - failed)
        # No save seen at all (issue 67): what was lost is unknown, not all the training.
        trained = round(T0 + failed, 3) > round(T0 + init_done, 3)
        assert b["lost_work"] is None if not watched or trained else b["lost_work"] == 0
    else:
        assert b["detection"] == 0 and b["lost_work"] == 0
        assert near(b["kept_training"], stopped - init_done)
    assert adds_up(g)


# ---- worked cases, by hand


def test_a_clean_run_keeps_all_its_training():
    g = goodput(timeline(attempt(0, 20, 35, 50, None, 3650,
                                 checkpoints=[ckpt(1000, 1030, 100), ckpt(2000, 2030, 200)])))
    assert g["wall_s"] == 3650
    assert g["buckets"] == {"preflight": 20, "launch": 15, "init": 15, "kept_training": 3600,
                            "checkpoint_stall": 0, "lost_work": 0, "detection": 0,
                            "teardown": 0, "restart": 0}
    assert g["ratio"] == round(3600 / 3650, 6) and g["failures"] == [] and g["unknown"] == []
    assert g["save_s"] == 30 and g["interval_s"] == 1000 and g["mtbf_s"] is None
    assert [c["step"] for c in g["checkpoints"]] == [100, 200]
    assert set(g["checkpoints"][0]) == {"path", "began", "ended", "step", "files"}
    assert line(g) == "goodput 99 %; no failure"


def test_one_failure_with_checkpoints_costs_what_a_person_computes():
    # T0 -> 30 s preflight; launch 30-50, init 50-70; saves 600-640 (stalled the ranks) and
    # 1200-1210 (did not: training went on while it was written, so it holds the state of
    # 1200); rank dies at 1500, every rank stopped at 1512; the re-check and decision until
    # 1560; second attempt: launch 1560-1575, init 1575-1600, clean end at 3000.
    first = attempt(0, 30, 50, 70, 1500, 1512, {"check": "run.hardware", "host": "node2"},
                    [ckpt(600, 640, 100, stall=True), ckpt(1200, 1210, 200)])
    second = attempt(1, 1560, 1575, 1600, None, 3000)
    g = goodput(timeline(first, second))
    b = g["buckets"]
    assert g["wall_s"] == 3000
    assert b["lost_work"] == 1500 - 1200        # since the last checkpoint's state
    assert b["detection"] == 12 and b["restart"] == 48
    assert b["checkpoint_stall"] == 40
    assert b["launch"] == 20 + 15 and b["init"] == 20 + 25 and b["preflight"] == 30
    assert b["kept_training"] == (1500 - 70) - 40 - 300 + (3000 - 1600)
    assert adds_up(g)
    assert g["failures"] == [{"attempt": 0, "check": "run.hardware", "host": "node2",
                              "at": T0 + 1500, "cost_s": 300 + 12 + 48 + 15 + 25}]
    assert g["attempts"][0]["buckets"]["restart"] == 48
    assert g["attempts"][1]["buckets"]["preflight"] == 0
    assert g["mtbf_s"] == 3000 and g["unknown"] == []
    assert line(g) == ("goodput %d %%; 1 restart cost 6 min 40 s: 5 min lost since the "
                       "last checkpoint" % round(100 * b["kept_training"] / 3000))


def test_without_checkpoint_dir_lost_work_is_unknown_and_the_fix_is_named():
    g = goodput(timeline(attempt(0, 10, 20, 30, 1000, 1010, {"check": "run.oom", "host": "a"}),
                         attempt(1, 1050, 1060, 1070, None, 2000), checkpoint_dir=""))
    assert g["buckets"]["lost_work"] is None
    assert g["attempts"][0]["buckets"]["lost_work"] is None
    assert g["attempts"][1]["buckets"]["lost_work"] == 0
    assert "-e checkpoint_dir=<where the script saves>" in g["unknown"][0]
    assert "upper bound" in g["unknown"][0]
    # The unknown time stays kept, so the buckets still add up.
    assert g["buckets"]["kept_training"] == (1000 - 30) + (2000 - 1070)
    assert adds_up(g)
    assert g["failures"][0]["cost_s"] == 10 + 40 + 10 + 10
    assert line(g) == ("goodput at most 95 %; 1 restart cost at least 1 min 10 s: lost work "
                       "unknown (no checkpoint_dir)")


def test_a_clean_run_without_checkpoint_dir_lost_nothing():
    g = goodput(timeline(attempt(0, 10, 20, 30, None, 1000), checkpoint_dir=""))
    assert g["buckets"]["lost_work"] == 0 and g["unknown"] == []


def test_a_save_cut_by_the_failure_is_not_kept():
    # The save of step 300 began at 1490 and stopped growing at 1500.5, when the rank died at
    # 1500: it is no checkpoint to resume from; the work since step 200's (1210) is lost. Its
    # stall after that checkpoint is inside the lost work, not counted twice.
    cut = ckpt(1490, 1500.5, 300, stall=True)
    g = goodput(timeline(attempt(0, 0, 10, 20, 1500, 1505, {"check": "run.exit", "host": "a"},
                                 [ckpt(1200, 1210, 200, stall=True), cut])))
    b = g["buckets"]
    assert b["lost_work"] == 1500 - 1210 and b["checkpoint_stall"] == 10
    assert b["kept_training"] == (1500 - 20) - 10 - 290
    # Nor does it tell how long a save takes.
    assert g["save_s"] == 10
    # Listed still: the user sees what was written.
    assert [c["step"] for c in g["checkpoints"]] == [200, 300]
    # One that ended just inside the margin is not kept either (step 200's, written while
    # training went on, holds the state of 1200).
    g = goodput(timeline(attempt(0, 0, 10, 20, 1500, 1505, {"check": "run.exit", "host": "a"},
                                 [ckpt(1200, 1210, 200), ckpt(1490, 1499.5, 300)])))
    assert g["buckets"]["lost_work"] == 300


def test_a_failure_during_init_loses_no_training():
    # A rank died at 40, before every rank completed its first collective: no training yet,
    # the time is init's, and nothing was lost.
    g = goodput(timeline(attempt(0, 10, 20, None, 40, 45, {"check": "run.exit", "host": "b"}),
                         attempt(1, 60, 70, 80, None, 500)))
    b0 = g["attempts"][0]["buckets"]
    assert b0["init"] == 20 and b0["lost_work"] == 0 and b0["kept_training"] == 0
    assert b0["detection"] == 5 and b0["restart"] == 15
    assert g["failures"][0]["cost_s"] == 5 + 15 + 10 + 10
    assert any("attempt 0: no collective" in u for u in g["unknown"])
    assert line(g).endswith("; 1 restart cost 40 s: no training lost")
    assert adds_up(g)


def test_a_live_run_counts_to_now():
    g = goodput(timeline(attempt(0, 10, 20, 30, None, None), now=1000))
    assert g["live"] and g["wall_s"] == 1000 and g["buckets"]["kept_training"] == 970
    assert line(g) == "goodput 97 % so far; no failure"
    # Still in its init: nothing unknown yet, the time is init's so far.
    g = goodput(timeline(attempt(0, 10, 20, None, None, None), now=100))
    assert g["buckets"]["init"] == 80 and g["unknown"] == [] and g["ratio"] == 0
    # Failed, not yet stopped: detection so far.
    g = goodput(timeline(attempt(0, 10, 20, 30, 900, None, {"check": "host.lost", "host": "c"},
                                 [ckpt(500, 510, 1)]), now=1000))
    assert g["buckets"]["detection"] == 100 and g["buckets"]["lost_work"] == 400


def test_a_timeline_out_of_order_is_clipped_not_negative():
    # running before launch, stopped before failed, the second launch before the first stop.
    g = goodput(timeline(attempt(0, 100, 90, 120, 500, 400, {"check": "run.exit", "host": "a"}),
                         attempt(1, 450, 460, 470, None, 1000)))
    assert all(v is None or v >= 0 for v in g["buckets"].values())
    assert g["attempts"][0]["buckets"]["launch"] == 0
    assert g["attempts"][0]["buckets"]["detection"] == 0
    assert g["attempts"][0]["buckets"]["restart"] == 0
    # The second attempt starts where the first stopped (500): its launch and init collapse.
    assert g["attempts"][1]["buckets"]["launch"] == g["attempts"][1]["buckets"]["init"] == 0
    assert g["attempts"][1]["buckets"]["kept_training"] == 500
    assert adds_up(g) and g["wall_s"] == 1000


def test_overlapping_stalls_count_once():
    g = goodput(timeline(attempt(0, 0, 0, 0, None, 1000, checkpoints=[
        ckpt(100, 160, 1, stall=True, path="a.pt"), ckpt(130, 190, 1, stall=True, path="b")])))
    assert g["buckets"]["checkpoint_stall"] == 90


def test_a_synchronous_save_stalls_for_its_stalled_seconds_not_all_or_nothing():
    # A 180 s save with one collective 5 s in (the record's stall_s: 178 of its 180 s), and an
    # async one that paused training 6 s: those seconds, not the saves' whole windows.
    g = goodput(timeline(attempt(0, 0, 0, 0, None, 1000, checkpoints=[
        dict(ckpt(100, 280, 1), stall=True, stall_s=178.0),
        dict(ckpt(500, 560, 2), stall=True, stall_s=6.0)])))
    assert g["buckets"]["checkpoint_stall"] == 178 + 6
    assert g["buckets"]["kept_training"] == 1000 - 184 and adds_up(g)


def test_an_async_save_keeps_the_training_to_its_start_a_stall_to_its_end():
    # Training went on while step 200 was written (1200-1260): its state is that of 1200, so
    # the failure at 1500 loses 300 s. A synchronous one (every rank waited) keeps to 1260.
    fail = {"check": "run.exit", "host": "a"}
    g = goodput(timeline(attempt(0, 0, 10, 20, 1500, 1505, fail, [ckpt(1200, 1260, 200)])))
    assert g["buckets"]["lost_work"] == 300 and g["buckets"]["checkpoint_stall"] == 0
    g = goodput(timeline(attempt(0, 0, 10, 20, 1500, 1505, fail,
                                 [dict(ckpt(1200, 1260, 200), stall=True, stall_s=57.0)])))
    assert g["buckets"]["lost_work"] == 240 and g["buckets"]["checkpoint_stall"] == 57
    assert adds_up(g)


def test_per_rank_shard_files_are_one_save():
    # 8 ranks each write model_rank{r}_step{N}.pt every 30 min, 40 s a save, for 6 h, and a
    # failure every 6 h: the advice is the saves', not the shards' (milliseconds apart).
    shards = [ckpt(1800 * k + 0.05 * r, 1800 * k + 40 + 0.1 * r, 100 * k,
                   path="model_rank%d_step%d.pt" % (r, 100 * k))
              for k in range(1, 12) for r in range(8)]
    g = goodput(timeline(attempt(0, 0, 0, 0, 21600, 21610, {"check": "run.hardware", "host": "b"},
                                 shards)))
    assert g["interval_s"] == 1800 and g["save_s"] == 40.7
    assert len(g["checkpoints"]) == 11 and {c["files"] for c in g["checkpoints"]} == {8}
    assert g["advice"] == ""  # every 30 min is within 2x of sqrt(2 x 40 s x 6 h) = 22 min
    assert adds_up(g)


def test_a_finished_run_without_its_first_collective_seen_is_not_all_init():
    # flight_recorder=0 (or an old torch): no rank's first collective is ever reported.
    g = goodput(timeline(attempt(0, 10, 20, None, None, 3610)))
    assert g["buckets"]["init"] == 0 and g["buckets"]["kept_training"] == 3590
    assert g["ratio"] == round(3590 / 3610, 6) and adds_up(g)
    assert g["unknown"] == ["attempt 0: no rank's first collective was seen (flight_recorder=0 "
                            "or an old torch): init counts as training; goodput is an upper "
                            "bound"]
    # A failed one that saved a checkpoint trained too: its lost work counts from it.
    g = goodput(timeline(attempt(0, 10, 20, None, 1000, 1005, {"check": "run.exit", "host": "a"},
                                 [dict(ckpt(500, 510, 1), stall=True)])))
    assert g["buckets"]["init"] == 0 and g["buckets"]["lost_work"] == 490


def test_the_checkpoint_watch_warnings_are_said():
    a = attempt(0, 0, 1, 2, None, 10)
    a["checkpoint_warnings"] = ["checkpoint_dir /x does not exist"]
    assert goodput(timeline(a))["unknown"] == [
        "checkpoint watch: checkpoint_dir /x does not exist"]


def test_a_checkpoint_dir_the_watch_could_not_read_leaves_lost_work_unknown():
    # The directory never appeared (a wrong path) or could not be read: no checkpoint seen
    # says nothing of what was lost, so it is unknown, not every second of the training.
    fails = attempt(0, 0, 1, 2, 50, 52, {"check": "run.exit", "host": "a"},
                    checkpoints=[ckpt(5, 6, 10, stall=True)])
    assert goodput(timeline(fails))["buckets"]["lost_work"] == 44
    fails["checkpoint_blind"] = True
    g = goodput(timeline(fails))
    assert g["buckets"]["lost_work"] is None and g["unknown"][0] == BLIND
    assert g["buckets"]["kept_training"] == 47 and adds_up(g)


def test_nothing_but_garbage_raises_nothing():
    for bad in (None, [], "x", {"attempts": "x"}, {"attempts": [None, 3]}, {"started": "x"}):
        g = goodput(bad)
        assert g["wall_s"] == 0 and g["ratio"] == 0 and adds_up(g)
    assert line({}) == "goodput: nothing measured yet"


# ---- advice


def test_the_advice_names_the_interval_that_loses_least_when_it_differs_by_more_than_2x():
    # Every 2 h, a failure every 6 h, 40 s saves: Young/Daly's sqrt(2 x 40 x 21600) = 1314 s;
    # per failure: 3600 + 40 x 3 = 3720 s against 1314 s: about 40 min less.
    assert advice(40, 7200, 6 * 3600) == (
        "checkpoints every 2 h; with a failure every 6 h and 40 s saves, every 22 min loses "
        "about 40 min less per failure")
    # Too often: every minute with 40 s saves costs 4 h a failure in saves.
    assert advice(40, 60, 6 * 3600).startswith(
        "checkpoints every 1 min; with a failure every 6 h and 40 s saves, every 22 min loses "
        "about")
    # Within 2x (30 min against 22): nothing to say; nor without a figure.
    assert advice(40, 1800, 6 * 3600) == ""
    assert advice(None, 1800, 6 * 3600) == advice(40, None, 1) == advice(40, 60, None) == ""
    best = math.sqrt(2 * 40 * 21600)
    assert math.isclose(gp.loss_per_failure(best, 40, 21600), best)


def test_a_run_gives_advice_from_its_own_failures_else_the_runs_roots():
    saves = [ckpt(70 + i * 7200, 110 + i * 7200, i) for i in range(1, 4)]
    one = timeline(attempt(0, 30, 50, 70, 6 * 3600 - 200, 6 * 3600 - 190,
                           {"check": "run.hardware", "host": "n"}, saves),
                   attempt(1, 6 * 3600 - 100, 6 * 3600 - 90, 6 * 3600 - 80, None, 6 * 3600))
    g = goodput(one)
    assert g["mtbf_s"] == 6 * 3600 and g["interval_s"] == 7200 and g["save_s"] == 40
    assert g["advice"].startswith("checkpoints every 2 h; with a failure every 6 h and 40 s")
    clean = timeline(attempt(0, 0, 10, 20, None, 30000, checkpoints=saves))
    assert goodput(clean)["advice"] == "" and goodput(clean)["mtbf_s"] is None
    assert goodput(clean, mtbf_s=6 * 3600)["advice"].startswith("checkpoints every 2 h;")


def test_durations_read_as_people_read_them():
    assert [duration(s) for s in (0.4, 40, 250, 720, 3600, 6 * 3600, 6 * 3600 + 600, 50400,
                                  300000)] == [
        "0.4 s", "40 s", "4 min 10 s", "12 min", "1 h", "6 h", "6 h 10 min", "14 h", "3 d 11 h"]


# ---- over runs, and the CLI


def write_run(root, run_id, body, raw=False):
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "train.json").write_text(body if raw else json.dumps(body))
    return run_dir


def two_runs(root):
    first = goodput(timeline(
        attempt(0, 30, 50, 70, 1500, 1512, {"check": "run.hardware", "host": "node2"},
                [ckpt(600, 640, 100, stall=True), ckpt(1200, 1210, 200)]),
        attempt(1, 1560, 1575, 1600, None, 3000)))
    second = goodput(timeline(
        attempt(0, 10, 20, 30, 1000, 1010, {"check": "host.lost", "host": "b"}),
        attempt(1, 1050, 1060, 1070, 1400, 1410, {"check": "run.hardware", "host": "c"}),
        attempt(2, 1450, 1460, 1470, None, 2000), checkpoint_dir=""))
    write_run(root, "20260901-100000-aaaa", {"ok": True, "goodput": first})
    write_run(root, "20260902-100000-bbbb", {"ok": True, "goodput": second})
    return first, second


def test_runs_goodput_sums_the_runs_and_counts_failures_by_cause(tmp_path):
    first, second = two_runs(tmp_path)
    view = runs_goodput(str(tmp_path))
    assert view["runs"] == 2 and view["skipped"] == 0 and view["failures"] == 3
    assert view["wall_s"] == 5000 and view["mtbf_s"] == round(5000 / 3, 3)
    kept = first["buckets"]["kept_training"] + second["buckets"]["kept_training"]
    assert math.isclose(view["ratio"], kept / 5000, abs_tol=1e-6)
    assert view["lost_work_unknown_runs"] == 1
    causes = {c["check"]: c for c in view["causes"]}
    assert causes["run.hardware"]["failures"] == 2 and causes["host.lost"]["failures"] == 1
    assert math.isclose(causes["run.hardware"]["cost_s"],
                        first["failures"][0]["cost_s"] + second["failures"][1]["cost_s"])
    assert math.isclose(causes["run.hardware"]["cost_h"] * 3600,
                        causes["run.hardware"]["cost_s"], abs_tol=2)


def test_runs_goodput_since_keeps_the_recent_runs(tmp_path):
    two_runs(tmp_path)
    assert runs_goodput(str(tmp_path), since_s=3 * 3600, now=T0 + 2 * 3600)["runs"] == 2
    assert runs_goodput(str(tmp_path), since_s=3600, now=T0 + 3 * 86400)["runs"] == 0


def test_a_hostile_or_broken_train_json_is_skipped_and_counted(tmp_path):
    two_runs(tmp_path)
    write_run(tmp_path, "20260903-100000-cccc", "[" * 200000, raw=True)   # too deep
    write_run(tmp_path, "20260903-100000-dddd", "not json", raw=True)
    write_run(tmp_path, "20260903-100000-eeee", {"goodput": {"wall_s": 10, "buckets": {
        "kept_training": 1e12}}})                                        # kept > wall
    write_run(tmp_path, "20260903-100000-ffff", {"goodput": {"wall_s": "x"}})
    write_run(tmp_path, "20260903-100000-gggg", {"goodput": [1]})
    write_run(tmp_path, "20260903-100000-hhhh", {"ok": True})            # an older run
    fifo_dir = tmp_path / "20260903-100000-iiii"
    fifo_dir.mkdir()
    os.mkfifo(fifo_dir / "train.json")                                  # would block a read
    (tmp_path / "20260903-100000-jjjj").symlink_to(tmp_path / "20260901-100000-aaaa")
    link_dir = tmp_path / "20260903-100000-kkkk"
    link_dir.mkdir()
    (link_dir / "train.json").symlink_to(tmp_path / "20260901-100000-aaaa" / "train.json")
    big = write_run(tmp_path, "20260903-100000-llll", "{}", raw=True)
    with open(big / "train.json", "ab") as f:
        f.truncate(gp.READ_MAX + 1)
    view = runs_goodput(str(tmp_path))
    assert view["runs"] == 2 and view["without_goodput"] == 1 and view["skipped"] == 8
    assert runs_goodput(str(tmp_path / "nowhere"))["runs"] == 0


def test_the_cli_prints_a_table_and_json(tmp_path, capsys):
    two_runs(tmp_path)
    write_run(tmp_path, "20260903-100000-cccc", "{", raw=True)
    assert cli.main(["goodput", "--runs-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("goodput ") and "over 2 runs" in out
    assert "kept training" in out and "lost work" in out
    assert "run.hardware  2" in out and "host.lost" in out
    assert "1 train.json skipped" in out
    assert "lost work unknown in 1 run (no checkpoint_dir)" in out
    assert cli.main(["goodput", "--runs-root", str(tmp_path), "--json", "--since", "100000w"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["runs"] == 2 and view["since_s"] == 100000 * 7 * 86400


def test_the_cli_refuses_a_bad_since_in_one_sentence(tmp_path, capsys):
    for bad in ("7", "x7d", "-1d", "0d", "7 days"):
        assert cli.main(["goodput", "--runs-root", str(tmp_path), "--since=" + bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("torchfleet goodput: --since takes") and err.count("\n") == 1
    assert cli.parse_since("7d") == 7 * 86400 and cli.parse_since("30min") == 1800
    assert cli.parse_since("1.5h") == 5400


def test_the_cli_on_an_empty_runs_root(tmp_path, capsys):
    assert cli.main(["goodput", "--runs-root", str(tmp_path / "none")]) == 0
    assert capsys.readouterr().out.startswith("no run with a goodput under ")


def test_the_users_own_stop_costs_work_but_is_no_failure_of_the_mean_time_between_them():
    # The check id the summary names a stop by (runstate.check_of, checks.py's registry).
    g = goodput(timeline(
        attempt(0, 0, 1, 2, 1000, 1002, {"check": "run.exit", "host": "a"}),
        attempt(1, 1010, 1011, 1012, 3000, 3002, {"check": "run.stopped_by_user", "host": ""})))
    assert [f["check"] for f in g["failures"]] == ["run.exit", "run.stopped_by_user"]
    assert g["mtbf_s"] == g["wall_s"] == 3002


# ---- issue 67: the edges of real fleets


def test_a_save_cut_short_is_no_checkpoint_lost_work_counts_from_the_last_whole_one():
    """5 of 8 model_rank{r}_step100.pt written before the failure (the watch's partial entry):
    lost work counts from the whole save before it (about 975 s), not from the cut one (5 s),
    and "unknown" says so."""
    whole = dict(ckpt(20, 25, 50, stall=True, path="model_rank*_step50.pt"), files=8)
    cut = dict(ckpt(990, 995, 100, stall=True, path="model_rank*_step100.pt"), files=5, of=8,
               partial=True)
    g = goodput(timeline(attempt(0, 0, 5, 10, 1000, 1003, {"check": "host.lost", "host": "n2"},
                                 [whole, cut])))
    assert g["buckets"]["lost_work"] == 975
    assert [c["step"] for c in g["checkpoints"]] == [50]
    assert any("model_rank*_step100.pt was cut short (5 of 8 shards)" in u for u in g["unknown"])
    assert adds_up(g)


def test_a_checkpoint_dir_that_never_sees_a_save_leaves_lost_work_unknown():
    """The wrong folder (or saves to object storage): a failed attempt's training is not all
    lost work with nothing said; it is unknown, and goodput an upper bound."""
    g = goodput(timeline(attempt(0, 0, 5, 10, 1000, 1003, {"check": "run.exit", "host": "n"}),
                         attempt(1, 1010, 1015, 1020, None, 2000)))
    assert g["buckets"]["lost_work"] is None
    assert g["unknown"][0].startswith("lost work is unknown: the checkpoint watch saw no save "
                                      "in checkpoint_dir /shared/ckpt")
    assert line(g).startswith("goodput at most ")


def test_older_saves_folded_by_the_record_still_stall():
    """5 days of a save every 10 min stalling 60 s: the record keeps the newest 256 and folds
    the older 464 into one aggregate; their 7.7 h of stalls stay checkpoint_stall."""
    day = 86400.0
    kept = [ckpt(day * 5 - 600 * (256 - i), day * 5 - 600 * (256 - i) + 60, i, stall=True)
            for i in range(256)]
    folded = {"saves": 464, "stall_s": 464 * 60.0, "save_s": 464 * 60.0, "first": T0 + 600,
              "last": T0 + 600 * 464 + 60}
    a = attempt(0, 0, 1, 2, None, day * 5, checkpoints=kept)
    a["checkpoints_folded"] = folded
    g = goodput(timeline(a))
    assert g["buckets"]["checkpoint_stall"] == 720 * 60
    assert g["checkpoints_folded"] == 464 and adds_up(g)


def test_the_mtbf_is_per_host_hour_from_the_runs_root_and_a_planned_end_is_no_failure():
    """A run with no failure gets the fleet's MTBF at its own size; one failure does not make
    its own wall time the MTBF; run.timeout and run.controller_lost are no failures."""
    saves = [ckpt(70 + i * 7200, 110 + i * 7200, i) for i in range(1, 4)]
    clean = timeline(attempt(0, 0, 10, 20, None, 30000, checkpoints=saves))
    clean["nnodes"] = 8
    # The fleet: 48 host-hours a failure; at 8 hosts, one every 6 h.
    g = goodput(clean, history={"host_s": 10 * 48 * 3600.0, "failures": 10})
    assert g["mtbf_s"] == round((10 * 48 * 3600.0 + 30000 * 8) / 10 / 8, 3)
    assert g["advice"].startswith("checkpoints every 2 h; with a failure every ")
    ends = timeline(attempt(0, 0, 1, 2, 1000, 1002, {"check": "run.timeout", "host": ""}))
    assert goodput(ends)["mtbf_s"] is None
    lost = timeline(attempt(0, 0, 1, 2, 1000, 1002, {"check": "run.controller_lost", "host": ""}))
    assert goodput(lost)["mtbf_s"] is None


def test_torchfleet_goodput_gives_the_mtbf_per_run_size_not_pooled(tmp_path):
    """An 8-host and a 512-host run, one failure each: not one pooled MTBF, but host-seconds
    per failure, and at each size its own."""
    for name, nnodes, fails in (("20260901-100000-aaaa", 8, True),
                                ("20260902-100000-bbbb", 512, True)):
        g = goodput(timeline(attempt(0, 0, 10, 20, 3600 if fails else None, 3600,
                                     {"check": "run.hardware", "host": "n"} if fails else None),
                             checkpoint_dir=""))
        g["nnodes"] = nnodes
        write_run(tmp_path, name, {"ok": True, "goodput": g})
    view = runs_goodput(str(tmp_path))
    assert view["mtbf_host_s"] == round(3600 * (8 + 512) / 2, 3)
    assert [(s["nnodes"], s["mtbf_s"]) for s in view["sizes"]] == [
        (8, round(3600 * 520 / 2 / 8, 3)), (512, round(3600 * 520 / 2 / 512, 3))]
    assert gp.history(str(tmp_path), exclude="20260902-100000-bbbb") == {
        "host_s": 3600 * 8, "failures": 1}


def test_the_wall_is_the_commands_and_a_clean_ends_teardown_is_its_own_bucket():
    """A clean attempt's training ends at its last collective: the script's and torchrun's
    exit is teardown, and so is the gather to the report (the command's last play)."""
    a = attempt(0, 10, 15, 20, None, 100)
    a["last_collective"] = T0 + 97.9
    tl = timeline(a)
    tl["reported"] = T0 + 103.0
    g = goodput(tl)
    assert g["wall_s"] == 103.0
    assert g["buckets"]["kept_training"] == 77.9 and g["buckets"]["teardown"] == 5.1
    assert g["ratio"] == round(77.9 / 103.0, 6) and adds_up(g)
    # A report days after the run ended (a detached run attached to later): not the run's time.
    tl["reported"] = T0 + 100 + 2 * 86400
    g = goodput(tl)
    assert g["wall_s"] == 100.0 and g["buckets"]["teardown"] == 2.1
    assert any("after every rank stopped" in u for u in g["unknown"])


def test_the_mtbf_history_reads_an_older_train_jsons_hosts_and_forgets_old_runs(tmp_path):
    """Fleet review (issue 67, 7): train.json files written before goodput kept `nnodes` were
    read as 1-host runs (20 old 512-host runs with a failure each: MTBF at 512 hosts 4,275 s
    instead of ~86,400 s), and history() read every run ever. Their hosts come from the
    top-level world_size over nproc_per_node (else the hosts' rows); history() keeps the runs
    of the last 90 days by the report's time."""
    now = T0 + 10 * 86400
    for i in range(20):
        g = goodput(timeline(attempt(0, 0, 10, 20, 86400, 86400,
                                     {"check": "run.hardware", "host": "n"}), checkpoint_dir=""))
        del g["nnodes"]  # as goodput wrote it before it kept the run's size
        report = {"ok": False, "world_size": 512 * 8, "settings": {"nproc_per_node": 8},
                  "goodput": g}
        if i % 2:  # no world_size: its hosts' rows
            report = {"ok": False, "hosts": [{"host": "n%d" % h} for h in range(512)],
                      "goodput": g}
        run = write_run(tmp_path, "20260901-1000%02d-aaaa" % i, report)
        os.utime(run / "train.json", (now - 86400, now - 86400))
    view = runs_goodput(str(tmp_path))
    assert [(s["nnodes"], s["runs"]) for s in view["sizes"]] == [(512, 20)]
    assert view["sizes"][0]["mtbf_s"] == round(86400 * 512 * 20 / 20 / 512, 3)
    assert gp.history(str(tmp_path), now=now) == {"host_s": 86400 * 512 * 20, "failures": 20}
    # A run of a year ago is not today's fleet: out of the history (kept in `torchfleet goodput`).
    old = write_run(tmp_path, "20250901-100000-old", {"ok": False, "world_size": 8, "goodput": dict(
        g, nnodes=1, started=now - 365 * 86400)})
    os.utime(old / "train.json", (now - 364 * 86400, now - 364 * 86400))
    assert gp.history(str(tmp_path), now=now) == {"host_s": 86400 * 512 * 20, "failures": 20}
    assert runs_goodput(str(tmp_path))["runs"] == 21


def test_the_mtbf_history_reads_only_the_newest_runs(tmp_path, monkeypatch):
    """Fleet review (issue 67, 10): history() parsed every train.json of the runs root at each
    run's end; it reads the newest HISTORY_RUNS by mtime, each up to HISTORY_READ_MAX bytes."""
    monkeypatch.setattr(gp, "HISTORY_RUNS", 3)
    g = goodput(timeline(attempt(0, 0, 10, 20, 3600, 3600, {"check": "run.hardware", "host": "n"}),
                         checkpoint_dir=""))
    now = time.time()
    for i in range(6):
        run = write_run(tmp_path, "20260901-1000%02d-aaaa" % i, {"ok": False, "goodput": g})
        os.utime(run / "train.json", (now - 1000 + i, now - 1000 + i))
    read = []
    real = gp.read_bounded
    monkeypatch.setattr(gp, "read_bounded", lambda path, limit=gp.READ_MAX: (
        read.append((os.path.basename(os.path.dirname(path)), limit)), real(path, limit))[1])
    assert gp.history(str(tmp_path), now=now)["failures"] == 3
    assert read == [("20260901-1000%02d-aaaa" % i, gp.HISTORY_READ_MAX) for i in (3, 4, 5)]
