"""Spares (`spares=K`): the run uses the first nnodes healthy candidates in inventory order and
names every other; a broken first host hands the master on (with a port test again, unless
preflight reached the next one first and tested the ports against it)."""
from __future__ import annotations

import json

from ansible_collections.torchfleet.fleet.plugins.modules import preflight_checks

from ansible_collections.torchfleet.fleet.plugins.module_utils.run.plan import decide as plan
from tests.unit.modules import run_module
from tests.unit.test_preflight_checks import ADDR, HOSTS, connect, probe

ADDR.update({"n4": "10.1.0.5", "n5": "10.1.0.6"})
SIX = HOSTS + ["n4", "n5"]


def six():
    return ({h: probe(h, master=(h == "n0")) for h in SIX}, {h: connect(h) for h in SIX})


def decide(probes, connects, capsys, tmp_path=None, nnodes=4, spares=2, **more):
    params = {"hosts": SIX[:nnodes + spares], "nnodes": nnodes, "inventory_size": 6,
              "probes": probes, "connects": connects, "spares": spares, **more}
    if tmp_path is not None:
        params.update(run_id="r1", run_dir=str(tmp_path / "r1"), runs_root=str(tmp_path))
    return run_module(preflight_checks, params, capsys)


def test_a_broken_worker_is_skipped_and_the_next_healthy_host_takes_its_place(capsys, tmp_path):
    probes, connects = six()
    connects["n2"] = connect("n2", ok=False, error="timed out")
    result = decide(probes, connects, capsys, tmp_path)
    assert result["ok"] is True and result["retest"] == []
    assert [(n["host"], n["node_rank"]) for n in result["nodes"]] == [
        ("n0", 0), ("n1", 1), ("n3", 2), ("n4", 3)]
    assert result["resolved"]["world_size"] == 4 * 8
    skipped = [c for c in result["checks"] if c["id"] == "host.skipped" and not c["ok"]]
    assert [(c["host"], c["severity"]) for c in skipped] == [("n2", "warning")]
    assert "failed port.blocked, port.ephemeral" in skipped[0]["detail"]
    # Its own failures are warnings now, and a healthy spare left over is said to be one.
    assert {(c["id"], c["severity"]) for c in result["checks"]
            if c["host"] == "n2" and not c["ok"]} == {
        ("port.blocked", "warning"), ("port.ephemeral", "warning"), ("host.skipped", "warning")}
    assert any(c["host"] == "n5" and c["id"] == "host.skipped" and c["ok"]
               for c in result["checks"])
    row = next(line for line in result["table"].splitlines() if "host.skipped" in line)
    assert row.split()[:3] == ["n2", "host.skipped", "WARN"]
    assert "spares: the run uses n0, n1, n3, n4; not used: n2 (port.blocked, " \
           "port.ephemeral), n5 (healthy spare)" in result["table"]
    assert result["verdict"].startswith("preflight ok: ")
    assert result["verdict"].endswith(" on 4 host(s), 2 candidate(s) not used (n2, n5)")
    report = json.loads((tmp_path / "r1" / "preflight.json").read_text())
    assert [h["host"] for h in report["hosts"]] == ["n0", "n1", "n3", "n4"]
    assert report["spares"]["skipped"] == {"n2": ["port.blocked", "port.ephemeral"]}


def test_the_odd_version_out_is_skipped_against_the_majority_of_candidates(capsys):
    probes, connects = six()
    probes["n1"]["versions"]["torch"] = "2.5.0"
    result = decide(probes, connects, capsys)
    assert [n["host"] for n in result["nodes"]] == ["n0", "n2", "n3", "n4"]
    assert not any(c["id"] == "version.torch" and not c["ok"] and c["host"] != "n1"
                   for c in result["checks"])


def test_a_broken_first_host_hands_the_master_to_the_next_after_a_port_test_again(capsys):
    probes, connects = six()
    probes["n0"] = {"unreachable": True, "msg": "ssh: connect to host n0: Connection refused"}
    first = decide(probes, connects, capsys)
    assert first["retest"] == ["n1", "n2", "n3", "n4"] and first["nodes"] == []
    assert first["choice"]["skipped"] == {"n0": ["host.unreachable"]}
    # The playbook probes the chosen hosts again with n1 as the master, then decides again.
    probes = {h: probe(h, master=(h == "n1")) for h in first["retest"]}
    connects = {h: connect(h) for h in first["retest"]}
    second = run_module(preflight_checks, {
        "hosts": first["retest"], "nnodes": 4, "inventory_size": 6, "probes": probes,
        "connects": connects, "skipped": first["skipped_records"],
        "choice": first["choice"]}, capsys)
    assert second["ok"] is True
    assert [(n["host"], n["node_rank"]) for n in second["nodes"]] == [
        ("n1", 0), ("n2", 1), ("n3", 2), ("n4", 3)]
    assert second["resolved"]["master_addr"] == ADDR["n1"]
    assert [(c["host"], c["id"], c["severity"]) for c in second["checks"] if not c["ok"]] == [
        ("n0", "host.unreachable", "warning"), ("n0", "host.skipped", "warning")]


