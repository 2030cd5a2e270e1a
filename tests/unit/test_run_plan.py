"""run_plan: the run id, the port test's plan and the input.* checks, decided from variables
alone before preflight touches a host (the playbook-level cases are in
tests/integration/test_bad_input.py)."""
from __future__ import annotations

import pytest
from ansible_collections.torchfleet.fleet.plugins.modules import run_plan
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.net import choose_master_addr, master_addr_up_front
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import RUN_ID

from tests.unit.modules import run_module

BASE = {"nnodes": 2, "forks": 64}


def plan(capsys, **args):
    return run_module(run_plan, {**BASE, **args}, capsys)


def ids(result):
    return [e["id"] for e in result["input_errors"]]


def test_good_values_get_a_new_run_id_and_no_error(capsys):
    result = plan(capsys, master_host="10.0.0.1", data_paths=["/data", "~/shards"])
    assert RUN_ID.match(result["run_id"]) and result["input_errors"] == []
    port_plan = result["port_plan"]
    assert port_plan["inline"] and port_plan["addr"] == "10.0.0.1" and not port_plan["batched"]
    assert 49152 <= port_plan["ephemeral_port"] <= 60999


def test_two_runs_in_the_same_second_get_different_ids(capsys):
    assert len({plan(capsys)["run_id"] for _ in range(8)}) > 1


def test_the_run_id_given_is_kept(capsys):
    assert plan(capsys, run_id="nightly-42")["run_id"] == "nightly-42"


@pytest.mark.parametrize("args, check_id, sentence", [
    ({"master_port": 70000}, "input.master_port", "master_port=70000 is not a TCP port"),
    ({"master_port": "http"}, "input.master_port", "master_port=http is not a TCP port"),
    ({"run_id": "../x"}, "input.run_id", "run_id=../x cannot name a directory"),
    ({"run_id": ""}, "input.run_id", "run_id= cannot name a directory"),
    ({"nproc_per_node": "0"}, "input.nproc_per_node", "nproc_per_node=0 is not a positive"),
    ({"data_paths": "notalist"}, "input.data_paths", "data_paths=notalist is not a list"),
    ({"data_paths": {"a": 1}}, "input.data_paths", "is not a list of paths"),
    ({"data_paths": ["/ok", "rel/x"]}, "input.data_paths", "relative path(s) rel/x"),
    ({"nnodes": 1, "collective_isolate": True}, "input.collective_isolate",
     "nnodes=1 leaves nothing to pair"),
    ({"collective_isolate_schedule": "star"}, "input.collective_isolate_schedule",
     "collective_isolate_schedule=star is not a schedule"),
])
def test_each_bad_value_is_one_check_naming_the_variable(capsys, args, check_id, sentence):
    (error,) = plan(capsys, **args)["input_errors"]
    assert error["id"] == check_id and sentence in error["detail"] and error["hint"]


def test_more_nodes_than_forks_is_a_batched_plan(capsys):
    assert plan(capsys, nnodes=128, forks=64)["port_plan"]["batched"]


@pytest.mark.parametrize("args", [
    {"master_host": "node0.example"},                        # a name: the master decides
    {"master_host": "10.0.0.1", "socket_ifname": "ib0"},     # the NIC's address may differ
    {},
])
def test_the_master_decides_its_address_when_the_controller_cannot_know_it(capsys, args):
    port_plan = plan(capsys, **args)["port_plan"]
    assert not port_plan["inline"] and port_plan["addr"] == ""


def test_each_host_that_may_be_the_master_gets_its_up_front_address(capsys):
    hosts = {"node0": "10.0.0.1", "node1": "10.0.0.2", "node2": "node2.example"}
    port_plan = plan(capsys, master_host="10.0.0.1", master_hosts=hosts)["port_plan"]
    assert port_plan["addr"] == "10.0.0.1"
    assert port_plan["addrs"] == {"node0": "10.0.0.1", "node1": "10.0.0.2", "node2": ""}
    # master_addr is the master's whoever it is; socket_ifname's address is the master's own.
    assert set(plan(capsys, master_hosts=hosts, master_addr="10.9.9.9")["port_plan"][
        "addrs"].values()) == {"10.9.9.9"}
    assert set(plan(capsys, master_hosts=hosts, socket_ifname="ib0")["port_plan"][
        "addrs"].values()) == {""}


def test_the_up_front_address_is_what_the_master_would_choose():
    # The controller's guess and the master's decision are one order: on a master that holds
    # the inventory's address, both give it; master_addr wins in both.
    nics = [{"name": "eth0", "ipv4": ["10.0.0.1"], "ipv6": []},
            {"name": "eth1", "ipv4": ["10.1.0.1"], "ipv6": []}]
    for explicit, hint in [(None, "10.1.0.1"), ("10.9.9.9", "10.1.0.1")]:
        assert (master_addr_up_front(explicit, None, hint)
                == choose_master_addr(nics, "eth0", explicit, None, hint))
