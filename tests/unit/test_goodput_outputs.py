"""Goodput's controller side (issue 59): the master's clock offset measured by the watch's looks,
every record time put on the controller's clock, train.json's goodput object, and every output
that reads it (status, the live progress, the HTML report, Result.goodput)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.torchfleet.fleet.plugins.action.torchrun_watch import Clock, look_script
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import summary
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.runstate import (
    FAILED, LOST, STOPPED_BY_USER, SUCCEEDED)

# A master 30 s ahead of the controller: every record time is the controller's + 30.
OFFSET = 30.0


def test_the_offset_is_the_midpoint_of_the_looks_round_trip_less_its_wait_on_the_master():
    clock = Clock()
    assert clock.record() == {"offset_s": 0.0, "rtt_s": None, "looks": 0}
    # Sent at 100.0, answered at 105.2; the master's look ran 100.1 -> 105.1 (+30): a 5 s wait.
    clock.take(100.0, 105.2, {"began": 130.1, "now": 135.1})
    assert clock.record()["offset_s"] == pytest.approx(OFFSET)
    assert clock.record()["rtt_s"] == pytest.approx(0.2)
    # A slower look (a 1 s round trip, asymmetric): not kept.
    clock.take(200.0, 201.0, {"began": 230.9, "now": 230.95})
    assert clock.record()["offset_s"] == pytest.approx(OFFSET)
    # A quicker one is.
    clock.take(300.0, 300.02, {"began": 330.005, "now": 330.015})
    assert clock.record() == {"offset_s": pytest.approx(OFFSET), "rtt_s": pytest.approx(0.01),
                              "looks": 3}
    # A look without both times (the module's), or across a clock step, measures nothing.
    clock.take(400.0, 400.001, {"now": 9.0})
    clock.take(400.0, 400.001, {"began": 500.0, "now": 499.0})
    clock.take(400.0, 400.001, {"began": True, "now": 430.0})
    assert clock.record()["looks"] == 3


def test_the_look_script_answers_when_it_began_and_ended_on_the_masters_clock(tmp_path):
    args = {"run_dir": str(tmp_path / "none"), "run_id": "r1", "wait_s": 0.3}
    proc = subprocess.run([sys.executable, "-"], input=look_script(args), capture_output=True,
                          text=True, check=True, timeout=60)
    answer = json.loads(proc.stdout)
    assert answer["state"] == "pending"
    assert answer["now"] - answer["began"] >= 0.3  # its wait is inside, and left out of the rtt
    clock = Clock()
    clock.take(answer["began"] - 0.05, answer["now"] + 0.05, answer)
    assert clock.record()["offset_s"] == pytest.approx(0.0, abs=1e-6)


def _record(started, *, failure=None, timeline=None, checkpoints=(), watch_dir="",
            offset=OFFSET, clock=True):
    """A record as the master keeps it, its times on the master's clock (controller + offset)."""
    m = {k: None if v is None else v + offset for k, v in (timeline or {}).items()}
    out = {"run_id": "r1", "phase": FAILED if failure else SUCCEEDED, "started": started + offset,
           "failure": None if failure is None else dict(failure, at_s=1.0),
           "failures": [], "hosts": [], "events": [],
           "timeline": {k: m.get(k) for k in ("running", "init_done", "failed", "stopped")},
           "checkpoints": [{"path": "step_%d.pt" % i, "began": b + offset, "ended": e + offset,
                            "step": i, "kind": "file", "bytes": 10, "stall": True}
                           for i, (b, e) in enumerate(checkpoints)],
           "checkpoint_watch": {"dir": watch_dir, "warnings": []}}
    if clock:
        out["clock"] = {"offset_s": offset, "rtt_s": 0.01, "looks": 3}
    return out


