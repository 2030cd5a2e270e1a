"""The report's chart from a busbw table where one host is slow (a made-up table: the real
ones come from the collective test in tests/api)."""
from __future__ import annotations

from pathlib import Path

from torchfleet.html_report import chart, render
from torchfleet.results import Attempt, BusbwRow, Check, Rank, Result


def row(size, low, med, high, host="node1"):
    return BusbwRow(op="all_reduce", size_bytes=size, count=size // 4, time_us=10.0,
                    algbw_gbs=med, busbw_min=low, busbw_median=med, busbw_max=high, wrong=0,
                    slowest_host=host, slowest_rank=3)


def test_a_slow_host_stands_out_in_the_band_and_its_point():
    svg = chart("all_reduce", [row(1 << 20, 9.0, 10.0, 11.0), row(16 << 20, 2.0, 20.0, 21.0, "gpu17")])
    assert svg.count("<circle") == 2
    assert svg.count('class="point slow"') == 1
    assert "slowest gpu17 (rank 3)" in svg
    assert 'class="band"' in svg and 'class="median"' in svg
    assert ">1 MiB<" in svg and ">16 MiB<" in svg


def test_render_is_self_contained_and_escapes_what_hosts_report():
    result = Result(kind="train", ok=False, run_id="r1", run_dir=Path("/tmp/r1"),
                    checks=[Check("n<1>", "run.exit", False, "<script>x</script>", "fix it")],
                    ranks=[Rank(0, "n<1>", 0, False, 3, "failed")])
    page = render(result)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "http" not in page.replace("http://www.w3.org/2000/svg", "")
    assert 'class="rank bad"' in page and ">3<" in page


def test_heat_map_outlines_the_slow_host_and_leaves_unmeasured_pairs_grey():
    from torchfleet.html_report import heat_map
    from torchfleet.results import Isolation, Pair

    pairs = [Pair("n0", "n1", 1.0, 50.0, None, False), Pair("n1", "n2", 0.05, 900.0, None, True),
             Pair("n0", "n2", None, None, "RuntimeError: <timed out>", True)]
    iso = Isolation("ring", 3, 2.5, 0.5, 1.0, pairs, ["n2"], [])
    html = heat_map(iso, ["n0", "n1", "n2"])
    assert html.count('<th class="slow-node">n2</th>') == 2
    assert html.count('class="pair slow"') == 4 and html.count('class="pair"') == 2
    assert html.count('class="none"') == 3  # the diagonal
    assert "&lt;timed out&gt;" in html and "node.slow: n2" in html


def test_every_attempt_of_a_restarted_run_is_a_row_with_what_followed_it():
    lost = Attempt(0, ["n0", "n1", "n2", "n3"], "lost", False, {"n2": "lost"},
                   "n2: no heartbeat for 5 s", "n2 host.lost, replaced by n4", "", [], "/r/a0")
    ok = Attempt(1, ["n0", "n1", "n3", "n4"], "succeeded", True, {}, "", "", "", [], "/r/a1")
    page = render(Result(kind="train", ok=True, run_id="r1", run_dir=Path("/r"),
                         attempts=[lost, ok]))
    assert "<h2>Attempts</h2>" in page
    assert "train ok after 1 restart: n2 host.lost, replaced by n4" in page  # the verdict
    assert page.count("<tr><td>") >= 2 and "n2: no heartbeat for 5 s" in page


