"""The record's timeline and checkpoints (what goodput is computed from: reports/goodput.py),
fed the way the master's agent feeds them: beats carrying each rank's position and its first
collective's age, exits carrying how long ago torchrun ended, checkpoints the master's watch
saw. Times are given explicitly, on the master's clock."""
from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import runstate
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.runstate import RunState
from tests.conftest import examples

HOSTS = ["node0", "node1"]


def state(hosts=HOSTS, nproc=2, **kw):
    return RunState("r1", hosts, nproc, now=1000.0, lost_after_s=30, **kw)


def beat(s, host, now, done=None, steady_s=0.0, first=None, alive=2):
    """A host's beat: its two ranks at completed collective `done` (position written
    steady_s ago), `first`: {rank: age_s} of their first collective."""
    lo = s.hosts[host]["ranks"][0]
    body = {"t": runstate.BEAT, "alive": alive, "idle_s": 0.0, "pid": 1}
    if done is not None:
        body["coll"] = {str(r): {"0": [done, done, "gloo:all_reduce", "", ""]}
                        for r in (lo, lo + 1)}
        body["steady"] = {str(r): [steady_s, True] for r in (lo, lo + 1)}
    if first is not None:
        body["first"] = first
    return s.report(host, now, body)


def ckpt(began, ended, path="step_100.pt", **kw):
    return dict({"path": path, "began": began, "ended": ended, "step": 100, "kind": "file",
                 "bytes": 10}, **kw)


def test_the_timeline_of_a_run_that_succeeded():
    s = state()
    assert s.record()["timeline"] == {"running": None, "init_done": None, "failed": None,
                                      "stopped": None, "last_collective": None}
    beat(s, "node0", 1003.0)
    beat(s, "node1", 1005.0)  # the latest host's ranks up
    # Each rank's first collective, as an age on its own host's clock: dated when heard.
    beat(s, "node0", 1008.0, done=1, first={"0": 2.0, "1": 1.5})
    assert s.record()["timeline"]["init_done"] is None  # (node1's ranks not yet)
    beat(s, "node1", 1009.0, done=1, first={"2": 2.5, "3": 2.0})
    beat(s, "node1", 1010.0, done=2, first={"2": 0.0, "3": 0.0})  # dated once
    s.report("node0", 1100.0, {"t": runstate.EXIT, "rc": 0, "ended_s": 0.5})
    assert s.record()["timeline"]["stopped"] is None  # node1 still runs
    s.report("node1", 1102.0, {"t": runstate.EXIT, "rc": 0, "ended_s": 1.0})
    rec = s.record()
    assert {k: v for k, v in rec["timeline"].items() if k != "last_collective"} == {
        "running": 1005.0, "init_done": 1007.0, "failed": None, "stopped": 1101.0}
    assert [h["ended"] for h in rec["hosts"]] == [1099.5, 1101.0]


def test_every_rank_running_is_when_the_agent_saw_its_ranks_start_not_its_beat():
    # The beat comes up to a second after the ranks started: its up_s (an age on the host's
    # clock) dates the start; a hostile one is bounded, never before the run.
    s = state()
    s.report("node0", 1003.0, {"t": runstate.BEAT, "alive": 2, "up_s": 0.8})
    s.report("node1", 1004.0, {"t": runstate.BEAT, "alive": 2, "up_s": 1e9})
    assert [h["ranks_at"] for h in s.record()["hosts"]] == [1002.2, 1004.0 - 2 * defaults.BEAT_S]
    s2 = state()
    for bad in ("x", -3, float("nan"), None, [1]):
        s2.hosts["node0"]["ranks_at"] = None
        s2.report("node0", 1003.0, {"t": runstate.BEAT, "alive": 2, "up_s": bad})
        assert s2.hosts["node0"]["ranks_at"] == 1003.0