def test_every_record_time_is_put_on_the_controllers_clock_with_its_attempts_offset():
    first = _record(1010.0, failure={"host": "node2", "reason": LOST},
                    timeline={"running": 1012.0, "init_done": 1015.0, "failed": 1040.0,
                              "stopped": 1044.0},
                    checkpoints=[(1025.0, 1027.0)], watch_dir="/ckpt")
    second = _record(1060.0, timeline={"running": 1062.0, "init_done": 1065.0,
                                       "failed": None, "stopped": 1080.0}, offset=-5.0)
    times = {"started": 1000.0, "launched": {"0": 1008.0, "1": 1058.0},
             "attempts": [{"attempt": 0, "dir": "a0"}, {"attempt": 1, "dir": "a1"}]}
    tl = summary.timeline(times, {0: first, 1: second}, now=2000.0)
    assert tl["started"] == 1000.0 and tl["now"] == 2000.0 and tl["checkpoint_dir"] == "/ckpt"
    a, b = tl["attempts"]
    assert (a["attempt"], a["launch"], a["running"], a["init_done"], a["failed"],
            a["stopped"]) == (0, 1008.0, 1012.0, 1015.0, 1040.0, 1044.0)
    assert a["failure"] == {"check": "host.lost", "host": "node2"}
    assert [(c["began"], c["ended"], c["step"]) for c in a["checkpoints"]] == [
        (1025.0, 1027.0, 0)]
    assert (b["launch"], b["running"], b["failed"], b["stopped"], b["failure"]) == (
        1058.0, 1062.0, None, 1080.0, None)


def test_an_unmeasured_offset_is_zero_and_a_missing_launch_is_the_records_start():
    record = _record(500.0, timeline={"running": 502.0}, offset=7.0, clock=False)
    tl = summary.timeline({"attempts": [{"attempt": 0, "dir": "a0"}]}, {0: record}, now=600.0)
    assert tl["started"] is None
    assert (tl["attempts"][0]["launch"], tl["attempts"][0]["running"]) == (507.0, 509.0)


def test_a_final_record_ends_when_it_was_last_updated_and_carries_a_blind_watch():
    # A host never heard to stop (stopped unknown): the run ended at the record's last update,
    # not when the report is written; a watch that could not read the directory says so.
    record = _record(1000.0, failure={"host": "node1", "reason": FAILED},
                     timeline={"running": 1002.0, "init_done": 1003.0, "failed": 1040.0,
                               "stopped": None}, watch_dir="/ckpt")
    record.update(final=True, updated=1050.0 + OFFSET)
    record["checkpoint_watch"]["blind"] = True
    times = {"started": 990.0, "launched": {"0": 998.0}, "attempts": [{"attempt": 0, "dir": "a"}]}
    g = summary.run_goodput(times, record)
    assert g["wall_s"] == 60.0 and g["buckets"]["detection"] == 10.0
    assert g["buckets"]["lost_work"] is None and "could not read checkpoint_dir" in g["unknown"][0]


@pytest.mark.parametrize("failure, check", [
    ({"host": "node1", "reason": FAILED}, "run.exit"),
    ({"host": "node1", "reason": LOST}, "host.lost"),
    ({"host": "node1", "reason": "hung"}, "run.hang"),
    ({"host": "node1", "reason": "hardware"}, "run.hardware"),
    ({"host": "node1", "reason": "oom"}, "run.oom"),
    ({"host": "node1", "reason": "straggler"}, "run.straggler"),
    ({"host": None, "reason": "timeout"}, "run.timeout"),
    ({"host": None, "reason": STOPPED_BY_USER}, "run.stopped_by_user"),
])
def test_a_failure_is_named_by_the_check_id_the_report_names_it(failure, check):
    assert summary.check_of(failure) == check


def _decide(tmp_path, kind="train", times=True, attempts=()):
    record = _record(1010.0, failure={"host": "node1", "reason": FAILED},
                     timeline={"running": 1012.0, "init_done": 1015.0, "failed": 1040.0,
                               "stopped": 1042.0})
    (tmp_path / "run_state.json").write_text(json.dumps(record))
    params = {k: v["default"] for k, v in summary.ARGUMENT_SPEC.items() if "default" in v}
    params.update(kind=kind, run_id="r1", hosts=["node0", "node1"], ranks={}, world_size=2,
                  settings={"nproc_per_node": 1}, run_dir=str(tmp_path), state=None,
                  expect_results=False, attempts=list(attempts),
                  times={"started": 1000.0, "launched": {"0": 1008.0},
                         "attempts": [{"attempt": 0, "dir": str(tmp_path)}]} if times else {})
    return summary.decide(params)


