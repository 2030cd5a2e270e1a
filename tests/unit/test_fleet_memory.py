"""The fleet's ledger wired in (issue 60): spares healthiest first, inventory order among
equals (so nothing changes without a ledger), a quarantined host left out while spares allow."""
from __future__ import annotations

from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import spares
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.records import check

SIX = ["n0", "n1", "n2", "n3", "n4", "n5"]


def broken(*hosts):
    return [check("shm.size", h, False, "/dev/shm is 1 MiB") for h in hosts]


def test_equal_scores_keep_inventory_order_as_without_a_ledger():
    for scores in (None, {}, {h: 0.0 for h in SIX}, {h: 2.5 for h in SIX}):
        assert spares.choose(SIX, 4, broken("n2"), None, scores) == (
            ["n0", "n1", "n3", "n4"], {"n2": ["shm.size"]}, False)


def test_the_spare_taken_is_the_healthiest_and_the_run_keeps_inventory_order():
    # n3, healthy in the first nnodes, keeps its place whatever its score; n2's goes to the
    # healthiest spare.
    chosen, skipped, retest = spares.choose(SIX, 4, broken("n2"), None,
                                            {"n3": 1.5, "n4": 0.2, "n5": 0.0})
    assert chosen == ["n0", "n1", "n3", "n5"] and skipped == {"n2": ["shm.size"]}
    assert retest is False  # n0, whose ports were tested, is still the master


def test_a_quarantined_host_is_left_out_while_spares_allow():
    chosen, skipped, retest = spares.choose(SIX, 4, [], None, {"n1": 9.0}, {"n1"})
    assert chosen == ["n0", "n2", "n3", "n4"]
    assert skipped == {"n1": ["host.quarantined"]} and retest is False


def test_quarantined_hosts_fill_the_run_healthiest_first_when_no_spare_is_left():
    chosen, skipped, _ = spares.choose(SIX, 4, broken("n2", "n3"), None,
                                       {"n1": 9.0, "n4": 3.0}, {"n1", "n4"})
    assert chosen == ["n0", "n1", "n4", "n5"]
    assert skipped == {"n2": ["shm.size"], "n3": ["shm.size"]}
    chosen, skipped, _ = spares.choose(SIX, 4, broken("n2", "n3", "n5"), None,
                                       {"n1": 9.0, "n4": 3.0}, {"n1", "n4"})
    assert chosen == ["n0", "n1", "n4"]  # too few: preflight's host.skipped error names them


def test_a_master_the_ledger_leaves_out_hands_over_with_a_port_test_again():
    chosen, skipped, retest = spares.choose(SIX, 4, [], None, {"n0": 9.0}, {"n0"})
    assert chosen == ["n1", "n2", "n3", "n4"] and skipped == {"n0": ["host.quarantined"]}
    assert retest is True
    # A master merely less healthy than a spare keeps its place (and its port test).
    assert spares.choose(SIX, 4, [], None, {"n0": 0.5}) == (["n0", "n1", "n2", "n3"], {}, False)


def test_the_html_host_table_gains_the_history_column_only_with_a_history(tmp_path):
    import json
    from pathlib import Path

    from torchfleet.html_report import render
    from torchfleet.results import Host, Result

    def page(run_dir):
        hosts = [Host(host="n%d" % i, outcome="succeeded", rc=0, duration_s=3.0)
                 for i in range(3)]
        return render(Result(kind="train", ok=True, run_id="r1", run_dir=Path(run_dir),
                             hosts=hosts))

    assert "history" not in page(tmp_path)  # no preflight.json, no ledger: as before
    (tmp_path / "preflight.json").write_text(json.dumps({"ok": True, "checks": [], "fleet": {
        "n1": {"score": 2.5, "history": "3 incidents in 7 days: Xid 79 x2, lost x1",
               "quarantined_until": "2026-11-29T10:00:00Z"}}}))
    html = page(tmp_path)
    assert "<th>history (the fleet&rsquo;s ledger)</th>" in html
    assert "<td>3 incidents in 7 days: Xid 79 x2, lost x1; quarantined until " \
           "2026-11-29T10:00:00Z</td>" in html
    pre = render(Result(kind="preflight", ok=True, run_id="r1", run_dir=tmp_path))
    assert "<h2>Host history</h2>" in pre and "Xid 79 x2" in pre