def test_node_health_is_a_row_per_host_and_one_per_failed_gpu():
    raw = [{"id": "gpu.remap", "host": "cqnode5", "ok": False, "severity": "error",
            "detail": "GPU 3 (00000000:9B:00.0): row remapping pending (4 uncorrectable)",
            "hint": "reset GPU 3", "gpu": 3},
           {"id": "gpu.throttle", "host": "cqnode6", "ok": False, "severity": "warning",
            "detail": "GPU 1: clocks held down by HW Slowdown", "hint": "cooling", "gpu": 1},
           {"id": "host.disk", "host": "cqnode7", "ok": True, "severity": "info",
            "detail": "80 GiB free", "hint": ""},
           {"id": "port.blocked", "host": "cqnode7", "ok": True, "severity": "info",
            "detail": "open", "hint": ""}]
    result = Result(kind="preflight", ok=False, run_id="r1", run_dir=Path("/tmp/r1"),
                    checks=[Check.from_json(c) for c in raw])
    assert result.checks[0].gpu == 3 and result.checks[3].gpu is None
    page = render(result)
    health = page[page.index("<h2>Node health</h2>"):]
    assert "FAIL: gpu.remap" in health and "gpu.remap &middot; GPU 3" in health
    assert "warning: gpu.throttle" in health and "healthy (1 checks)" in health
    assert "port.blocked" not in health


def test_stragglers_are_a_timeline_of_when_each_was_named_or_said_not_watched():
    slow = {"host": "node<2>", "ranks": [2], "share_last": 0.9, "late_ms_median": 180.0,
            "first_seen": "2026-11-27T09:00:30Z", "last_seen": "2026-11-27T09:01:00Z"}
    result = Result(kind="train", ok=True, run_id="r1", run_dir=Path("/tmp/r1"),
                    checks=[Check("node<2>", "run.straggler", False, "node<2> (rank 2) last at 90 %",
                                  "look", "warning")],
                    stragglers=[slow], straggle={"watched": True, "signal": "calls",
                                                 "started": "2026-11-27T09:00:00Z",
                                                 "ended": "2026-11-27T09:02:00Z"})
    page = render(result)
    assert "<h2>Stragglers</h2>" in page and "node&lt;2&gt; (rank 2)" in page
    # The bar runs from 30 s to 60 s of a 120 s run: a quarter of the axis, from its quarter.
    assert '<rect x="350.0" y="4" width="150.0"' in page
    off = Result(kind="train", ok=True, run_id="r1", run_dir=Path("/tmp/r1"),
                 straggle={"watched": False})
    assert "Stragglers were not watched" in render(off)


def test_the_actions_are_a_table_with_what_was_done_and_what_would_have_been():
    """train.json's (and preflight.json's) audit was in no table of the report: each action is
    a row, "would have" where it was not done (actions=observe, the breaker, a refusal)."""
    actions = [{"action": "stop", "host": None, "check": "run.hang", "at": "2026-12-07T10:00:00Z",
                "why": "collective #12 waited 600 s", "done": True},
               {"action": "drain", "host": "n<2>", "check": "run.hardware",
                "at": "2026-12-07T10:00:05Z", "why": "Xid 79 <GPU 3>", "done": False}]
    result = Result(kind="train", ok=False, run_id="r1", run_dir=Path("/tmp/r1"),
                    actions=actions)
    page = render(result)
    table = page[page.index("<h2>Actions</h2>"):]
    table = table[:table.index("</table>")]
    assert table.count("<tr class=") == 2
    assert ('<tr class="ok"><td>stop</td><td>the run</td><td>run.hang</td>'
            '<td>2026-12-07T10:00:00Z</td><td>collective #12 waited 600 s</td><td>done</td></tr>'
            in table)
    assert ('<tr class="warn"><td>drain</td><td>n&lt;2&gt;</td><td>run.hardware</td>'
            '<td>2026-12-07T10:00:05Z</td><td>Xid 79 &lt;GPU 3&gt;</td><td>would have</td></tr>'
            in table)
    assert "<h2>Actions</h2>" not in render(Result(kind="train", ok=True, run_id="r1",
                                                   run_dir=Path("/tmp/r1")))
    # Read from the report as written.
    from torchfleet.results import from_report
    loaded = from_report("train", {"ok": False, "actions": actions + ["junk"]}, Path("/tmp/r1"))
    assert loaded.actions == actions