def test_train_json_carries_the_goodput_of_the_runs_timeline_and_its_line_ends_the_table(
        tmp_path):
    out = _decide(tmp_path)
    report = json.loads((tmp_path / "train.json").read_text())
    g = report["goodput"]
    assert g == out["goodput"]
    assert g["wall_s"] == pytest.approx(42.0)
    assert g["buckets"]["preflight"] == pytest.approx(8.0)
    assert g["buckets"]["launch"] == pytest.approx(4.0)
    assert g["buckets"]["init"] == pytest.approx(3.0)
    assert g["buckets"]["detection"] == pytest.approx(2.0)
    assert g["buckets"]["lost_work"] is None  # no checkpoint_dir
    assert g["failures"][0]["check"] == "run.exit" and g["failures"][0]["host"] == "node1"
    assert out["table"].splitlines()[-1].startswith("goodput at most ")


def test_no_goodput_without_the_controllers_times_nor_for_a_collective_test_without_attempts(
        tmp_path):
    assert _decide(tmp_path, times=False)["goodput"] is None
    out = _decide(tmp_path, kind="collective")
    assert "goodput" not in out
    assert "goodput" not in json.loads((tmp_path / "collective.json").read_text())


def _report_goodput():
    """train.json's goodput of a run restarted once: node2 lost 25 s after its last
    checkpoint ended (watched), the restart ended ok."""
    from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import goodput

    return goodput.goodput({
        "started": 1000.0, "now": 1200.0, "checkpoint_dir": "/ckpt",
        "attempts": [
            {"attempt": 0, "launch": 1010.0, "running": 1015.0, "init_done": 1020.0,
             "failed": 1100.0, "stopped": 1105.0,
             "failure": {"check": "host.lost", "host": "node2"},
             "checkpoints": [{"path": "step_50.pt", "began": 1070.0, "ended": 1075.0,
                              "step": 50, "stall": True}]},
            {"attempt": 1, "launch": 1120.0, "running": 1125.0, "init_done": 1130.0,
             "failed": None, "stopped": 1180.0, "failure": None, "checkpoints": []}]})


def test_result_goodput_is_the_reports_object_typed(tmp_path):
    from torchfleet import results

    g = _report_goodput()
    result = results.from_report("train", {"ok": True, "run_id": "r1", "goodput": g}, tmp_path)
    assert isinstance(result.goodput, results.Goodput)
    assert result.goodput.ratio == g["ratio"] and result.goodput.wall_s == 180.0
    assert result.goodput.buckets.lost_work == 25.0 and result.goodput.buckets.restart == 15.0
    assert [(a.attempt, a.buckets.launch) for a in result.goodput.attempts] == [(0, 5.0),
                                                                                  (1, 5.0)]
    assert result.goodput.failures == [results.GoodputFailure(0, "host.lost", "node2", 1100.0,
                                                              g["failures"][0]["cost_s"])]
    assert result.goodput.checkpoints == [results.Checkpoint("step_50.pt", 1070.0, 1075.0, 50)]
    assert result.goodput.line.startswith("goodput %d %%; 1 restart cost " % round(
        g["ratio"] * 100))
    assert result.to_dict()["goodput"]["buckets"]["kept_training"] == g["buckets"][
        "kept_training"]
    assert results.from_report("train", {"ok": True}, tmp_path).goodput is None


def test_status_of_a_gathered_run_says_its_goodput_and_of_a_live_one_so_far(tmp_path):
    from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import status
    from torchfleet import rundirs

    g = _report_goodput()
    gathered = rundirs.from_report("r1", "train", {"ok": True, "verdict": "train ok after 1 "
                                                   "restart", "hosts": [], "goodput": g})
    assert gathered.goodput.startswith("goodput ") and "1 restart cost" in gathered.goodput
    assert gathered.goodput in rundirs.text(gathered).splitlines()
    assert rundirs.from_report("r1", "train", {"ok": True, "hosts": []}).goodput == ""
    # A run that goes on: its master's record alone, read at the master's `now`.
    record = _record(1010.0, timeline={"running": 1012.0, "init_done": 1015.0}, offset=0.0)
    view = status.view(record, 1040.0)
    assert view["goodput"].startswith("goodput ") and " so far" in view["goodput"]
    assert view["goodput"] in status.text(view)
    assert rundirs.from_view("train", view).goodput == view["goodput"]


