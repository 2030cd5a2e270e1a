"""Parsers for the host's network state: `ip -j addr`, `ip -j route get`, /proc/net/tcp, the
ephemeral port range.

Pure functions over recorded text, so each has a test with real output beside it.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re

TCP_LISTEN = "0A"
IPV4_LITERAL = re.compile(r"^[0-9]+([.][0-9]+){3}$")


def parse_ip_addr(text):
    """Return one dict per interface from `ip -j addr` output.

    Each: name, up (operstate UP, or UNKNOWN for loopback-style links that carry traffic),
    loopback, ipv4 (list of addresses), ipv6 (list of global/link addresses).
    """
    nics = []
    for link in json.loads(text or "[]"):
        flags = link.get("flags", [])
        addrs = link.get("addr_info", [])
        nics.append({
            "name": link.get("ifname", ""),
            "up": "UP" in flags,
            "loopback": "LOOPBACK" in flags,
            "ipv4": [a["local"] for a in addrs if a.get("family") == "inet" and "local" in a],
            "ipv6": [a["local"] for a in addrs if a.get("family") == "inet6" and "local" in a],
        })
    return nics


def parse_ip_route_get(text):
    """Return {dev, src, local} for the route `ip -j route get ADDR` printed, or None."""
    routes = json.loads(text or "[]")
    if not routes:
        return None
    route = routes[0]
    return {
        "dev": route.get("dev"),
        "src": route.get("prefsrc"),
        "local": route.get("type") == "local",
    }


def nic_holding(nics, address):
    """Name of the interface that carries `address`, or None."""
    for nic in nics:
        if address in nic["ipv4"] or address in nic["ipv6"]:
            return nic["name"]
    return None


def is_loopback(address):
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def ephemeral_range(path="/proc/sys/net/ipv4/ip_local_port_range"):
    """(low, high) of this host's ephemeral ports, None when unreadable."""
    try:
        with open(path) as f:
            low, high = (int(v) for v in f.read().split()[:2])
    except (OSError, ValueError):
        return None
    return (low, high) if 0 < low <= high < 65536 else None


def parse_proc_net_tcp(text, port):
    """Socket inodes listening on `port` in /proc/net/tcp or tcp6 text."""
    inodes = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        local, state, inode = fields[1], fields[3], fields[9]
        if state == TCP_LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
            inodes.append(inode)
    return inodes


def listening_ports(text):
    """Every port in LISTEN state in /proc/net/tcp or tcp6 text."""
    ports = set()
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 4 and fields[3] == TCP_LISTEN:
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def processes_holding(inodes, proc="/proc"):
    """[{pid, cmdline}] of the processes that hold any of the socket inodes.

    Walks /proc/*/fd; processes we may not inspect (other users, when not root) are skipped,
    so an empty answer with inodes present means "held by a process we cannot see".
    """
    wanted = {"socket:[%s]" % inode for inode in inodes}
    found = []
    if not wanted:
        return found
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        if any(target in wanted for target in fd_targets(os.path.join(proc, pid, "fd"))):
            found.append({"pid": int(pid), "cmdline": read_cmdline(pid, proc)})
    return found


def fd_targets(fd_dir, limit=None):
    """What a process's open descriptors point at (its first `limit` of them): a process that
    ended or that we may not inspect has none."""
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return
    for fd in fds[:limit]:
        try:
            yield os.readlink(os.path.join(fd_dir, fd))
        except OSError:  # closed since the listing (the listing's own fd, for one)
            continue


def read_cmdline(pid, proc="/proc"):
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def parse_default_route_dev(text):
    """The interface of the first default route in `ip -j route show default`, or None."""
    routes = json.loads(text or "[]")
    return routes[0].get("dev") if routes else None


def master_addr_up_front(explicit=None, ifname=None, hint=None):
    """What the controller can know of choose_master_addr's answer before the master is
    probed: the user's master_addr, or the inventory's ansible_host when it is an IPv4 literal
    and no socket_ifname asks for another address. None: the master decides."""
    if explicit:
        return explicit
    if not ifname and hint and IPV4_LITERAL.match(hint):
        return hint
    return None


def choose_master_addr(nics, default_dev, explicit=None, ifname=None, hint=None):
    """The address the workers should dial, decided on the master itself.

    In order: the user's master_addr; the first IPv4 on socket_ifname; the inventory's
    ansible_host when it is one of this host's addresses; the first IPv4 on the default
    route's interface; the first non-loopback IPv4; loopback. None when socket_ifname is
    set but has no IPv4 (nic.missing / nic.address say why). master_addr_up_front is the
    same order up to the hint, as far as the controller can see it.
    """
    if explicit:
        return explicit
    by_name = {nic["name"]: nic for nic in nics}
    if ifname:
        nic = by_name.get(ifname)
        return nic["ipv4"][0] if nic and nic["ipv4"] else None
    if hint and nic_holding(nics, hint):
        return hint
    if default_dev in by_name and by_name[default_dev]["ipv4"]:
        return by_name[default_dev]["ipv4"][0]
    for nic in nics:
        for addr in nic["ipv4"]:
            if not is_loopback(addr):
                return addr
    return "127.0.0.1"
