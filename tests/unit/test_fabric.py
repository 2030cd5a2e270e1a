"""The fabric from sysfs: rdma.* checks and network=auto over trees built with the kernel's
documented layout (no HCA on these machines), each test breaking one thing on one host."""
from __future__ import annotations

from ansible_collections.torchfleet.fleet.plugins.modules import preflight_checks
import pytest
from ansible_collections.torchfleet.fleet.plugins.module_utils.host import rdma
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import plan
from hypothesis import given
from hypothesis import strategies as st

from tests import sysfs_tree as t
from tests.unit.modules import run_module
from tests.unit.test_preflight_checks import cluster, failing, run


def tree(tmp_path, host, devices, netdevs=None):
    return rdma.read_devices(str(t.build(tmp_path / host, devices, netdevs)))


def fabric(tmp_path, **per_host):
    """The 4-host cluster with each host's RDMA tree (default: two active HDR HCAs)."""
    probes, connects = cluster()
    for host in probes:
        devices = per_host.get(host, {"mlx5_0": {1: t.ib_port()}, "mlx5_1": {1: t.ib_port()}})
        probes[host]["rdma"] = (tree(tmp_path, host, devices) if devices is not None
                                else rdma.read_devices(str(tmp_path / host / "absent")))
    return probes, connects


def rdma_failing(checks):
    return [(c["id"], c["host"], c["severity"]) for c in checks
            if not c["ok"] and c["id"].startswith("rdma.")]


def test_reads_ports_state_rate_link_layer_gids_and_netdevs(tmp_path):
    facts = tree(tmp_path, "h", {"mlx5_0": {1: t.ib_port()},
                                 "mlx5_1": {1: t.roce_port("10.0.0.7", "ens1f1np1")}},
                 netdevs={"mlx5_1": "ens1f1np1"})
    assert facts["present"] and facts["error"] is None
    ib, roce = facts["devices"]
    assert ib["ports"][0] | {"gids": None} == {
        "port": 1, "state": "ACTIVE", "phys_state": "LinkUp", "rate": "200 Gb/sec (4X HDR)",
        "rate_gbps": 200.0, "link_layer": "InfiniBand", "gids": None, "error": None}
    assert [g["index"] for g in ib["ports"][0]["gids"]] == [0]  # all-zero slots are unused
    assert roce["netdevs"] == ["ens1f1np1"]
    assert [(g["index"], g["type"], g["ipv4"], g["netdev"]) for g in roce["ports"][0]["gids"]] == [
        (0, "IB/RoCE v1", None, "ens1f1np1"), (1, "RoCE v2", None, "ens1f1np1"),
        (2, "IB/RoCE v1", "10.0.0.7", "ens1f1np1"), (3, "RoCE v2", "10.0.0.7", "ens1f1np1")]
    assert rdma.roce_v2_ipv4(roce["ports"][0]) == [3]


def test_a_host_without_the_class_directory_has_no_device(tmp_path):
    facts = rdma.read_devices(str(tmp_path / "none"))
    assert facts == {"root": str(tmp_path / "none"), "present": False, "error": None,
                     "devices": []}


def test_an_unreadable_file_is_an_error_never_a_value(tmp_path):
    root = t.build(tmp_path / "h", {"mlx5_0": {1: t.ib_port()}})
    state = root / "mlx5_0" / "ports" / "1" / "state"
    state.unlink()
    state.mkdir()  # reading a directory fails as an unreadable file does (root reads any mode)
    port = rdma.read_devices(str(root))["devices"][0]["ports"][0]
    assert port["state"] is None and "cannot read" in port["error"]


def test_healthy_ib_cluster_passes_and_auto_chooses_ib_naming_the_hcas(tmp_path):
    checks, _, resolved = run(*fabric(tmp_path), network="auto")
    assert failing(checks) == []
    assert resolved["network"] == "ib"
    assert "mlx5_0:1, mlx5_1:1" in resolved["network_why"]
    assert resolved["nccl_env"] == {"NCCL_IB_DISABLE": "0"}
    assert {c["id"] for c in checks} >= {"rdma.none", "rdma.down", "rdma.rate"}