def test_a_failures_own_time_and_a_lost_hosts_end_is_when_it_was_judged():
    s = state()
    beat(s, "node0", 1001.0)
    beat(s, "node1", 1001.0)
    for t in range(1002, 1040):
        beat(s, "node0", float(t))
    assert s.tick(1032.5) is not None  # node1 silent since 1001: lost, dated 1001
    assert s.record()["timeline"]["failed"] == 1001.0
    assert s.record()["timeline"]["stopped"] is None  # node0's torchrun still runs
    s.report("node0", 1040.0, {"t": runstate.EXIT, "rc": -15, "stopped": True, "ended_s": 2.0})
    rec = s.record()
    assert [h["ended"] for h in rec["hosts"]] == [1038.0, 1032.5]
    assert rec["timeline"]["stopped"] == 1038.0


def test_init_done_waits_for_every_rank_and_takes_only_a_hosts_own_ranks():
    s = state()
    beat(s, "node0", 1010.0, done=1, first={"0": 1.0, "1": 1.0, "2": 0.0, "3": 0.0})
    assert s.firsts == {0: 1009.0, 1: 1009.0}
    beat(s, "node1", 1011.0, done=1, first={"2": "x", "3": -1, "7": 1.0})
    assert s.record()["timeline"]["init_done"] is None
    beat(s, "node1", 1012.0, done=1, first={"2": 0.5, "3": 1.0})
    assert s.record()["timeline"]["init_done"] == 1011.5


def advancing(s, t0, t1, every=1.0):
    """Both hosts' ranks complete a collective each `every` s from t0 to t1, each beat
    heard 0.3 s after the position was written."""
    done, t = 1, t0
    while t <= t1:
        for h in HOSTS:
            beat(s, h, t + 0.3, done=done, steady_s=0.3)
        done, t = done + 1, t + every


def judged(c, *moments):
    """The record's entry of one save c in a run whose collectives advance each second from
    1010 to 1020 and from 1030 to 1040 (rank 0 saves in between; every rank waits for it),
    and at the moments given."""
    s = state()
    advancing(s, 1010.0, 1020.0)
    for t in moments:
        s._advanced(t)
    advancing(s, 1030.0, 1040.0)
    assert s.checkpoint_seen(1041.0, c) is not None
    (entry,) = s.record()["checkpoints"]
    return entry["stall"], entry["stall_s"]


def test_a_save_during_which_no_collective_completed_is_a_stall_one_with_training_is_not():
    # A synchronous save: nothing completes while it is written; a stall, whole.
    assert judged(ckpt(1020.5, 1030.0)) == (True, 9.5)
    # An asynchronous save: training goes on while it is written.
    assert judged(ckpt(1031.0, 1039.0)) == (False, 0.0)
    # A collective completed just before the save is seen up to a second into it: not
    # training during the save.
    assert judged(ckpt(1019.6, 1025.0)) == (True, 5.4)
    # A save of 2 s or less: a stall, however the collectives went.
    assert judged(ckpt(1033.0, 1035.0)) == (True, 2.0)


def test_a_synchronous_save_with_a_few_collectives_of_its_own_is_a_stall_still():
    # A 180 s save with one collective 5 s in (DeepSpeed's barrier, DCP's plan gather) stalls
    # for all but seconds of it: the gaps over 2 s inside its window, not "no stall".
    for moments in ((1025.5,), (1025.5, 1080.0, 1140.0)):  # or a few (FSDP's all-gathers)
        s = state()
        advancing(s, 1000.0, 1020.0)
        for t in moments:
            s._advanced(t)
        advancing(s, 1201.0, 1210.0)
        s.checkpoint_seen(1211.0, ckpt(1020.5, 1200.5))
        (c,) = s.record()["checkpoints"]
        assert c["stall"] is True and 170 <= c["stall_s"] <= 180.0
    # Training that pauses 6 s inside an asynchronous save: those seconds only.
    s = state()
    advancing(s, 1000.0, 1100.0)
    s.advances = [t for t in s.advances if not 1050.0 < t < 1056.0]
    s.checkpoint_seen(1101.0, ckpt(1030.0, 1090.0))
    assert s.record()["checkpoints"][0]["stall_s"] == 6.0
    # No rank's position in the whole run (flight_recorder=0): the whole save, as before.
    s = state()
    s.checkpoint_seen(1211.0, ckpt(1020.5, 1200.5))
    assert s.record()["checkpoints"][0]["stall_s"] == 180.0


