"""Hang diagnosis on the lab: 2 nodes x 2 ranks (the smallest shape with a rank that is neither
the master's nor its host's first, and a data-parallel group across hosts), real torchrun over
real SSH, gloo with torch's Flight Recorder on (the default), each case a fault a user hits (the
script: tests/fixtures/scripts/collective_fault.py). The verdict names the rank, the collective
and where the rank is; a clean run names nobody; nothing of a run is left on any host."""
from __future__ import annotations

import pytest

from tests.conftest import FIXTURES, run_processes
from tests.integration.playbook import playbook
from torchfleet.results import load

pytestmark = pytest.mark.lab
SCRIPT = FIXTURES / "scripts" / "collective_fault.py"
AT = 15  # the collective the bad rank (3, the second of node1) goes wrong before
# The silence that is a hang. The ranks' logs get a line a second until their first step and
# from their last line until they are gone (collective_fault.py: a torch import and an
# interpreter's exit slowed by load are a start and an end), and the torchruns' own end after
# their ranks' is not judged (runstate.tick), so what counts is a gap between two steps of a
# running loop (50 ms apart) and the agents' reports of it (each second).
HANG_TIMEOUT_S = 6
STUCK = next(i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1)
             if "STUCK-HERE" in line)
HEAD = "train failed: hang at collective #%d (all_reduce, 1.0 MiB, group 0): node1 rank 3 " % AT


def run_fault(lab, tmp_path, fault, *extra):
    return playbook("train.yml", tmp_path, "-e", "nnodes=2", "-e", "nproc_per_node=2",
                    "-e", "script=%s" % SCRIPT, "-e", "hang_timeout_s=%d" % HANG_TIMEOUT_S,
                    "-e", '{"script_args": ["%s", "3", "%d"]}' % (fault, AT), *extra,
                    inventory=lab.inventory)


@pytest.mark.parametrize("fault, named", [
    ("sleep", "never joined; it is in load_batch (collective_fault.py:%d)" % STUCK),
    # Its log keeps growing: only the collectives say it is stuck.
    pytest.param("print", "never joined; it is in load_batch (collective_fault.py:", marks=pytest.mark.slow),
    pytest.param("other_op", "called all_gather (16 B, Float)", marks=pytest.mark.slow),
])
def test_a_hang_names_the_rank_the_collective_and_where_it_is(healthy_lab, tmp_path, fault,
                                                              named):
    run = run_fault(healthy_lab, tmp_path, fault)
    assert run.rc != 0
    report = run.report("train.json")
    assert report["verdict"].startswith(HEAD + named), report["verdict"]
    assert report["verdict"] in run.out
    assert {h["outcome"] for h in report["hosts"]} == {"hung"}
    hang = {c["host"]: c["detail"] for c in report["checks"] if c["id"] == "run.hang"}
    assert hang["node1"].startswith("rank 3 ")
    assert hang["node0"].startswith("its ranks waited in collective #%d" % AT)
    # The Python API and the HTML report read the same finding from the same record.
    found = load(run.run_dir).first_failure.collective
    assert [(m.host, m.rank) for m in found.missing + found.mismatch] == [("node1", 3)]
    assert found.seq == AT
    # Every rank's recording, in torch's format, beside its stack.
    assert len(list(run.run_dir.glob("logs/*/attempt_0/*/fr_trace_rank_*"))) == 4
    assert run_processes(report["run_id"]) == []


