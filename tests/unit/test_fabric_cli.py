"""`torchfleet fabric` and `torchfleet transport`, and node_probe's rdma fact, on sysfs trees
built with the kernel's layout and on recorded NCCL logs."""
from __future__ import annotations

import json
import sys

from ansible_collections.torchfleet.fleet.plugins.modules import node_probe

from tests import sysfs_tree as t
from tests.conftest import FIXTURES
from tests.unit.modules import run_module
from torchfleet.cli import main


def test_fabric_prints_ports_gids_and_what_auto_would_choose(tmp_path, capsys):
    root = t.build(tmp_path / "ib", {"mlx5_0": {1: t.roce_port("10.9.0.4", "ens3np0")},
                                     "mlx5_1": {1: t.ib_port(link=t.DOWN)}},
                   netdevs={"mlx5_0": "ens3np0"})
    assert main(["fabric", "--sysfs", str(root), "--gid-index", "3"]) == 0
    out = capsys.readouterr().out
    assert "mlx5_0  netdevs: ens3np0" in out
    assert "port 1: ACTIVE/LinkUp  100 Gb/sec (4X EDR)  Ethernet" in out
    assert "port 1: DOWN/Disabled" in out
    assert "RoCE v2" in out and "10.9.0.4" in out
    assert ("network=auto would choose ib here (every host has an active RDMA port (mlx5_0:1)); "
            "NCCL variables: NCCL_IB_DISABLE=0 NCCL_IB_GID_INDEX=3") in out
    assert main(["fabric", "--sysfs", str(root), "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["auto"]["network"] == "ib" and len(view["sysfs"]["devices"]) == 2


def test_fabric_on_a_host_without_rdma_and_with_a_bad_hca(tmp_path, capsys):
    assert main(["fabric", "--sysfs", str(tmp_path / "none")]) == 0
    assert "network=auto would choose ethernet" in capsys.readouterr().out
    assert main(["fabric", "--hca", "mlx5_0;reboot"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("torchfleet fabric: --hca mlx5_0;reboot is not NCCL_IB_HCA's form")
    assert main(["fabric", "--gid-index", "three"]) == 2
    assert capsys.readouterr().err == ("torchfleet fabric: --gid-index three is not a GID table "
                                       "index (0-255)\n")


def test_fabric_on_a_directory_of_no_rdma_devices_lists_none(tmp_path, capsys):
    """A directory of something else (here, with a plain subdirectory) is no RDMA device; a
    device's own directory given for the class directory is named as such."""
    (tmp_path / "other" / "x").mkdir(parents=True)
    assert main(["fabric", "--sysfs", str(tmp_path / "other")]) == 0
    out = capsys.readouterr().out
    assert "x  netdevs" not in out and "none (no entry there has a ports directory)" in out
    root = t.build(tmp_path / "ib", {"mlx5_0": {1: t.ib_port()}})
    assert main(["fabric", "--sysfs", str(root / "mlx5_0")]) == 0
    assert "is one RDMA device's directory; give the class directory above it" in \
        capsys.readouterr().out


def test_transport_prints_each_rank_and_the_whole(capsys):
    logs = [str(FIXTURES / "nccl" / n) for n in ("socket-fallback.log", "roce-2.18.5.log")]
    assert main(["transport"] + logs) == 0
    out = capsys.readouterr().out
    assert "rank 15" in out and "NET/Socket 2" in out
    assert "IB mlx5_4:1/RoCE" in out and "(NCCL 2.18.5+cuda12.0)" in out
    assert main(["transport", "--json", logs[0]]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["summary"]["socket_ranks"] == [15]
    assert main(["transport", str(FIXTURES / "nccl" / "absent.log")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_node_probe_reads_the_rdma_tree_it_is_pointed_at(tmp_path, capsys):
    root = t.build(tmp_path / "ib", {"mlx5_0": {1: t.ib_port()}})
    result = run_module(node_probe, {"python": sys.executable, "rdma_sysfs": str(root)}, capsys)
    (device,) = result["rdma"]["devices"]
    assert device["name"] == "mlx5_0" and device["ports"][0]["state"] == "ACTIVE"
