"""bench/accuracy.py's scorer: from a report the project wrote, did it name the right host and
the right cause, and what did a clean run hold against any host. The inputs are reports the
lab wrote (tests/fixtures/accuracy/: the bench's own trials, trimmed to the fields read) and
the recorded H200 hang (tests/fixtures/h200-1gpu/hang-nccl/train.json)."""
from __future__ import annotations

import copy
import json

import pytest

from bench.accuracy import clean_verdict, held_against, named_hosts, routine_lines, score
from tests.conftest import FIXTURES


def report(name):
    return json.loads((FIXTURES / "accuracy" / name).read_text())


EXIT, XID79, PORT = report("exit.train.json"), report("xid79.train.json"), report(
    "port-blocked.preflight.json")
CLEAN, HUNG, OOM = (report(n) for n in ("clean-noise.train.json", "hang.train.json",
                                         "oom.train.json"))
HANG = json.loads((FIXTURES / "h200-1gpu" / "hang-nccl" / "train.json").read_text())


@pytest.mark.parametrize("found, host, check, kwargs, expected", [
    (EXIT, "node1", "run.exit", {"exit_code": 3}, (True, True)),
    # The right host, the wrong cause: a SIGKILL expected, an exit code 3 found.
    (EXIT, "node1", "run.exit", {"exit_code": -9}, (True, False)),
    # node0 fails run.exit too (its rank aborted): the cause is there, the host is not named.
    (EXIT, "node0", "run.exit", {"exit_code": 3}, (False, True)),
    (XID79, "node1", "run.hardware", {}, (True, True)),
    (XID79, "node1", "run.oom", {}, (True, False)),
    (OOM, "node1", "run.oom", {}, (True, True)),
    # node0's kernel log (this machine's, shared by every lab) held a warning: not a cause.
    (OOM, "node0", "run.hardware", {}, (False, False)),
    (PORT, "node1", "port.blocked", {"detail": "10.77.48.1:29500"}, (True, True)),
    # The check must name the blocked host's address and port.
    (PORT, "node1", "port.blocked", {"detail": "10.77.48.2:29500"}, (True, False)),
    # A hang that names no rank (the recorded H200's: no collective recorded) names no host.
    (HANG, "gpuhost", "run.hang", {}, (False, True)),
])
def test_score_reads_the_host_and_the_cause_from_the_report(found, host, check, kwargs,
                                                           expected):
    assert score(found, host, check, **kwargs) == expected


def test_a_hang_names_the_ranks_its_collective_names():
    assert HUNG["first_failure"]["host"] is None
    assert named_hosts(HUNG, "run.hang") == ["node1"]
    assert score(HUNG, "node1", "run.hang") == (True, True)
    # (node0 fails run.hang too, "its ranks waited": the cause is there, it is not named.)
    assert score(HUNG, "node0", "run.hang") == (False, True)


def test_a_straggler_is_named_by_the_stragglers_not_the_first_failure():
    ran = dict(copy.deepcopy(CLEAN), stragglers=[{"host": "node2", "ranks": [2]}])
    ran["checks"].append({"id": "run.straggler", "host": "node2", "ok": False,
                          "severity": "warning", "detail": "late"})
    assert score(ran, "node2", "run.straggler") == (True, True)
    ran["stragglers"].append({"host": "node0", "ranks": [0]})
    assert score(ran, "node2", "run.straggler") == (False, True)


def test_a_preflight_with_another_failing_check_has_the_wrong_cause():
    more = copy.deepcopy(PORT)
    more["checks"].append({"id": "host.disk", "host": "node1", "ok": False,
                           "severity": "error", "detail": "full"})
    assert score(more, "node1", "port.blocked") == (True, False)


def test_a_clean_run_with_routine_noise_holds_warnings_only():
    verdict = clean_verdict(CLEAN)
    assert verdict["ok"] and verdict["failures"] == [] and verdict["actions"] == []
    assert not verdict["quarantined"] and not verdict["drained"]
    assert verdict["warnings"] == ["run.hardware warning node0", "run.hardware warning node1"]


def test_a_failed_run_its_drain_and_its_actions_are_held_against_the_host():
    assert ("drain", "node1") in held_against(XID79)
    verdict = clean_verdict(XID79)
    assert not verdict["ok"] and verdict["drained"]
    assert "first failure node1" in verdict["failures"]
    observed = dict(copy.deepcopy(CLEAN), actions=[
        {"action": "quarantine", "host": "node1", "check": "run.hardware", "done": False}])
    assert held_against(observed)[-1] == ("would quarantine", "node1")
    assert clean_verdict(observed)["quarantined"]


def test_the_routine_lines_are_recorded_ones_and_none_is_a_fatal_rows():
    lines = routine_lines()
    assert len(lines) > 20
    assert not any("Cable unplugged" in line or "device recovery failed" in line
                   or ": 79," in line for line in lines)