def test_a_first_host_not_reached_leaves_the_master_to_the_next_with_no_port_test_again(capsys):
    # preflight reached n1 first (reach.yml), so every host's ports were tested against it.
    probes = {h: probe(h, master=(h == "n1")) for h in SIX}
    probes["n0"] = {"unreachable": True, "msg": "ssh: connect to host n0: Connection refused"}
    connects = {h: connect(h) for h in SIX}
    result = decide(probes, connects, capsys, master="n1")
    assert result["ok"] is True and result["retest"] == []
    assert [(n["host"], n["node_rank"]) for n in result["nodes"]] == [
        ("n1", 0), ("n2", 1), ("n3", 2), ("n4", 3)]
    assert result["resolved"]["master_addr"] == ADDR["n1"]
    assert result["choice"]["skipped"] == {"n0": ["host.unreachable"]}
    assert [(c["host"], c["id"], c["severity"]) for c in result["checks"] if not c["ok"]] == [
        ("n0", "host.unreachable", "warning"), ("n0", "host.skipped", "warning")]
    assert "not used: n0 (host.unreachable), n5 (healthy spare)" in result["table"]


def test_the_master_reached_is_still_blamed_when_most_workers_cannot_reach_it(capsys):
    probes = {h: probe(h, master=(h == "n1")) for h in SIX}
    probes["n0"] = {"unreachable": True, "msg": "ssh: connect to host n0: Connection refused"}
    connects = {h: connect(h, ok=False, error="timed out") for h in SIX}
    connects["n1"] = connect("n1")
    first = decide(probes, connects, capsys, master="n1")
    # Blamed against the workers it was tested with (not n0, which tested nothing).
    assert first["retest"] == ["n2", "n3", "n4", "n5"]
    assert first["choice"]["skipped"] == {"n0": ["host.unreachable"],
                                          "n1": ["port.blocked (from the workers)"]}


def test_a_master_most_workers_cannot_reach_is_the_one_to_blame(capsys):
    probes, connects = six()
    for h in SIX[1:]:
        connects[h] = connect(h, ok=False, error="timed out")
    first = decide(probes, connects, capsys)
    assert first["retest"] == ["n1", "n2", "n3", "n4"]
    assert first["choice"]["skipped"] == {"n0": ["port.blocked (from the workers)"]}


def test_the_spare_left_over_keeps_no_error_from_the_port_test_of_a_master_to_blame(capsys):
    # n0's firewall drops its port: blamed, n1-n4 are tested again against n1 and n5, tested
    # only against n0, is a healthy spare whose port failures are not its own.
    probes, connects = six()
    for h in SIX[1:]:
        connects[h] = connect(h, ok=False, error="timed out")
    first = decide(probes, connects, capsys)
    assert first["retest"] == ["n1", "n2", "n3", "n4"]
    left = [(c["id"], c["severity"]) for c in first["skipped_records"]
            if c["host"] == "n5" and not c["ok"]]
    assert left == [("port.blocked", "warning"), ("port.ephemeral", "warning")]
    probes = {h: probe(h, master=(h == "n1")) for h in first["retest"]}
    second = run_module(preflight_checks, {
        "hosts": first["retest"], "nnodes": 4, "inventory_size": 6, "probes": probes,
        "connects": {h: connect(h) for h in first["retest"]},
        "skipped": first["skipped_records"], "choice": first["choice"]}, capsys)
    assert second["ok"] is True, second["verdict"]


def test_too_few_healthy_hosts_is_one_error_with_the_counts_and_every_failing_host(capsys):
    probes, connects = six()
    for h in ("n2", "n4", "n5"):
        probes[h]["shm"]["total_bytes"] = 1 << 20
    result = decide(probes, connects, capsys)
    assert result["ok"] is False
    controller = [c for c in result["failures"] if c["host"] == "controller"]
    assert [c["id"] for c in controller] == ["host.skipped"]
    assert controller[0]["detail"] == (
        "3 of 6 candidate host(s) are healthy and nnodes=4 needs 4; failing: n2 (shm.size), "
        "n4 (shm.size), n5 (shm.size)")
    assert {c["host"] for c in result["failures"]} == {"controller", "n2", "n4", "n5"}


def plan_params(**over):
    return {"nnodes": 4, "forks": 5, "run_id": None, "master_port": 29500, "master_addr": "",
            "socket_ifname": "", "master_host": "", "nproc_per_node": "auto", "data_paths": [],
            "collective_isolate": False, "collective_isolate_schedule": "ring",
            "nccl_ib_hca": "", "nccl_ib_gid_index": "", "spares": 0, "inventory_size": 6,
            **over}


def test_spares_are_checked_as_a_whole_number_that_the_inventory_holds():
    assert plan(plan_params(spares=2))["candidates"] == 6
    for bad in (-1, "two", "1.5", True, [1]):
        errors = plan(plan_params(spares=bad))["input_errors"]
        assert [e["id"] for e in errors] == ["input.spares"], bad
        assert "is not a whole number >= 0" in errors[0]["detail"]
    errors = plan(plan_params(spares=3))["input_errors"]
    assert errors[0]["detail"] == "spares=3 with nnodes=4 needs 7 hosts, and group `nodes` has 6"
    assert errors[0]["hint"].startswith("set -e spares=2 or less")
    assert plan(plan_params(spares=3))["candidates"] == 4