@pytest.mark.slow  # a variant: the hang above, among tensor-parallel groups
def test_a_hang_in_one_data_parallel_group_names_its_rank_among_tensor_parallel_groups(
        healthy_lab, tmp_path):
    """Tensor-parallel groups of each host's two ranks and data-parallel groups across the
    hosts, both used every step: every rank's pg_id 1 is another group. Rank 3 stops between
    its tensor- and its data-parallel all_reduce of step AT; rank 1 waits for it in that
    data-parallel collective, and the tensor-parallel partners of both (2 and 0) then wait in
    the next step's. The verdict names rank 3 alone, in its data-parallel group's collective
    #AT, not a "collective" merged from groups that share a pg_id."""
    run = run_fault(healthy_lab, tmp_path, "groups")
    assert run.rc != 0
    report = run.report("train.json")
    verdict = report["verdict"]
    # Its data-parallel #AT, or its tensor-parallel #AT+1 its partner waits in: both true.
    assert verdict.startswith(tuple("train failed: hang at collective #%d (all_reduce, 1.0 MiB, "
                                    "group " % seq for seq in (AT, AT + 1))), verdict
    assert "node1 rank 3 never joined; it is in load_batch (collective_fault.py:" in verdict, \
        verdict
    found = load(run.run_dir).first_failure.collective
    assert [(m.host, m.rank) for m in found.missing + found.mismatch] == [("node1", 3)]
    assert run_processes(report["run_id"]) == []


@pytest.mark.slow
def test_a_size_mismatch_under_gloo_is_the_abort_of_the_rank_that_received_it(healthy_lab,
                                                                              tmp_path):
    """gloo does not wait on a size mismatch: the rank that receives the larger message aborts
    at once (SIGABRT, "Received data size doesn't match expected size"), before any position
    held still. The verdict is that rank's death with gloo's words, and names nobody from
    positions that were still moving (the rule's own case is in tests/unit/test_flight.py)."""
    run = run_fault(healthy_lab, tmp_path, "other_size")
    assert run.rc != 0
    report = run.report("train.json")
    failure = report["first_failure"]
    assert failure["exit_code"] == -6 and "exited with -6" in report["verdict"], report["verdict"]
    assert "never joined" not in report["verdict"] and "called" not in report["verdict"]
    assert "Received data size doesn't match expected size" in failure["tail"]
    assert run_processes(report["run_id"]) == []


def test_a_clean_run_names_nothing_and_every_rank_reported_its_collectives(healthy_lab,
                                                                          tmp_path):
    run = run_fault(healthy_lab, tmp_path, "none")
    assert run.rc == 0, run.out
    report = run.report("train.json")
    assert report["ok"] and report["first_failure"] is None
    state = (run.run_dir / "run_state.json").read_text()
    assert '"coll": {}' not in state  # every host's ranks reached the master's record
    assert run_processes(report["run_id"]) == []


def test_a_rank_the_oom_killer_ends_is_named_with_the_kernels_own_line(healthy_lab, tmp_path):
    """node1's sessions in a memory cgroup of 1.5 GiB (a container's or a Slurm job's limit);
    its rank allocates past it at step 5 and the kernel's OOM killer ends it. The lab hosts
    share this machine's kernel: the line is the kernel's own, in /dev/kmsg, and its PID says
    whose rank it was. The verdict names that host, that rank and the OOM killer, not the
    peers that died waiting; the host is not drained and the run is not restarted."""
    healthy_lab.limit_memory("node1", 1536)
    run = playbook("train.yml", tmp_path, "-e", "nnodes=2", "-e", "nproc_per_node=1",
                   "-e", "script=%s" % (FIXTURES / "scripts" / "oom_rank.py"),
                   "-e", '{"script_args": ["1", "5"]}', "-e", "spares=1",
                   "-e", "max_restarts=1", inventory=healthy_lab.inventory)
    assert run.rc != 0
    report = run.report("train.json")
    assert report["verdict"].startswith(
        "train failed: node1 rank 1 was killed by the kernel's OOM killer (memory cgroup, "
        "anon-rss "), report["verdict"]
    assert "not restarted: the kernel's OOM killer ended a rank on node1" in report["verdict"]
    event = report["first_failure"]["event"]
    assert event["kind"] == "oom" and event["line"].startswith(
        "Memory cgroup out of memory: Killed process %d (" % event["pid"])
    assert [c["host"] for c in report["checks"] if c["id"] == "run.oom"] == ["node1"]
    assert report["drain"] == []
    assert run_processes(report["run_id"]) == []
