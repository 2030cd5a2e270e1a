"""Rank order is inventory order on 12 lab nodes, where the string order of the addresses
(10.77.3.1, .10, .11, .12, .2, ...) is not: c10d's rendezvous would have given the tenth host
rank 1. A lab of its own, brought up for this module and removed after it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import processes_matching
from tests.integration.playbook import playbook
from tests.lab.conftest import LAB_DIR, lab_unavailable
from torchfleet import lab as labmod

pytestmark = pytest.mark.lab
NODES = 12
TAG = 4  # tests 1, molecule 2, bench 3
ROOT_DIR = LAB_DIR.with_name("torchfleet-lab-rank-order")
SCRIPT = Path(__file__).resolve().parents[1] / "fixtures" / "scripts" / "rank_identity.py"


@pytest.fixture(scope="module")
def lab12():
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    the_lab = labmod.Lab.up(NODES, ROOT_DIR, TAG)
    yield the_lab
    labmod.down(ROOT_DIR, TAG)
    assert labmod.our_namespaces(TAG) == [] and processes_matching(str(ROOT_DIR)) == []


def test_twelve_hosts_get_ranks_in_inventory_order_in_fork_batches(lab12, tmp_path):
    # forks=6: two batches for launch, stop and gather; the watch is one task on the master.
    # The hosts keep this run under a root of its own: the lab shares this machine's files
    # with the tests that run beside it (stop.yml on the default stops node0's runs).
    remote_root = tmp_path / "remote-runs"
    run = playbook("train.yml", tmp_path, "-f", "6", "-e", "nnodes=%d" % NODES,
                   "-e", "script=%s" % SCRIPT, "-e", "remote_runs_root=%s" % remote_root,
                   inventory=lab12.inventory)
    assert run.rc == 0, run.out[-4000:]
    report = run.report("train.json")
    names = ["node%d" % i for i in range(NODES)]
    assert [(h["host"], h["node_rank"], h["ranks"]) for h in report["hosts"]] == [
        (n, i, [i]) for i, n in enumerate(names)]
    assert sorted(lab12.node(n).address for n in names) != [lab12.node(n).address for n in names]
    remote = remote_root / report["run_id"]
    seen = [json.loads(p.read_text()) for p in remote.glob("*/results/identity-*.json")]
    assert sorted((s["rank"], s["node_rank"], s["host"]) for s in seen) == [
        (i, i, n) for i, n in enumerate(names)]
    # Every rank saw the same world: rank i is node rank i.
    assert all(s["world"] == list(range(NODES)) for s in seen)
    assert processes_matching(report["run_id"]) == []