def test_the_live_progress_shows_the_watchs_goodput_line_until_the_next_one():
    from torchfleet.progress import Progress
    from torchfleet.runner import Event

    progress = Progress(__import__("io").StringIO())
    progress(Event(kind="run", status="running", summary={"ranks_alive": 2, "nranks": 2}))
    assert not any(line.startswith("goodput") for line in progress.lines())
    said = "goodput 91 % so far; no failure"
    progress(Event(kind="run", status="running", summary={"ranks_alive": 2, "nranks": 2,
                                                          "goodput": said}))
    progress(Event(kind="run", status="running", summary={"ranks_alive": 2, "nranks": 2}))
    assert progress.lines()[-1] == said
    assert progress.summary_line().endswith("| " + said)


def test_the_html_report_draws_a_bar_per_attempt_coloured_by_bucket_with_a_legend(tmp_path):
    import html
    import re

    from torchfleet import html_report, results

    g = _report_goodput()
    page = html_report.render(results.from_report("train", {"ok": True, "run_id": "r1",
                                                            "goodput": g}, tmp_path))
    line = results.from_report("train", {"goodput": g}, tmp_path).goodput.line
    assert "<h2>Goodput</h2>" in page and html.escape(line) in page
    bars = re.findall(r'<rect class="bucket" data-bucket="(\w+)" x="([\d.]+)" y="(\d+)" '
                      r'width="([\d.]+)"', page)
    first = [b for b, _x, y, _w in bars if y == "4"]
    second = [b for b, _x, y, _w in bars if y == "30"]
    assert first == ["preflight", "launch", "init", "kept_training", "checkpoint_stall",
                     "lost_work", "detection", "restart"]
    assert second == ["launch", "init", "kept_training"]
    # Each bar starts where the one before ended, on the run's time axis (620 px).
    widths = [float(w) for _b, _x, y, w in bars if y == "4"]
    assert float([x for _b, x, y, _w in bars if y == "30"][0]) == pytest.approx(
        90 + sum(widths), abs=0.3)
    assert all(name.replace("_", " ") in page.split('class="legend"')[1].split("</p>")[0]
               for name, _c in html_report.BUCKET_COLOURS)
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    page = html_report.render(results.from_report("train", {"ok": True, "run_id": "r1"},
                                                  tmp_path))
    assert "Goodput" not in page


def test_the_watch_reads_the_runs_times_from_the_controllers_facts():
    from ansible_collections.torchfleet.fleet.plugins.action.torchrun_watch import (
        controller_times)

    facts = {"torchfleet_started": 1000.5, "torchfleet_launched": {"0": "1010.25"},
             "launch_attempts": [{"attempt": 0, "dir": "/runs/r1", "hosts": ["node0"]}]}
    assert controller_times({"hostvars": {"localhost": facts}}) == {
        "started": 1000.5, "launched": {"0": 1010.25},
        "attempts": [{"attempt": 0, "dir": "/runs/r1"}]}
    assert controller_times({}) == {}


def test_a_detached_runs_record_keeps_the_controllers_times_for_its_attach(tmp_path):
    from ansible_collections.torchfleet.fleet.plugins.action.run_record import ActionModule
    from ansible_collections.torchfleet.fleet.plugins.module_utils.run import detach

    action = ActionModule.__new__(ActionModule)  # decide() alone: no task, no connection
    action._times = {"started": 1000.0, "launched": {"0": 1010.0}, "attempts": []}
    params = {k: v.get("default") for k, v in detach.ARGUMENT_SPEC.items()}
    params.update(state="present", run_id="r1", runs_root=str(tmp_path), owner_pid=1,
                  record={"hosts": {"node0": {}}, "master": "node0"})
    (tmp_path / "r1").mkdir()  # the launch made it
    action.decide(params)
    record = json.loads((tmp_path / "r1" / detach.RECORD).read_text())
    assert record["times"] == {"started": 1000.0, "launched": {"0": 1010.0}}


def test_the_watch_says_goodput_so_far_from_the_controllers_times_and_the_record(tmp_path):
    from ansible_collections.torchfleet.fleet.plugins.action.torchrun_watch import ActionModule

    action = ActionModule.__new__(ActionModule)  # _goodput() alone: no task, no connection
    action.clock, action.params = Clock(), {"attempt": 0}
    action.clock.take(100.0, 100.02, {"began": 130.005, "now": 130.015})
    facts = {"torchfleet_started": 1000.0, "torchfleet_launched": {"0": 1008.0},
             "launch_attempts": [{"attempt": 0, "dir": str(tmp_path)}]}
    record = _record(1010.0, timeline={"running": 1012.0, "init_done": 1015.0})
    said = action._goodput({"hostvars": {"localhost": facts}}, record, 1040.0 + OFFSET)
    assert said.startswith("goodput ") and " so far; no failure" in said
    # Outside a launch (status, an attach without the facts): the record alone.
    assert action._goodput({}, record, 1040.0 + OFFSET).startswith("goodput ")
    assert action._goodput({}, {"garbled": True}, None) == ""


