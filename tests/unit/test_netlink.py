"""The host's interfaces, addresses and routes read from the kernel (netlink.py, for hosts
without iproute2) against `ip -j` on this machine, and the reader against any bytes."""
from __future__ import annotations

import shutil
import socket
import struct
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.torchfleet.fleet.plugins.module_utils.host import net, netlink
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.connect import default_dev, interfaces, route_to
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.command import Failed, Missing
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.preflight import nic_checks
from tests.conftest import examples

needs_ip = pytest.mark.skipif(shutil.which("ip") is None, reason="compares with iproute2's ip")


def ip(*args):
    return subprocess.run(["ip", "-j", *args], capture_output=True, text=True, check=True).stdout


@needs_ip
def test_the_kernel_answers_as_ip_does_here():
    assert netlink.interfaces() == net.parse_ip_addr(ip("addr"))
    assert netlink.default_route_dev() == net.parse_default_route_dev(
        ip("route", "show", "default"))
    for address in ["127.0.0.1", "::1"] + [a for n in netlink.interfaces() for a in n["ipv4"]]:
        assert netlink.route_get(address) == net.parse_ip_route_get(ip("route", "get", address))


def without_ip(argv, timeout_s=None):
    """A host's command runner where iproute2 is not installed."""
    assert argv[0] == "ip"
    return None, Missing("ip: not found")


def test_without_ip_the_probe_reads_the_kernel():
    nics, why = interfaces(without_ip)
    assert why is None and "lo" in [n["name"] for n in nics]
    assert default_dev(without_ip) == netlink.default_route_dev()
    route, error = route_to("127.0.0.1", without_ip, nics)
    assert error is None and route == {"dev": "lo", "src": "127.0.0.1", "local": True,
                                       "nic": "lo"}
    assert route_to("not-an-address", without_ip, nics)[0] is None


def ip_before_json(argv, timeout_s=None):
    """iproute2 3.10-4.11 (RHEL / CentOS 7): `-j` is refused, exit 255 (its own words)."""
    assert argv[:2] == ["ip", "-j"]
    return None, Failed('Option "-j" is unknown, try "ip -help".', rc=255)


def ip_not_executable(argv, timeout_s=None):
    return None, Failed("timeout: failed to run command 'ip': Permission denied", rc=126)


def ip_printing_text(argv, timeout_s=None):
    """An `ip` that exits 0 but prints its plain text (a wrapper that drops `-j`)."""
    return "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN\n", None


@pytest.mark.parametrize("run", [ip_before_json, ip_not_executable, ip_printing_text])
def test_an_ip_that_runs_but_gives_no_json_leaves_the_answer_to_the_kernel(run):
    nics, why = interfaces(run)
    assert why is None and nics == netlink.interfaces()
    assert default_dev(run) == netlink.default_route_dev()
    route, error = route_to("127.0.0.1", run, nics)
    assert error is None and route == {"dev": "lo", "src": "127.0.0.1", "local": True,
                                       "nic": "lo"}


def test_no_route_to_the_master_is_named_without_a_none_in_it():
    probe = {"nics": [{"name": "eth0", "up": True, "loopback": False, "ipv4": ["10.0.0.7"],
                       "ipv6": []}]}
    records, nic, address = nic_checks("node1", probe, {"route": None, "route_error": "no route"},
                                       None, "10.0.0.1", False)
    assert (nic, address) == (None, None)
    assert [(r["id"], r["ok"]) for r in records] == [("nic.route", False)]
    text = records[0]["detail"] + " " + records[0]["hint"]
    assert "None" not in text and "10.0.0.1" in text


def message(kind, body):
    return struct.pack("=IHHII", 16 + len(body), kind, 0, 1, 0) + body + b"\0" * (-len(body) % 4)


def test_a_link_and_its_addresses_from_kernel_bytes():
    name = b"eth0\0"
    link = message(netlink.RTM_NEWLINK, netlink.IFINFO.pack(0, 1, 2, 0x1, 0)
                   + struct.pack("=HH", 4 + len(name), netlink.IFLA_IFNAME) + name + b"\0" * 3)
    addr = message(netlink.RTM_NEWADDR, netlink.IFADDR.pack(socket.AF_INET, 24, 0, 0, 2)
                   + struct.pack("=HH", 8, netlink.IFA_LOCAL) + bytes([10, 0, 0, 7]))
    assert netlink.nics_of(netlink.parse_links(link), netlink.parse_addresses(addr)) == [
        {"name": "eth0", "up": True, "loopback": False, "ipv4": ["10.0.0.7"], "ipv6": []}]


@settings(max_examples=examples(300))
@given(st.binary(max_size=600))
def test_any_bytes_from_the_kernel_are_read_without_raising(data):
    for parse in (netlink.parse_links, netlink.parse_addresses, netlink.parse_routes):
        assert isinstance(parse(data), list)
    assert isinstance(netlink.parse_links(message(netlink.RTM_NEWLINK, data)), list)
    assert isinstance(netlink.parse_routes(message(netlink.RTM_NEWROUTE, data)), list)
