"""The pair rounds on 4 lab nodes with real tc faults: a rate-limited NIC (tbf, both ways) is
named node.slow and nothing else is; a rate-limited pair of nodes (htb by destination) is
named link.slow and nothing else is; a clean lab names nothing. The report's heat map is
rendered by headless chromium."""
from __future__ import annotations

import pytest

from tests.api.test_report_browser import chromium
from tests.conftest import processes_matching
from tests.integration.playbook import playbook
from torchfleet import html_report

pytestmark = pytest.mark.lab
# A small world sweep: the pair rounds are what these tests look at.
ISOLATE = ("-e", "collective_isolate=true", "-e", "collective_sizes=64K", "-e",
           "collective_iters=3")


def failed(report, *ids):
    return sorted((c["id"], c["host"]) for c in report["checks"]
                  if c["id"] in ids and not c["ok"])


def run_isolate(lab, tmp_path, nnodes=4):
    run = playbook("collective.yml", tmp_path, *ISOLATE, "-e", "nnodes=%d" % nnodes,
                   inventory=lab.inventory)
    report = run.report("collective.json")
    assert processes_matching(report["run_id"]) == []
    return run, report


def test_a_clean_lab_names_no_slow_host_or_link_with_an_odd_number_of_hosts(healthy_lab,
                                                                            tmp_path):
    # 3 hosts: three rounds of one pair, two hosts sitting out each round.
    run, report = run_isolate(healthy_lab, tmp_path, nnodes=3)
    assert run.rc == 0, run.out[-4000:]
    iso = report["isolate"]
    assert iso["schedule"] == "ring" and iso["rounds"] == 3
    assert sorted((p["a"], p["b"]) for p in iso["pairs"]) == [
        ("node0", "node1"), ("node0", "node2"), ("node1", "node2")]
    assert failed(report, "node.slow", "link.slow") == []
    assert all(p["busbw_gbs"] > 0 and p["latency_us"] > 0 for p in iso["pairs"]), iso["pairs"]
    # Every run also shows each host's busbw at the largest size of the sweep.
    largest = max(r["size_bytes"] for r in report["busbw"] if r["op"] == "all_reduce")
    assert all(h["busbw_gbs"]["size_bytes"] == largest for h in report["hosts"])
    assert "BUSBW GB/s min/med/max" in run.out


def test_a_slowed_nic_is_named_as_node_slow_and_only_it(healthy_lab, tmp_path):
    healthy_lab.slow_nic("node2")
    run, report = run_isolate(healthy_lab, tmp_path)
    assert run.rc != 0
    assert failed(report, "node.slow", "link.slow") == [("node.slow", "node2")]
    (check,) = [c for c in report["checks"] if c["id"] == "node.slow" and not c["ok"]]
    assert "ethtool eth0" in check["hint"]
    assert "node.slow: node2" in run.out

    page = html_report.write(run.run_dir, tmp_path / "report.html")
    dom = chromium(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert html.count('<th class="slow-node">node2</th>') == 2  # its column and its row
    slow_cells = html.count('class="pair slow"')
    assert slow_cells == 2 * 3  # its 3 partners, both halves of the symmetric map
    assert "node.slow: node2" in html


def test_a_slowed_pair_is_named_as_link_slow_and_only_it(healthy_lab, tmp_path):
    healthy_lab.slow_link("node1", "node2")  # ring neighbours: met in the second round
    run, report = run_isolate(healthy_lab, tmp_path)
    assert run.rc != 0
    assert failed(report, "node.slow", "link.slow") == [("link.slow", "node1")]
    assert report["isolate"]["slow_links"] == [["node1", "node2"]]
