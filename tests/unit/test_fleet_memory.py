"""The fleet's ledger wired in (issue 60): spares healthiest first, inventory order among
equals (so nothing changes without a ledger), a quarantined host left out while spares allow."""
from __future__ import annotations

import json

import pytest

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


# ---- preflight and the run's end with the ledger (reports/memory.py) -------------------------

def preflight_params(tmp_path, hosts=SIX, nnodes=4, spares=2, name="r1", **more):
    from tests.unit import test_preflight_checks as shapes

    shapes.ADDR.update({"n4": "10.1.0.5", "n5": "10.1.0.6"})
    probes = {h: shapes.probe(h, master=(h == hosts[0])) for h in hosts}
    from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.preflight import (
        ARGUMENT_SPEC)

    return dict({k: v.get("default") for k, v in ARGUMENT_SPEC.items()},
                hosts=hosts[:nnodes + spares], nnodes=nnodes, inventory_size=len(hosts),
                probes=probes, connects={h: shapes.connect(h) for h in hosts}, spares=spares,
                run_id=name, run_dir=str(tmp_path / "runs" / name), fleet_db="fleet.db",
                **more)


def preflight_decide(params):
    from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import preflight

    return preflight.decide(params)


def fleet_of(tmp_path):
    from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import ledger

    return ledger.Fleet("fleet.db", str(tmp_path / "runs"))


NOW = 1_900_000_000.0