def test_auto_without_rdma_on_one_host_chooses_ethernet_and_says_which(tmp_path):
    checks, _, resolved = run(*fabric(tmp_path, n2=None), network="auto")
    assert resolved["network"] == "ethernet" and "n2" in resolved["network_why"]
    assert resolved["nccl_env"]["NCCL_IB_DISABLE"] == "1"
    assert rdma_failing(checks) == []  # nothing of rdma.* is asked for on ethernet


def test_ib_on_a_host_without_rdma_is_rdma_none(tmp_path):
    checks, _, _ = run(*fabric(tmp_path, n3=None), network="ib")
    assert rdma_failing(checks) == [("rdma.none", "n3", "error")]


def test_a_named_hca_missing_on_one_host_is_rdma_down_there(tmp_path):
    checks, _, resolved = run(*fabric(tmp_path, n1={"mlx5_0": {1: t.ib_port()}}), network="ib",
                              nccl_ib_hca="mlx5_0,mlx5_1")
    assert rdma_failing(checks) == [("rdma.down", "n1", "error")]
    down = next(c for c in checks if c["id"] == "rdma.down" and c["host"] == "n1")
    assert "mlx5_1 named in nccl_ib_hca not here (this host has mlx5_0)" in down["detail"]
    assert resolved["nccl_env"] == {"NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": "mlx5_0,mlx5_1"}


def test_a_down_port_of_a_named_hca_is_rdma_down_with_its_state(tmp_path):
    hosts = {"n2": {"mlx5_0": {1: t.ib_port()}, "mlx5_1": {1: t.ib_port(link=t.POLLING)}}}
    checks, _, _ = run(*fabric(tmp_path, **hosts), network="ib", nccl_ib_hca="=mlx5_0,mlx5_1")
    failed = [c for c in checks if not c["ok"] and c["id"] == "rdma.down"]
    assert [(c["host"], c["detail"]) for c in failed] == [
        ("n2", "port not active: mlx5_1:1 DOWN/Polling")]
    # With no HCA named NCCL uses the active ones: the down port is said, not failed; the
    # host's links are fewer, which rdma.rate warns about.
    checks, _, _ = run(*fabric(tmp_path, **hosts), network="ib")
    assert rdma_failing(checks) == [("rdma.rate", "n2", "warning")]
    rate = next(c for c in checks if c["id"] == "rdma.rate" and c["host"] == "n2")
    assert "200 Gb/s" in rate["detail"] and "200+200 Gb/s on n0, n1, n3" in rate["detail"]


def test_every_port_down_is_rdma_down_even_with_no_hca_named(tmp_path):
    hosts = {"n1": {"mlx5_0": {1: t.ib_port(link=t.DOWN)}}}
    checks, _, _ = run(*fabric(tmp_path, **hosts), network="ib")
    assert ("rdma.down", "n1", "error") in rdma_failing(checks)


def test_excluded_hcas_are_not_looked_at(tmp_path):
    hosts = {"n1": {"mlx5_0": {1: t.ib_port()}, "mlx5_1": {1: t.ib_port(link=t.DOWN)}}}
    probes, connects = fabric(tmp_path, **hosts)
    checks, _, _ = run(probes, connects, network="ib", nccl_ib_hca="^mlx5_1")
    assert rdma_failing(checks) == []


def test_a_link_trained_slower_is_rdma_rate_a_warning(tmp_path):
    slow = {"mlx5_0": {1: t.ib_port()}, "mlx5_1": {1: t.ib_port("100 Gb/sec (4X EDR)")}}
    checks, _, _ = run(*fabric(tmp_path, n3=slow), network="ib")
    assert rdma_failing(checks) == [("rdma.rate", "n3", "warning")]
    detail = next(c["detail"] for c in checks if c["id"] == "rdma.rate" and c["host"] == "n3")
    assert "mlx5_1:1 100 Gb/sec (4X EDR)" in detail


