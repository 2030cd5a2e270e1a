"""The CLI's progress display: one line per host, redrawn in place on a terminal."""
from __future__ import annotations

import io

from torchfleet.progress import HostLines
from torchfleet.results import Check
from torchfleet.runner import Event, translate


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_one_line_per_host_redrawn_in_place():
    term = Terminal()
    lines = HostLines(term)
    lines(Event(kind="task", host="node0", task="Probe the host", status="ok"))
    lines(Event(kind="task", host="node1", task="Probe the host", status="ok"))
    lines(Event(kind="check", host="node1", check=Check("node1", "nic.missing", False, "no eth9")))
    lines(Event(kind="run", status="running", elapsed_s=4.0,
                summary={"ranks_alive": 2, "nranks": 2, "hosts_running": 2, "nnodes": 2,
                         "last_line": "step 3/10"}))
    out = term.getvalue()
    assert "\x1b[2A" in out  # moved back over the two host lines before redrawing
    last = out.rsplit("\x1b[2A", 1)[1]
    assert last.count("\n") == 3
    assert "node0" in last and "node1" in last and "FAILED nic.missing" in last
    assert "running" in last and "ranks alive 2 of 2" in last and "step 3/10" in last


def test_silent_off_a_terminal():
    stream = io.StringIO()
    HostLines(stream)(Event(kind="task", host="node0", task="Probe", status="ok"))
    assert stream.getvalue() == ""


def test_runner_events_become_task_and_check_events():
    event = {"event": "runner_on_ok", "event_data": {
        "host": "localhost", "task": "Decide", "task_action": "preflight_checks",
        "res": {"checks": [{"host": "node1", "id": "port.blocked", "ok": False,
                            "detail": "dropped", "hint": "allow TCP 29500"}]}}}
    task, check = translate(event)
    assert (task.kind, task.host, task.status) == ("task", "localhost", "ok")
    assert check.kind == "check" and check.check == Check("node1", "port.blocked", False,
                                                           "dropped", "allow TCP 29500")
    assert translate({"event": "playbook_on_start"}) == []