def test_without_a_history_preflight_is_as_before(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHFLEET_LEDGER_NOW", repr(NOW))
    result = preflight_decide(preflight_params(tmp_path))
    assert result["ok"] and [n["host"] for n in result["nodes"]] == SIX[:4]
    assert not [c for c in result["checks"] if c["id"] in ("host.quarantined", "fleet.ledger")]
    assert "fleet history" not in result["table"]
    report = json.loads((tmp_path / "runs" / "r1" / "preflight.json").read_text())
    assert "fleet" not in report
    assert (tmp_path / "runs" / "fleet.db").exists()  # beside the run's directory


def test_a_quarantined_host_is_left_out_with_a_warning_and_its_history(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHFLEET_LEDGER_NOW", repr(NOW))
    fleet_of(tmp_path).quarantine("n1", 24, "culprit of 3 failures", now=NOW - 3600)
    result = preflight_decide(preflight_params(tmp_path))
    assert result["ok"], result["table"]
    assert [n["host"] for n in result["nodes"]] == ["n0", "n2", "n3", "n4"]
    held = [c for c in result["checks"] if c["id"] == "host.quarantined"]
    assert [(c["host"], c["severity"]) for c in held] == [("n1", "warning")]
    assert "not used: a spare takes its place" in held[0]["detail"]
    assert "culprit of 3 failures" in held[0]["detail"]
    assert result["choice"]["skipped"] == {"n1": ["host.quarantined"]}
    assert "n1 (host.quarantined)" in result["table"]
    assert "fleet history (the ledger):\nn1: " in result["table"]
    report = json.loads((tmp_path / "runs" / "r1" / "preflight.json").read_text())
    assert report["fleet"]["n1"]["quarantined_until"] == "2030-03-18T16:46:40Z"  # 24 h from its start


def test_observe_leaves_out_no_host_the_ledger_quarantined_but_honours_one_by_hand(
        tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHFLEET_LEDGER_NOW", repr(NOW))
    from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import ledger
    fleet = fleet_of(tmp_path)
    fleet.quarantine("n1", 24, ledger.AUTO_REASON + "2.99 >= quarantine_score 2.5: lost x3",
                     now=NOW - 3600)
    fleet.quarantine("n2", 24, "bad fan, replaced Tuesday", now=NOW - 3600)
    fleet.close()
    for strict in ("warn", "strict"):
        result = preflight_decide(dict(preflight_params(tmp_path), actions="observe",
                                       quarantine=strict))
        assert result["ok"], result["table"]  # strict refuses nothing torchfleet decided
        assert [n["host"] for n in result["nodes"]] == ["n0", "n1", "n3", "n4"]
        held = [c for c in result["checks"] if c["id"] == "host.quarantined"]
        assert sorted((c["host"], c["severity"]) for c in held) == [
            ("n1", "warning"), ("n2", "warning")]


def test_a_restarts_recheck_reads_the_ledger_of_the_runs_root_and_writes_nothing(tmp_path,
                                                                                monkeypatch):
    # attempt.yml's re-check decides in runs/r1/attempt_1 with the run's runs root as
    # ledger_root: a quarantined spare is left out there too, and the re-check is no record.
    monkeypatch.setenv("TORCHFLEET_LEDGER_NOW", repr(NOW))
    fleet = fleet_of(tmp_path)
    fleet.quarantine("n4", 24, "its rank exited x3", now=NOW - 3600)
    before = fleet.hosts(now=NOW)
    fleet.close()
    params = preflight_params(tmp_path, hosts=["n0", "n1", "n2", "n3", "n4", "n5"],
                              ledger_root=str(tmp_path / "runs"), ledger_record=False)
    params.update(hosts=["n0", "n1", "n3", "n4", "n5"], nnodes=4,  # n2 lost for good
                  run_dir=str(tmp_path / "runs" / "r1" / "attempt_1"))
    result = preflight_decide(params)
    assert result["ok"], result["table"]
    assert [n["host"] for n in result["nodes"]] == ["n0", "n1", "n3", "n5"]
    assert result["choice"]["skipped"] == {"n4": ["host.quarantined"]}
    assert not (tmp_path / "runs" / "r1" / "fleet.db").exists()  # not beside the attempt
    fleet = fleet_of(tmp_path)
    assert fleet.hosts(now=NOW) == before
    fleet.close()


def test_with_no_spare_left_a_quarantined_host_is_used_with_a_warning_or_refused(tmp_path,
                                                                                monkeypatch):
    monkeypatch.setenv("TORCHFLEET_LEDGER_NOW", repr(NOW))
    fleet_of(tmp_path).quarantine("n1", 24, "lost 3 times", now=NOW)
    used = preflight_decide(preflight_params(tmp_path, spares=0))
    assert used["ok"] and [n["host"] for n in used["nodes"]] == SIX[:4]
    held = [c for c in used["checks"] if c["id"] == "host.quarantined"]
    assert [(c["host"], c["severity"]) for c in held] == [("n1", "warning")]
    assert "used anyway: no healthy spare is left" in held[0]["detail"]
    strict = preflight_decide(preflight_params(tmp_path, spares=0, name="r2",
                                               quarantine="strict"))
    assert not strict["ok"]
    assert [(c["id"], c["host"]) for c in strict["failures"]] == [("host.quarantined", "n1")]


def test_a_history_is_a_line_of_the_table_and_never_a_check(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHFLEET_LEDGER_NOW", repr(NOW))
    params = preflight_params(tmp_path, spares=0)
    params["probes"]["n2"] = {"unreachable": True, "msg": "Failed to connect to the host via ssh"}
    assert not preflight_decide(params)["ok"]  # n2's host.unreachable: an incident of n2's
    monkeypatch.setenv("TORCHFLEET_LEDGER_NOW", repr(NOW + 3600))
    again = preflight_decide(preflight_params(tmp_path, spares=0, name="r2"))
    assert again["ok"], again["table"]
    history = fleet_of(tmp_path).health(["n2"], now=NOW + 3600)["n2"]["history"]
    assert history and "n2: %s" % history in again["table"]
    assert not [c for c in again["checks"] if not c["ok"]]


def test_a_corrupt_ledger_is_one_warning_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHFLEET_LEDGER_NOW", repr(NOW))
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "fleet.db").write_bytes(b"not a database" * 100)
    result = preflight_decide(preflight_params(tmp_path))
    assert result["ok"]
    said = [c for c in result["checks"] if c["id"] == "fleet.ledger"]
    assert len(said) == 1 and said[0]["severity"] == "warning" and said[0]["host"] == "controller"
    assert (tmp_path / "runs" / "r1" / "preflight.json").exists()


def test_a_ledger_that_cannot_be_read_fails_a_strict_preflight_and_says_why(tmp_path,
                                                                           monkeypatch):
    """Issue 67 item 9: quarantine=strict does not run the hosts it could not check."""
    monkeypatch.setenv("TORCHFLEET_LEDGER_NOW", repr(NOW))
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "fleet.db").write_bytes(b"not a database" * 100)
    result = preflight_decide(preflight_params(tmp_path, quarantine="strict"))
    assert not result["ok"]
    said = [c for c in result["failures"] if c["id"] == "fleet.ledger"]
    assert len(said) == 1 and "is corrupt" in said[0]["detail"]
    assert "quarantine=strict refuses to run" in said[0]["detail"]


def test_the_textfile_is_written_where_asked(tmp_path, monkeypatch):
    """What node-exporter would read: the ledger's hosts, their scores and quarantines."""
    from tests.unit.test_ledger import parsed

    monkeypatch.setenv("TORCHFLEET_LEDGER_NOW", repr(NOW))
    fleet_of(tmp_path).quarantine("n1", 24, "lost 3 times", now=NOW)
    result = preflight_decide(preflight_params(tmp_path, ledger_textfile="fleet.prom"))
    assert result["ok"]
    got = parsed((tmp_path / "runs" / "fleet.prom").read_text())
    assert got['torchfleet_host_quarantined{host="n1"}'] == 1.0
    assert got['torchfleet_host_quarantined_until_seconds{host="n1"}'] == NOW + 24 * 3600
    assert {k for k in got if k.startswith("torchfleet_host_runs_total")} == {
        'torchfleet_host_runs_total{host="%s"}' % h for h in SIX}
    assert got["torchfleet_ledger_updated_seconds"] == NOW


def failed_run(tmp_path, name, capsys, **more):
    """run_summary (the module, as the results role calls it) of a run of n0 and n1 where n1's
    rank exited 1, beside the ledger in tmp_path/runs."""
    from ansible_collections.torchfleet.fleet.plugins.module_utils.run.runstate import RunState
    from ansible_collections.torchfleet.fleet.plugins.modules import run_summary
    from tests.unit.modules import run_module

    state = RunState(name, ["n0", "n1"], 1, now=100.0)
    state.beat("n0", 101.0)
    state.beat("n1", 101.0)
    state.exited("n1", 102.5, 1)
    state.exited("n0", 103.0, -15, stopped=True)
    return run_module(run_summary, dict({
        "kind": "train", "run_id": name, "hosts": ["n0", "n1"], "state": state.record(),
        "world_size": 2, "settings": {"nproc_per_node": 1}, "expect_results": False,
        "run_dir": str(tmp_path / "runs" / name), "fleet_db": "fleet.db"}, **more), capsys)


def test_the_runs_end_quarantines_the_culprit_of_three_failures_and_drains_it(tmp_path,
                                                                             capsys,
                                                                             monkeypatch):
    for i in range(3):
        monkeypatch.setenv("TORCHFLEET_LEDGER_NOW", repr(NOW + i * 3600))
        end = failed_run(tmp_path, "r%d" % i, capsys)
        assert end["first_failure"]["host"] == "n1"
        assert ("quarantined" in end) is (i == 2) and end["drain"] == ([] if i < 2 else [
            {"host": "n1", "reason": "host.quarantined",
             "evidence": end["quarantined"][0]["reason"] + " (until 2030-03-18T19:46:40Z)"}])
    assert [q["host"] for q in end["quarantined"]] == ["n1"]
    assert "quarantined now: n1 until 2030-03-18T19:46:40Z" in end["table"]
    report = json.loads((tmp_path / "runs" / "r2" / "train.json").read_text())
    assert report["quarantined"] == end["quarantined"] and report["drain"] == []
    assert fleet_of(tmp_path).health(["n0"], now=NOW + 7200)["n0"]["score"] == 0.0


def test_a_ledger_preflight_warned_of_is_not_warned_of_again_at_the_runs_end(tmp_path, capsys,
                                                                             monkeypatch):
    monkeypatch.setenv("TORCHFLEET_LEDGER_NOW", repr(NOW))
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "fleet.db").write_bytes(b"not a database" * 100)
    end = failed_run(tmp_path, "r0", capsys)
    said = [c for c in end["checks"] if c["id"] == "fleet.ledger"]
    assert len(said) == 1 and said[0]["severity"] == "warning"
    assert "fleet.ledger: the fleet's ledger" in end["table"]
    again = failed_run(tmp_path, "r1", capsys, ledger_said=[said[0]["detail"]])
    assert not [c for c in again["checks"] if c["id"] == "fleet.ledger"]
    assert json.loads((tmp_path / "runs" / "r1" / "train.json").read_text())["run_id"] == "r1"


def test_a_quarantined_master_hands_over_and_the_second_decision_names_it(tmp_path,
                                                                         monkeypatch):
    from tests.unit import test_preflight_checks as shapes

    monkeypatch.setenv("TORCHFLEET_LEDGER_NOW", repr(NOW))
    fleet_of(tmp_path).quarantine("n0", 24, "Xid 79 twice", now=NOW)
    first = preflight_decide(preflight_params(tmp_path))
    assert first["retest"] == ["n1", "n2", "n3", "n4"] and first["nodes"] == []
    # The playbook tests the chosen hosts' ports again with n1 as the master, then decides.
    probes = {h: shapes.probe(h, master=(h == "n1")) for h in first["retest"]}
    second = preflight_decide(dict(preflight_params(tmp_path, spares=0), hosts=first["retest"],
                                   probes=probes, skipped=first["skipped_records"],
                                   choice=first["choice"]))
    assert second["ok"], second["table"]
    assert [n["host"] for n in second["nodes"]] == ["n1", "n2", "n3", "n4"]
    held = [c for c in second["checks"] if c["id"] == "host.quarantined"]
    assert [(c["host"], c["severity"]) for c in held] == [("n0", "warning")]
    assert "n0: no incident; quarantined until" in second["table"]


def test_fatal_hardware_on_more_hosts_than_the_breaker_allows_drains_none_of_them(tmp_path,
                                                                                 capsys):
    """Issue 65, the circuit breaker on drains: an Xid 79 on 2 of 4 hosts within one run (a
    rack's power, a driver roll-out) is past quarantine_max_fraction 0.1 of 4 (one host):
    neither is drained, fleet.breaker says so in the checks, the verdict and the table; on one
    host alone it is drained as before."""
    from ansible_collections.torchfleet.fleet.plugins.module_utils.run.runstate import RunState
    from ansible_collections.torchfleet.fleet.plugins.modules import run_summary
    from tests.unit.modules import run_module
    from tests.unit.test_hw_judge import beat, xid79

    def run(name, fatal_on):
        hosts = ["n0", "n1", "n2", "n3"]
        state = RunState(name, hosts, 1, now=100.0, hang_timeout_s=600)
        for h in hosts:
            beat(state, h, 101.0, [])
        for h in fatal_on:
            beat(state, h, 102.0, [xid79()])
        return run_module(run_summary, {
            "kind": "train", "run_id": name, "hosts": hosts, "state": state.record(),
            "world_size": 4, "settings": {"nproc_per_node": 1}, "expect_results": False,
            "run_dir": str(tmp_path / "runs" / name), "fleet_db": ""}, capsys)

    one = run("r1", ["n2"])
    assert [d["host"] for d in one["drain"]] == ["n2"]
    assert not [c for c in one["checks"] if c["id"] == "fleet.breaker"]
    two = run("r2", ["n1", "n3"])
    assert two["drain"] == []
    (said,) = [c for c in two["checks"] if c["id"] == "fleet.breaker"]
    assert said["severity"] == "warning" and said["detail"].startswith(
        "fleet-wide cause suspected: 2 hosts (n1, n3) of 4 would be drained")
    assert said["detail"] in two["verdict"] and "fleet.breaker: " in two["table"]
    report = json.loads((tmp_path / "runs" / "r2" / "train.json").read_text())
    assert report["drain"] == [] and said["detail"] in report["verdict"]


def fake_scontrol(tmp_path, refuse=""):
    """An scontrol that records its arguments in tmp_path/scontrol.log and refuses a drain of
    node `refuse` as slurmctld refuses a user who may not (its exit status and words)."""
    log = tmp_path / "scontrol.log"
    path = tmp_path / "scontrol"
    path.write_text('#!/bin/sh\nprintf "%%s\\n" "$*" >> %s\n'
                    'if [ "$2" = "nodename=%s" ]; then\n'
                    '  echo "slurm_update error: Invalid user id" >&2; exit 1\nfi\n' % (log, refuse))
    path.chmod(0o755)
    return str(path), log


def xid79_run(tmp_path, capsys, name, fatal_on, hosts, **more):
    """run_summary of a run of `hosts` where `fatal_on` had an Xid 79, with slurm_drain."""
    from ansible_collections.torchfleet.fleet.plugins.module_utils.run.runstate import RunState
    from ansible_collections.torchfleet.fleet.plugins.modules import run_summary
    from tests.unit.modules import run_module
    from tests.unit.test_hw_judge import beat, xid79

    state = RunState(name, hosts, 1, now=100.0, hang_timeout_s=600)
    for h in hosts:
        beat(state, h, 101.0, [])
    beat(state, fatal_on, 102.0, [xid79()])
    return run_module(run_summary, dict({
        "kind": "train", "run_id": name, "hosts": hosts, "state": state.record(),
        "world_size": len(hosts), "settings": {"nproc_per_node": 1}, "expect_results": False,
        "run_dir": str(tmp_path / "runs" / name), "fleet_db": "fleet.db",
        "slurm_drain": True}, **more), capsys)


def test_a_drain_slurm_refused_is_not_done_and_its_why_says_slurms_words(tmp_path, capsys):
    """A drain's `done` was "asked of Slurm": one scontrol refused was done all the same. The
    run's end drains itself, with the node's Slurm name, and keeps Slurm's answer."""
    scontrol, log = fake_scontrol(tmp_path, refuse="slurm-n2")
    hosts = ["n0", "n1", "n2", "n3"]
    end = xid79_run(tmp_path, capsys, "r1", "n2", hosts, slurm_scontrol=scontrol,
                    slurm_nodes={"n2": "slurm-n2", "n0": ""})
    (drain,) = [a for a in end["actions"] if a["action"] == "drain"]
    assert (drain["host"], drain["check"], drain["done"]) == ("n2", "run.hardware", False)
    assert drain["why"].startswith("NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.; ")
    assert ("Slurm did not drain it (scontrol exited 1: slurm_update error: Invalid user id); "
            "as a Slurm administrator: scontrol update nodename=slurm-n2 state=drain "
            "'reason=torchfleet r1: run.hardware: ") in drain["why"]
    assert "n2: Slurm did not drain it" in end["table"]
    report = json.loads((tmp_path / "runs" / "r1" / "train.json").read_text())
    assert report["actions"] == end["actions"]
    assert [(a["action"], a["done"]) for a in fleet_of(tmp_path).history("n2")["actions"]
            if a["action"] == "drain"] == [("drain", False)]
    # Slurm drains n1 (its own name: none given) in another run: done.
    again = xid79_run(tmp_path, capsys, "r2", "n1", hosts, slurm_scontrol=scontrol,
                      quarantine_max_fraction=1.0)
    assert [(a["host"], a["done"], a["why"].count("Slurm did not")) for a in again["actions"]
            if a["action"] == "drain"] == [("n1", True, 0)]
    assert log.read_text().splitlines()[-1].startswith(
        "update nodename=n1 state=drain reason=torchfleet r2: run.hardware: NVRM: Xid")


def test_the_drain_breaker_counts_the_drains_torchfleet_did_in_earlier_runs(tmp_path, capsys):
    """The breaker counted one run's drains only: ten runs draining one host of 16 each
    drained 10 of 16 within quarantine_h. With the ledger's audit, the first is drained and
    the next ones are held by fleet.breaker (16 hosts x 0.1: one)."""
    from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import summary

    scontrol, log = fake_scontrol(tmp_path)
    hosts = ["n%02d" % i for i in range(16)]
    done = []
    for i in range(10):
        end = xid79_run(tmp_path, capsys, "r%d" % i, hosts[i], hosts, slurm_scontrol=scontrol)
        done += [a["host"] for a in end["actions"] if a["action"] == "drain" and a["done"]]
        said = [c["detail"] for c in end["checks"] if c["id"] == "fleet.breaker"]
        assert bool(said) is (i > 0), (i, said)
    assert done == ["n00"] and len(log.read_text().splitlines()) == 1
    assert said[0].startswith("fleet-wide cause suspected: 1 host (n09) of 16 would be drained "
                              "beside 1 already, past quarantine_max_fraction 0.1")
    # The breaker itself: this run's drains with the earlier ones, of the group.
    ask = [{"host": "n01", "reason": "run.hardware", "evidence": "Xid 79"}]
    assert summary.drain_breaker(ask, hosts, 0.1) == (ask, "")
    assert summary.drain_breaker(ask, hosts, 0.1, held={"n00"})[0] == []
    assert summary.drain_breaker(ask, hosts, 0.2, held={"n00"}) == (ask, "")


def test_preflight_json_has_the_audit_of_the_hosts_it_left_out_as_train_json_has(
        tmp_path, monkeypatch):
    """preflight.json had no `actions`, though preflight leaves out quarantined hosts (and
    actions=observe would have): the same list as train.json's, by the same function."""
    monkeypatch.setenv("TORCHFLEET_LEDGER_NOW", repr(NOW))
    from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import ledger
    fleet = fleet_of(tmp_path)
    fleet.quarantine("n1", 24, ledger.AUTO_REASON + "2.99 >= quarantine_score 2.5: lost x3",
                     now=NOW - 3600)
    fleet.close()
    result = preflight_decide(preflight_params(tmp_path))
    assert [(a["action"], a["host"], a["check"], a["done"]) for a in result["actions"]] == [
        ("exclude", "n1", "host.quarantined", True)]
    assert "quarantined by the fleet's ledger until" in result["actions"][0]["why"]
    assert result["actions"][0]["at"] == "2030-03-17T17:46:40Z"
    report = json.loads((tmp_path / "runs" / "r1" / "preflight.json").read_text())
    assert report["actions"] == result["actions"]
    assert [(a["action"], a["done"]) for a in fleet_of(tmp_path).history(
        "n1", now=NOW)["actions"]] == [("exclude", True)]
    observed = preflight_decide(dict(preflight_params(tmp_path, name="r2"), actions="observe"))
    assert [(a["action"], a["host"], a["done"]) for a in observed["actions"]] == [
        ("exclude", "n1", False)]
    nobody = preflight_decide(preflight_params(tmp_path, name="r3", hosts=SIX[2:], spares=0))
    assert nobody["actions"] == [] and json.loads(
        (tmp_path / "runs" / "r3" / "preflight.json").read_text())["actions"] == []


def test_a_controller_clock_ahead_still_sees_the_servers_quarantine(tmp_path, monkeypatch):
    """Issue 67 review, finding 4: on PostgreSQL the server's clock judges a quarantine.
    preflight passed the controller's clock to health(), so a controller 36 h ahead read a
    24 h quarantine as over and used the host. (SQLite standing in for the server: its
    server_now made the server's clock.)"""
    from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import (
        ledger, ledger_store)

    monkeypatch.delenv("TORCHFLEET_LEDGER_NOW", raising=False)
    monkeypatch.setattr(ledger_store.Store, "server_now", lambda self, conn: NOW)
    monkeypatch.setattr(ledger, "now", lambda: NOW + 36 * 3600.0)
    fleet_of(tmp_path).quarantine("n1", 24, "lost 3 times")  # until the server's NOW + 24 h
    result = preflight_decide(preflight_params(tmp_path))
    assert [n["host"] for n in result["nodes"]] == ["n0", "n2", "n3", "n4"], result["table"]
    assert result["choice"]["skipped"] == {"n1": ["host.quarantined"]}
    held = [c for c in result["checks"] if c["id"] == "host.quarantined"]
    assert [c["host"] for c in held] == ["n1"]
    report = json.loads((tmp_path / "runs" / "r1" / "preflight.json").read_text())
    assert report["fleet"]["n1"]["quarantined_until"] == ledger.iso(NOW + 24 * 3600.0)


@pytest.mark.parametrize("what", ["textfile", "record"])
def test_strict_refuses_only_a_ledger_it_could_not_read(tmp_path, monkeypatch, what):
    """Issue 67 review, finding 6: quarantine=strict refused the run when the health read
    was fine and a later write failed (an unwritable ledger_textfile folder, a record that
    timed out): no quarantine was hidden by those. A warning, and the run goes on."""
    from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import ledger

    monkeypatch.setenv("TORCHFLEET_LEDGER_NOW", repr(NOW))
    more = {"quarantine": "strict"}
    if what == "textfile":
        more["ledger_textfile"] = "no/such/folder/fleet.prom"
    else:
        def locked(self, *_args):
            raise RuntimeError("database is locked")
        monkeypatch.setattr(ledger.Fleet, "_write_record", locked)
    result = preflight_decide(preflight_params(tmp_path, **more))
    assert result["ok"], result["table"]
    said = [c for c in result["checks"] if c["id"] == "fleet.ledger"]
    assert len(said) == 1 and said[0]["severity"] == "warning", said
    assert ("textfile" if what == "textfile" else "stayed locked") in said[0]["detail"]
    assert "quarantine=strict refuses" not in said[0]["detail"]