def test_roce_gid_index_not_v2_ipv4_is_rdma_gid_naming_the_right_index(tmp_path):
    hosts = {h: {"mlx5_0": {1: t.roce_port("10.0.0.%d" % (i + 1))}}
             for i, h in enumerate(("n0", "n1", "n2", "n3"))}
    checks, _, resolved = run(*fabric(tmp_path, **hosts), network="ib", nccl_ib_gid_index="3")
    assert rdma_failing(checks) == [] and resolved["nccl_env"]["NCCL_IB_GID_INDEX"] == "3"
    checks, _, _ = run(*fabric(tmp_path, **hosts), network="ib", nccl_ib_gid_index="2")
    gid = [c for c in checks if c["id"] == "rdma.gid" and not c["ok"]]
    assert {c["host"] for c in gid} == {"n0", "n1", "n2", "n3"}
    assert "GID index 2 is IB/RoCE v1 10.0.0.2, not RoCE v2 IPv4" in gid[1]["detail"]
    assert gid[1]["hint"] == "set -e nccl_ib_gid_index=3 (RoCE v2, IPv4 10.0.0.2 on mlx5_0:1)"


def test_unreadable_sysfs_is_unknown_a_warning_and_auto_does_not_choose_ib(tmp_path):
    probes, connects = fabric(tmp_path)
    probes["n1"]["rdma"]["devices"][0]["ports"][0]["error"] = "cannot read .../state: Permission denied"
    checks, _, resolved = run(probes, connects, network="ib")
    assert rdma_failing(checks) == [("rdma.down", "n1", "warning")]
    assert next(c for c in checks if c["host"] == "n1" and c["id"] == "rdma.down")[
        "detail"].startswith("unknown: ")
    _, _, resolved = run(probes, connects, network="auto")
    assert resolved["network"] == "ethernet" and "n1" in resolved["network_why"]


@pytest.mark.parametrize("value", ["mlx5_0", "mlx5_0:1,mlx5_1:1", "^mlx5_2", "=mlx5_0", "mlx5"])
def test_hca_lists_in_nccls_form_are_accepted(value):
    assert not [e for e in plan.input_errors(_plan_params(nccl_ib_hca=value))]


@pytest.mark.parametrize("value", ["mlx5_0;reboot", "$(id)", "mlx5 0", "mlx5_0:", ",", "^^a",
                                   ["mlx5_0"]])
def test_anything_else_is_input_nccl_ib_hca_before_any_host(value):
    errors = plan.input_errors(_plan_params(nccl_ib_hca=value))
    assert [e["id"] for e in errors] == ["input.nccl_ib_hca"]


@pytest.mark.parametrize("value", ["abc", "-1", "256", "3; id", True])
def test_a_gid_index_that_is_not_0_to_255_is_input_nccl_ib_gid_index(value):
    errors = plan.input_errors(_plan_params(nccl_ib_gid_index=value))
    assert [e["id"] for e in errors] == ["input.nccl_ib_gid_index"]


def _plan_params(**over):
    return {"master_port": 29500, "run_id": None, "nproc_per_node": "auto", "data_paths": [],
            "nnodes": 2, "collective_isolate": False, "collective_isolate_schedule": "ring",
            "nccl_ib_hca": "", "nccl_ib_gid_index": "", **over}


@given(st.text(max_size=80))
def test_parse_hca_spec_accepts_or_raises_value_error_only(text):
    try:
        exclude, exact, entries = rdma.parse_hca_spec(text)
    except ValueError:
        return
    assert all(name and ("," not in name) for name, _port in entries)


@given(st.text(alphabet="0123456789abcdef:", max_size=48))
def test_ipv4_of_gid_never_raises(gid):
    out = rdma.ipv4_of_gid(gid)
    assert out is None or len(out.split(".")) == 4


def test_the_preflight_table_says_what_auto_chose_and_why(tmp_path, capsys):
    probes, connects = fabric(tmp_path)
    result = run_module(preflight_checks, {
        "hosts": list(probes), "nnodes": 4, "inventory_size": 4, "probes": probes,
        "connects": connects, "network": "auto"}, capsys)
    assert result["ok"] is True
    assert ("network=ib (auto): every host has an active RDMA port (mlx5_0:1, mlx5_1:1)"
            in result["table"])
    assert result["resolved"]["nccl_env"] == {"NCCL_IB_DISABLE": "0"}
