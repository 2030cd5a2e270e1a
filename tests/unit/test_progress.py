"""The CLI's progress: one line per phase and the failing hosts, never taller than the terminal;
one summary line every few seconds off a terminal. (A real terminal: tests/lab/test_scale_lab.py.)"""
from __future__ import annotations

import io
import re
import threading

from torchfleet.progress import Progress
from torchfleet.results import Check
from torchfleet.runner import Event, translate


class Terminal(io.StringIO):
    def isatty(self):
        return True


def probe(host, status="ok"):
    return Event(kind="task", host=host, task="Probe the host", action="node_probe",
                 status=status)


def failing_preflight(progress, hosts=40, failing=(5, 17, 33)):
    progress(Event(kind="plan", summary={"candidates": hosts}))
    for i in range(hosts):
        progress(probe("node%d" % i))
    for i in failing:
        progress(Event(kind="check", host="node%d" % i,
                       check=Check("node%d" % i, "hostname.loopback", False, "127.0.1.1")))


def test_one_line_per_phase_then_the_failing_hosts():
    progress = Progress(Terminal())
    failing_preflight(progress)
    progress(Event(kind="task", host="node21", task="Probe", action="node_probe",
                   status="unreachable"))
    for i in range(40):
        progress(Event(kind="task", host="node%d" % i, task="Start", action="torchrun_job",
                       status="ok"))
    progress(Event(kind="run", status="running", elapsed_s=4.0, summary={
        "ranks_alive": 79, "nranks": 80, "slowest": {"host": "node9", "idle_s": 3.0},
        "failure": {"host": "node12", "reason": "rank.exit"}}))
    lines = progress.lines()
    assert lines[0].startswith("preflight") and "41 of 40" not in lines[0]
    assert "40 of 40 hosts checked · 4 failing" in lines[0]
    assert lines[1].startswith("launch") and "40 of 40 hosts started" in lines[1]
    assert lines[2].startswith("run") and "ranks alive 79 of 80" in lines[2]
    assert "quietest node9 (no log line for 3 s)" in lines[2] and "first failure: node12 rank.exit" in lines[2]
    hosts = [line.split()[0] for line in lines[3:]]
    assert hosts == ["node5", "node17", "node33", "node21", "node12"]


def test_the_failing_hosts_are_cut_to_the_terminal_height():
    progress = Progress(Terminal())
    failing_preflight(progress, hosts=60, failing=range(50))
    lines = progress.lines(height=10)
    assert len(lines) == 9  # one row left for the cursor
    assert lines[-1] == "  … and 43 more failing host(s)"
    assert progress.lines(height=2) == [progress.lines()[0]]  # only the phase fits


def test_a_terminal_frame_is_redrawn_in_place_and_never_taller_than_the_screen():
    term = Terminal()
    with Progress(term, height=12) as progress:
        failing_preflight(progress, hosts=60, failing=range(50))
    frames = term.getvalue()
    # rich moves the cursor up over its last frame before each redraw: what ends on the
    # screen is the last frame, at most height - 1 rows, never a copy per redraw.
    last = re.split(r"\x1b\[\d*A", frames)[-1]
    rows = [r for r in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", last).split("\n") if r.strip()]
    assert 1 < len(rows) <= 11
    assert "60 of 60 hosts checked · 50 failing" in rows[0]
    assert rows[-1].strip().startswith("… and")


def test_off_a_terminal_one_summary_line_every_period():
    stream = io.StringIO()
    printed = threading.Event()

    class Watched(io.StringIO):
        def write(self, text):
            stream.write(text)
            printed.set()
            return len(text)

    with Progress(Watched(), every_s=0.05) as progress:
        failing_preflight(progress, hosts=4, failing=[2])
        assert printed.wait(30)
    out = stream.getvalue().splitlines()
    assert out and all(line.startswith("torchfleet: preflight") for line in out)
    assert "4 of 4 hosts checked · 1 failing" in out[-1] and "failing: node2" in out[-1]
    assert "\x1b" not in stream.getvalue()


def test_silent_off_a_terminal_before_the_first_period():
    stream = io.StringIO()
    with Progress(stream, every_s=3600) as progress:
        failing_preflight(progress, hosts=2, failing=[1])
    assert stream.getvalue() == ""


def test_runner_events_become_task_check_and_plan_events():
    event = {"event": "runner_on_ok", "event_data": {
        "host": "localhost", "task": "Decide", "task_action": "torchfleet.fleet.preflight_checks",
        "res": {"checks": [{"host": "node1", "id": "port.blocked", "ok": False,
                            "detail": "dropped", "hint": "allow TCP 29500"}]}}}
    task, check = translate(event)
    assert (task.kind, task.host, task.status, task.action) == (
        "task", "localhost", "ok", "preflight_checks")
    assert check.kind == "check" and check.check == Check("node1", "port.blocked", False,
                                                           "dropped", "allow TCP 29500")
    plan = translate({"event": "runner_on_ok", "event_data": {
        "host": "node0", "task": "Plan", "task_action": "torchfleet.fleet.run_plan",
        "res": {"candidates": 40}}})[1]
    assert (plan.kind, plan.summary) == ("plan", {"candidates": 40})
    assert translate({"event": "playbook_on_start"}) == []


def test_a_restart_starts_the_block_again_under_a_line_that_says_why():
    """Attempt 0 on 40 hosts, node12 lost; the restart's decision (the restart_plan task's
    result, as ansible-runner reports it) clears the counts: attempt 1's launch counts its own
    hosts, not 80 of 40, and attempt 0's failing hosts are no longer listed."""
    progress = Progress(Terminal())
    failing_preflight(progress, failing=())
    for i in range(40):
        progress(Event(kind="task", host="node%d" % i, action="torchrun_job", status="ok"))
    progress(Event(kind="run", status="lost", summary={"failure": {"host": "node12",
                                                                   "reason": "lost"}}))
    restart = translate({"event": "runner_on_ok", "event_data": {
        "host": "localhost", "task": "Decide the restart",
        "task_action": "torchfleet.fleet.restart_plan",
        "res": {"restart": True, "next_attempt": 1, "why": "node12 host.lost, replaced by node40"}}})
    assert restart[1].kind == "attempt"
    progress(restart[1])
    for i in list(range(12)) + list(range(13, 41)):
        progress(Event(kind="task", host="node%d" % i, action="torchrun_job", status="ok"))
    lines = progress.lines()
    assert lines[0] == "restart   attempt 1: node12 host.lost, replaced by node40"
    assert lines[1].startswith("launch") and "40 of 40 hosts started" in lines[1]
    assert len(lines) == 2  # node12 of attempt 0 is not a failing host of attempt 1
    # No restart decided: no event.
    assert [e.kind for e in translate({"event": "runner_on_ok", "event_data": {
        "host": "localhost", "task_action": "torchfleet.fleet.restart_plan",
        "res": {"restart": False, "why": "not restarted: max_restarts=1 used"}}})] == ["task"]
