"""RDMA sysfs trees with the kernel's documented layout (Documentation/ABI/stable/
sysfs-class-infiniband), built by the tests: no machine here has an HCA. Each port is
{state, phys_state, rate, link_layer, gids: {index: (gid, type, netdev)}}."""
from __future__ import annotations

from pathlib import Path

ACTIVE = {"state": "4: ACTIVE", "phys_state": "5: LinkUp"}
DOWN = {"state": "1: DOWN", "phys_state": "3: Disabled"}
POLLING = {"state": "1: DOWN", "phys_state": "2: Polling"}
IB_GID = "fe80:0000:0000:0000:0248:7fff:fe0e:7f4a"


def ib_port(rate="200 Gb/sec (4X HDR)", link=ACTIVE):
    return dict(link, rate=rate, link_layer="InfiniBand", gids={0: (IB_GID, None, None)})


def roce_port(ipv4="10.0.0.1", netdev="ens1f0np0", rate="100 Gb/sec (4X EDR)", link=ACTIVE):
    """A RoCE port's usual GID table: link-local v1/v2 at 0/1, the IPv4 address v1/v2 at 2/3."""
    a, b, c, d = (int(x) for x in ipv4.split("."))
    mapped = "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x" % (a, b, c, d)
    local = "fe80:0000:0000:0000:0a42:a1ff:fe5c:1e6e"
    return dict(link, rate=rate, link_layer="Ethernet",
                gids={0: (local, "IB/RoCE v1", netdev), 1: (local, "RoCE v2", netdev),
                      2: (mapped, "IB/RoCE v1", netdev), 3: (mapped, "RoCE v2", netdev)})


def build(root: Path, devices: dict[str, dict[int, dict]], netdevs: dict[str, str] | None = None) -> Path:
    """root/<dev>/ports/<n>/... for {dev: {port: port()}}; returns root."""
    root.mkdir(parents=True, exist_ok=True)
    for name, ports in devices.items():
        dev = root / name
        net = dev / "device" / "net"
        net.mkdir(parents=True, exist_ok=True)
        if netdevs and name in netdevs:
            (net / netdevs[name]).mkdir(exist_ok=True)
        for number, port in ports.items():
            base = dev / "ports" / str(number)
            for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
                (base / sub).mkdir(parents=True, exist_ok=True)
            for key in ("state", "phys_state", "rate", "link_layer"):
                (base / key).write_text(port[key] + "\n")
            for index in range(8):  # the kernel lists every slot; unused ones read all zeros
                gid, kind, netdev = port["gids"].get(index, ("0000:" * 7 + "0000", None, None))
                (base / "gids" / str(index)).write_text(gid + "\n")
                if kind:
                    (base / "gid_attrs" / "types" / str(index)).write_text(kind + "\n")
                if netdev:
                    (base / "gid_attrs" / "ndevs" / str(index)).write_text(netdev + "\n")
    return root