def test_shard_files_of_one_save_are_one_entry_and_a_directory_recorded_twice_too():
    s = state()
    # 8 per-rank shard files of one save, written side by side, then the next save 60 s later.
    for save in (0, 60):
        for r in range(8):
            began, ended = 1010.0 + save + 0.1 * r, 1020.0 + save + 0.2 * r
            s.checkpoint_seen(1100.0 + save, ckpt(began, ended, step=save,
                                                  path="model_rank%d_step%d.pt" % (r, save)))
    cps = s.record()["checkpoints"]
    assert [(c["began"], c["ended"], c["files"], c["bytes"], c["step"]) for c in cps] == [
        (1010.0, 1021.4, 8, 80, 0), (1070.0, 1081.4, 8, 80, 60)]
    # A directory recorded twice (a file in it written again): one entry, to the later end.
    s = state()
    s.checkpoint_seen(1030.0, ckpt(1010.0, 1020.0, path="checkpoint-500", kind="dir"))
    s.checkpoint_seen(1030.0, ckpt(1010.0, 1024.0, path="checkpoint-500", kind="dir"))
    assert [(c["path"], c["began"], c["ended"], c["files"]) for c in s.record()["checkpoints"]] \
        == [("checkpoint-500", 1010.0, 1024.0, 1)]
    # The same name saved again later (a latest.pt overwritten each save): two saves.
    s.checkpoint_seen(1100.0, ckpt(1080.0, 1090.0, path="checkpoint-500", kind="dir"))
    assert len(s.record()["checkpoints"]) == 2


def test_a_stall_is_judged_once_its_beats_are_in_then_kept():
    s = state()
    advancing(s, 1000.0, 1005.0)
    s.checkpoint_seen(1020.0, ckpt(1006.0, 1019.0))
    assert s.checkpoints[0]["stall"] is None and s.record()["checkpoints"][0]["stall"] is True
    s.tick(1022.0)
    assert s.checkpoints[0]["stall"] is True
    # Far later, however many moments came since, the judgement stays.
    advancing(s, 1030.0, 1030.0 + runstate.ADVANCES_KEPT, every=1.0)
    assert len(s.advances) == runstate.ADVANCES_KEPT
    assert s.record()["checkpoints"][0]["stall"] is True


def test_advances_are_kept_one_per_half_second_and_sorted():
    s = state()
    for t in (1010.0, 1010.2, 1010.4, 1009.9, 1011.0, 1010.6):
        s._advanced(t)
    assert s.advances == [1010.0, 1011.0]
    s._advanced(1010.5)
    assert s.advances == [1010.0, 1010.5, 1011.0]


def test_checkpoints_are_kept_oldest_first_bounded_and_none_after_the_record_is_final():
    s = state()
    n = defaults.CHECKPOINTS_KEPT + 10
    for i in range(n):
        assert s.checkpoint_seen(5000.0, ckpt(1000.0 + 10 * i, 1001.0 + 10 * i, path="s_%d" % i,
                                              step=i)) is not None
    last = 1001.0 + 10 * (n - 1)
    s.checkpoint_seen(5000.0, ckpt(last - 7, last - 6, path="late"))  # ended before the last
    assert s.checkpoint_seen(5000.0, ckpt(last - 1, last, path="s_%d" % (n - 1))) is None  # a repeat
    cps = s.record()["checkpoints"]
    assert len(cps) == defaults.CHECKPOINTS_KEPT
    assert [c["ended"] for c in cps] == sorted(c["ended"] for c in cps)
    assert cps[-2]["path"] == "late" and cps[-1]["path"] == "s_%d" % (n - 1)
    assert set(cps[0]) == {"path", "began", "ended", "step", "kind", "bytes", "files", "stall",
                           "stall_s"}
    s.final = True
    assert s.checkpoint_seen(6000.0, ckpt(5000.0, 5001.0, path="after")) is None
    s.checkpoint_warning("too late")
    assert s.record()["checkpoints"][-1]["path"] == "s_%d" % (n - 1)
    assert s.record()["checkpoint_watch"]["warnings"] == []