def test_the_watch_takes_the_whole_record_once_a_minute_and_writes_goodput_so_far(
        tmp_path, monkeypatch):
    from ansible_collections.torchfleet.fleet.plugins.action import torchrun_watch
    from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults

    monkeypatch.setattr(defaults, "GOODPUT_SAY_S", 0.0)  # every look is a minute apart
    record = _record(1010.0, timeline={"running": 1012.0, "init_done": 1015.0}, offset=0.0)
    record.update(final=False, nnodes=1, nproc_per_node=1)
    asked = []

    def look(task_vars, **args):
        asked.append(args.get("full", False))
        final = len(asked) > 2
        rec = dict(record, phase=SUCCEEDED if final else "running", final=final)
        return {"state": "final" if final else "running", "now": 1040.0,
                "summary": {"phase": rec["phase"], "final": final, "elapsed_s": 30.0,
                            "nranks": 1, "ranks_alive": 1, "hosts_running": 1, "nnodes": 1,
                            # (a straggler named while goodput is said: the watch crashed on it)
                            "stragglers": ["node2 (rank 2): the others wait 30 ms for it"]},
                "record": rec if args.get("full") or final else None}

    action = torchrun_watch.ActionModule.__new__(torchrun_watch.ActionModule)
    action.clock = Clock()
    action.params = {"mode": "attached", "poll_s": 0.0, "progress_every_s": 10.0,
                     "settle_s": 0.0, "lost_after_s": 30.0, "lease_s": 60.0, "stop_now": "",
                     "attempt": 0, "progress_file": str(tmp_path / "progress.jsonl")}
    monkeypatch.setattr(action, "_look", look)
    _look, failure, final = action._follow({}, "node0", {}, __import__("time").monotonic())
    assert asked[:2] == [True, True] and final["phase"] == SUCCEEDED
    lines = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert lines[0]["goodput"].startswith("goodput ") and " so far" in lines[0]["goodput"]


@pytest.mark.parametrize("garbled", [
    {"checkpoints": 7, "checkpoint_watch": {"warnings": "x"}, "timeline": [1, 2]},
    {"checkpoints": [None, "a", {"began": "x"}], "timeline": {"running": "soon"}, "started": {}},
    {"clock": 3, "failure": "lost", "checkpoint_watch": 5},
    # Numbers JSON can carry that are no times: a 400-digit int (OverflowError in float()), inf.
    {"timeline": {"running": 10**400, "stopped": float("inf")}, "started": 10**400,
     "checkpoints": [{"path": "a", "began": 10**400, "ended": float("inf")}],
     "clock": {"offset_s": 10**400}},
])
def test_a_garbled_record_reads_as_unknown_and_status_still_says_something(garbled):
    from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import status

    record = dict(_record(1010.0, timeline={"running": 1012.0}), **garbled)
    view = status.view(record, 1100.0)
    assert view["goodput"].startswith("goodput")
    tl = summary.timeline({"attempts": [{"attempt": 0, "dir": "a0"}]}, {0: record}, 1100.0)
    assert isinstance(tl["attempts"][0]["checkpoints"], list)


def test_the_watch_names_the_hosts_judged_lost_which_the_play_leaves_out_of_its_gather():
    # (follow.yml read launch_watch.record, which the watch never returns: the lost host was
    # stopped and gathered before the restart, each waiting out its SSH timeout, about 7 s.)
    from ansible_collections.torchfleet.fleet.plugins.action.torchrun_watch import judged_lost
    record = {"hosts": [{"host": "node0", "state": "exited"}, {"host": "node2", "state": "lost"},
                        {"host": 3, "state": "lost"}, "x", {"state": "lost"}]}
    assert judged_lost(record) == ["node2"] and judged_lost({}) == []
    follow = (Path(__file__).parents[2] / "src/ansible_collections/torchfleet/fleet/roles/launch"
              / "tasks/follow.yml").read_text()
    assert "launch_watch.lost" in follow and "launch_watch.record" not in follow
