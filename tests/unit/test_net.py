"""Network parsers against `ip -j` output and /proc/net/tcp recorded on a real machine."""
from __future__ import annotations

import os
import socket

from ansible_collections.torchfleet.fleet.plugins.module_utils.host import net

from tests.conftest import FIXTURES


def fixture(name):
    return (FIXTURES / name).read_text()


def test_parse_ip_addr_lists_interfaces_with_their_ipv4():
    nics = {n["name"]: n for n in net.parse_ip_addr(fixture("ip_addr_host.json"))}
    assert set(nics) == {"lo", "ifb0", "ifb1", "eth0"}
    assert nics["lo"]["loopback"] and nics["lo"]["ipv4"] == ["127.0.0.1"]
    assert nics["eth0"]["ipv4"] == ["192.0.2.2"] and nics["eth0"]["up"]
    assert nics["ifb0"]["ipv4"] == [] and not nics["ifb0"]["up"]


def test_route_get_names_the_device_and_marks_local_routes():
    assert net.parse_ip_route_get(fixture("ip_route_get_eth0.json")) == {
        "dev": "eth0", "src": "192.0.2.2", "local": False}
    loop = net.parse_ip_route_get(fixture("ip_route_get_loopback.json"))
    assert loop["dev"] == "lo" and loop["local"] is True
    assert net.parse_ip_route_get("[]") is None


def test_default_route_device():
    assert net.parse_default_route_dev(fixture("ip_route_default.json")) == "eth0"
    assert net.parse_default_route_dev("[]") is None


def test_proc_net_tcp_finds_the_listener_on_a_port():
    text = fixture("proc_net_tcp_listen_29577.txt")
    assert len(net.parse_proc_net_tcp(text, 29577)) == 1
    assert net.parse_proc_net_tcp(text, 29578) == []
    assert 29577 in net.listening_ports(text)


def test_processes_holding_names_this_process_for_its_own_listener():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        inodes = [i for path in ("/proc/net/tcp", "/proc/net/tcp6")
                  for i in net.parse_proc_net_tcp(open(path).read(), port)]
        holders = net.processes_holding(inodes)
    assert [h["pid"] for h in holders] == [os.getpid()]
    assert "python" in holders[0]["cmdline"]


def test_choose_master_addr_order_of_preference():
    nics = net.parse_ip_addr(fixture("ip_addr_host.json"))
    assert net.choose_master_addr(nics, "eth0", explicit="10.9.9.9") == "10.9.9.9"
    assert net.choose_master_addr(nics, "eth0", ifname="lo") == "127.0.0.1"
    assert net.choose_master_addr(nics, "eth0", ifname="ifb0") is None
    assert net.choose_master_addr(nics, "eth0", hint="127.0.0.1") == "127.0.0.1"
    assert net.choose_master_addr(nics, "eth0", hint="203.0.113.9") == "192.0.2.2"
    assert net.choose_master_addr(nics, None) == "192.0.2.2"
    assert net.choose_master_addr([n for n in nics if n["loopback"]], None) == "127.0.0.1"


def test_nic_holding_and_loopback():
    nics = net.parse_ip_addr(fixture("ip_addr_host.json"))
    assert net.nic_holding(nics, "192.0.2.2") == "eth0"
    assert net.nic_holding(nics, "10.0.0.1") is None
    assert net.is_loopback("127.0.1.1") and net.is_loopback("::1")
    assert not net.is_loopback("192.0.2.2") and not net.is_loopback("node0")