def test_a_hostile_checkpoint_or_warning_is_bounded_or_dropped():
    s = state(checkpoint_dir="/ckpt")
    for bad in (None, [], {"path": "x"}, {"path": "", "began": 1, "ended": 2},
                {"path": "x", "began": float("nan"), "ended": 2.0},
                {"path": 3, "began": 1, "ended": 2}):
        assert s.checkpoint_seen(1010.0, bad) is None
    c = s.checkpoint_seen(1010.0, {"path": "p" * 1000, "began": 1009.5, "ended": 2000.0,
                                   "step": True, "kind": "evil", "bytes": -4})
    assert (len(c["path"]), c["began"], c["ended"], c["step"], c["kind"], c["bytes"]) == (
        runstate.CKPT_PATH_MAX, 1009.5, 1010.0, None, "file", 0)
    for i in range(20):
        s.checkpoint_warning("w%d " % (i % 10) + "x" * 5000)
    w = s.record()["checkpoint_watch"]
    assert w["dir"] == "/ckpt" and len(w["warnings"]) == runstate.CKPT_WARNINGS_MAX
    assert all(len(x) <= runstate.LINE_MAX for x in w["warnings"])
    assert len(set(w["warnings"])) == len(w["warnings"])


def test_the_record_stays_bounded_at_512_hosts_of_8_ranks():
    hosts = ["n%03d" % i for i in range(512)]
    s = state(hosts=hosts, nproc=8)
    for i, h in enumerate(hosts):
        lo = 8 * i
        s.report(h, 1010.0, {"t": runstate.BEAT, "alive": 8, "idle_s": 0.0, "pid": 1,
                             "first": {str(r): 1.0 for r in range(lo, lo + 8)},
                             "coll": {str(r): {"0": [1, 1, "", "", ""]} for r in range(lo, lo + 8)},
                             "steady": {str(r): [0.0, True] for r in range(lo, lo + 8)}})
    for i in range(1000):
        s.checkpoint_seen(3000.0, ckpt(1000.0 + 2 * i, 1000.5 + 2 * i, path="c%d" % i))
        s.checkpoint_warning("w%d" % i)
    s.report(hosts[0], 1011.0, {"t": runstate.BEAT, "alive": 8, "idle_s": 0.0, "pid": 1,
                                "first": {str(r): 0.0 for r in range(5000)}})  # hostile
    rec = s.record()
    assert rec["timeline"]["init_done"] == 1009.0
    assert len(s.firsts) == 4096
    assert len(rec["checkpoints"]) == defaults.CHECKPOINTS_KEPT
    extra = {k: rec[k] for k in ("checkpoints", "checkpoint_watch", "timeline")}
    assert len(json.dumps(extra)) < 64 << 10


def test_a_lost_master_keeps_the_checkpoints_and_the_timeline():
    s = state(checkpoint_dir="/ckpt")
    beat(s, "node0", 1001.0, done=1, first={"0": 0.5, "1": 0.5})
    beat(s, "node1", 1001.0, done=1, first={"2": 0.5, "3": 0.5})
    s.checkpoint_seen(1050.0, ckpt(1040.0, 1049.0))
    s.checkpoint_warning("a warning")
    s.checkpoint_blind(True)  # its last look could not read the directory
    rec = json.loads(json.dumps(s.record()))
    lost = runstate.master_lost(rec, "node0", "its agent died")
    assert lost["checkpoints"] == rec["checkpoints"]
    assert lost["checkpoint_watch"] == {"dir": "/ckpt", "warnings": ["a warning"], "blind": True}
    assert lost["timeline"]["init_done"] == 1000.5
    assert lost["hosts"][0]["ended"] == rec["updated"]


