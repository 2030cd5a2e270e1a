"""The pair rounds on 4 lab nodes with real tc faults: a rate-limited NIC (tbf, both ways) is
named node.slow and nothing else is; a rate-limited pair of nodes (htb by destination) is
named link.slow and nothing else is; a clean lab names nothing. The report's heat map is
rendered by headless chromium.

The module's 4-node lab is its own (tests/lab/conftest.py)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.api.test_report_browser import chromium
from tests.conftest import ROOT, run_processes
from tests.integration.playbook import BIN, playbook
from tests.lab.conftest import runs_root
from tests.lab.test_reliability_lab import wait_until
from torchfleet import html_report
from torchfleet import ansible_cli

# slow: docs/testing.md's tiers (bash tests/run --all, or --touching a source it covers)
pytestmark = [pytest.mark.lab, pytest.mark.slow]
REMOTE_RUNS = runs_root(Path(__file__).stem)  # its lab's remote_runs_root
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
    assert run_processes(report["run_id"]) == []
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


def test_a_pair_cut_during_the_rounds_is_a_slow_link_with_its_error_and_the_rest_run(
        healthy_lab, tmp_path):
    """gloo connects every pair when the world forms, so the cable between node1 and node3 is
    pulled once the rounds have begun; their pair (the chord round) times out, is named with
    gloo's error, and every other pair and round still reports. Nothing is left running."""
    run_id = "cut-pair-%d" % os.getpid()
    proc = subprocess.Popen(
        [*ansible_cli.command("ansible-playbook"), "collective.yml", "-i", str(healthy_lab.inventory),
         *ISOLATE, "-e", "nnodes=4", "-e", "collective_timeout_s=10", "-e", "run_id=%s" % run_id,
         # 16 MiB pairs: a round lasts long enough for the cut to land between rounds 0 and 2.
         "-e", "collective_pair_size=16M",
         # The cut pair is named by its error whatever the threshold; its round-mate (0, 2) has
         # no other finished pair in its round to share this loaded machine's slowness with, so
         # speed is not judged here (the slowed-NIC and slowed-pair tests judge it).
         "-e", "collective_isolate_threshold=0.05",
         "-e", "run_dir=%s" % (tmp_path / "run")], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
        env=dict(os.environ, PATH="%s:%s" % (BIN, os.environ.get("PATH", ""))))
    logs = REMOTE_RUNS / run_id / "node1" / "logs"
    assert wait_until(lambda: any("pair pass 0 round 0" in p.read_text(errors="replace")
                                  for p in logs.glob("**/stdout.log")), 240, 0.02), proc.poll()
    healthy_lab.cut_link("node1", "node3")  # (1, 3) meet in the last round
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0
    report = json.loads((tmp_path / "run" / "collective.json").read_text())
    assert failed(report, "node.slow", "link.slow") == [("link.slow", "node1")]
    pairs = {(p["a"], p["b"]): p for p in report["isolate"]["pairs"]}
    assert "Timed out" in pairs[("node1", "node3")]["error"]
    assert len(pairs) == 6 and all(p["busbw_gbs"] for k, p in pairs.items()
                                   if k != ("node1", "node3"))
    assert run_processes(run_id) == []