@settings(max_examples=examples(150), deadline=None)
@given(events=st.lists(st.tuples(
    st.sampled_from(["beat", "exit", "fail_exit", "stopped", "tick", "ckpt", "first"]),
    st.sampled_from(HOSTS), st.floats(0.0, 5.0), st.floats(0.0, 40.0)), max_size=30))
def test_the_timeline_holds_whatever_the_order_of_reports(events):
    """Whatever the hosts say and when: every moment is a number on the run's clock or None,
    stopped only once no host runs and never before a host's end, the checkpoints in order,
    and the record JSON."""
    s = state()
    now = 1000.0
    for kind, host, step, age in events:
        now += step
        lo = s.hosts[host]["ranks"][0]
        if kind == "beat":
            beat(s, host, now, done=int(now) % 7, steady_s=min(age, 3.0))
        elif kind == "first":
            beat(s, host, now, first={str(lo): age, str(lo + 1): age / 2})
        elif kind in ("exit", "fail_exit", "stopped"):
            s.report(host, now, {"t": runstate.EXIT, "rc": 0 if kind == "exit" else 1,
                                 "stopped": kind == "stopped", "ended_s": age})
        elif kind == "tick":
            s.tick(now)
        else:
            s.checkpoint_seen(now, ckpt(now - age, now - age / 2, path="p%d" % int(now)))
    rec = json.loads(json.dumps(s.record()))
    line = rec["timeline"]
    assert all(v is None or isinstance(v, float) and v >= s.started for v in line.values())
    running = [h for h in rec["hosts"] if h["state"] == runstate.STARTED]
    if running:
        assert line["stopped"] is None
    if line["stopped"] is not None:
        assert all(h["ended"] is None or h["ended"] <= line["stopped"] for h in rec["hosts"])
    ends = [c["ended"] for c in rec["checkpoints"]]
    assert ends == sorted(ends) and all(c["began"] <= c["ended"] for c in rec["checkpoints"])
    assert all(isinstance(c["stall"], bool) for c in rec["checkpoints"])


def test_saves_past_the_kept_ones_are_folded_not_dropped():
    """Issue 67: a days-long run's older saves moved their stall time into kept_training; the
    record folds them into one aggregate, their stalls and their count kept."""
    s = state()
    n = defaults.CHECKPOINTS_KEPT + 100
    for i in range(n):
        s.checkpoint_seen(1e6, ckpt(2000.0 + 600 * i, 2060.0 + 600 * i, path="s_%d" % i, step=i))
    rec = s.record()
    assert len(rec["checkpoints"]) == defaults.CHECKPOINTS_KEPT
    folded = rec["checkpoints_folded"]
    assert folded["saves"] == 100 and folded["stall_s"] == 100 * 60.0
    assert folded["first"] == 2000.0 and folded["last"] == 2060.0 + 600 * 99


def test_a_partial_save_is_kept_apart_and_shards_grouped_by_the_watch_count_as_theirs():
    s = state()
    s.checkpoint_seen(5000.0, ckpt(1000.0, 1005.0, path="model_rank*_step50.pt", files=8))
    s.checkpoint_seen(5000.0, ckpt(1990.0, 1995.0, path="model_rank*_step100.pt", files=5, of=8,
                                   partial=True))
    cps = s.record()["checkpoints"]
    assert [(c["files"], c.get("partial"), c.get("of")) for c in cps] == [(8, None, None),
                                                                         (5, True, 8)]


def test_a_clean_ends_last_collective_is_in_the_timeline():
    s = state()
    beat(s, "node0", 1003.0, done=1)
    beat(s, "node0", 1050.0, done=40)
    beat(s, "node0", 1060.0, done=40)  # held still: the run's end
    assert s.record()["timeline"]["last_collective"] == 1050.0
