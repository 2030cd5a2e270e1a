"""The host's interfaces, addresses and routes from the kernel itself (rtnetlink through
Python's socket module), for hosts without iproute2's `ip` (GPU containers, minimal images).

The answers have the shapes of net.py's parsers of `ip -j`: interfaces as parse_ip_addr's,
a route as parse_ip_route_get's, the default route's interface as parse_default_route_dev's.
A route is the kernel's own lookup (RTM_GETROUTE for one address), so policy routing is
honoured as `ip route get` honours it; /proc/net/route alone would not.

What the kernel answers is read as untrusted bytes: every length is checked, a message or an
attribute that does not fit is skipped, and nothing here raises but OSError (no netlink).
Only the standard library: it runs in node_probe on every host.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import struct

NETLINK_ROUTE = 0
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
RTM_NEWLINK, RTM_GETLINK = 16, 18
RTM_NEWADDR, RTM_GETADDR = 20, 22
RTM_NEWROUTE, RTM_GETROUTE = 24, 26
IFLA_IFNAME = 3
IFA_ADDRESS, IFA_LOCAL = 1, 2
RTA_DST, RTA_OIF, RTA_PRIORITY, RTA_PREFSRC, RTA_TABLE = 1, 4, 6, 7, 15
RT_TABLE_MAIN, RTN_UNICAST, RTN_LOCAL = 254, 1, 2
IFF_UP, IFF_LOOPBACK = 0x1, 0x8

NLMSG = struct.Struct("=IHHII")      # length, type, flags, sequence, port id
IFINFO = struct.Struct("=BxHiII")    # family, type, index, flags, change
IFADDR = struct.Struct("=BBBBI")     # family, prefix length, flags, scope, index
RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, protocol, scope, type, flags
RTATTR = struct.Struct("=HH")        # length, type

MAX_REPLY_BYTES = 8 << 20  # a dump bigger than this is not a host's (thousands of routes fit)
TIMEOUT_S = 2.0


def _align(n):
    return (n + 3) & ~3


def messages(data):
    """(type, payload) of each netlink message in data; a message that does not fit ends it."""
    out, offset = [], 0
    while offset + NLMSG.size <= len(data):
        length, kind, _flags, _seq, _pid = NLMSG.unpack_from(data, offset)
        if length < NLMSG.size or offset + length > len(data):
            break
        out.append((kind, data[offset + NLMSG.size:offset + length]))
        offset += _align(length)
    return out


def attributes(data, offset):
    """{type: bytes} of the route attributes from offset on (the first of each type)."""
    attrs = {}
    while offset + RTATTR.size <= len(data):
        length, kind = RTATTR.unpack_from(data, offset)
        if length < RTATTR.size or offset + length > len(data):
            break
        attrs.setdefault(kind & 0x3FFF, data[offset + RTATTR.size:offset + length])
        offset += _align(length)
    return attrs


def _address(raw, family):
    try:
        if family == socket.AF_INET and len(raw) == 4:
            return str(ipaddress.IPv4Address(raw))
        if family == socket.AF_INET6 and len(raw) == 16:
            return str(ipaddress.IPv6Address(raw))
    except ValueError:
        pass
    return None


def _index(raw):
    return struct.unpack("=i", raw)[0] if len(raw) == 4 else None


def parse_links(data):
    """[(index, name, flags)] of RTM_NEWLINK messages, in the kernel's order."""
    links = []
    for kind, body in messages(data):
        if kind != RTM_NEWLINK or len(body) < IFINFO.size:
            continue
        _family, _type, index, flags, _change = IFINFO.unpack_from(body)
        name = attributes(body, IFINFO.size).get(IFLA_IFNAME, b"").split(b"\0", 1)[0]
        if name:
            links.append((index, name.decode("utf-8", "replace"), flags))
    return links


def parse_addresses(data):
    """[(index, family, address)] of RTM_NEWADDR messages: IFA_LOCAL where the kernel gives
    one (a point-to-point link's IFA_ADDRESS is its peer's), as `ip` prints `local`."""
    out = []
    for kind, body in messages(data):
        if kind != RTM_NEWADDR or len(body) < IFADDR.size:
            continue
        family, _plen, _flags, _scope, index = IFADDR.unpack_from(body)
        attrs = attributes(body, IFADDR.size)
        address = _address(attrs.get(IFA_LOCAL) or attrs.get(IFA_ADDRESS, b""), family)
        if address:
            out.append((index, family, address))
    return out


def parse_routes(data):
    """[{type, dst_len, table, oif, prefsrc, priority}] of RTM_NEWROUTE messages."""
    routes = []
    for kind, body in messages(data):
        if kind != RTM_NEWROUTE or len(body) < RTMSG.size:
            continue
        family, dst_len, _src, _tos, table, _proto, _scope, rtype, _flags = RTMSG.unpack_from(body)
        attrs = attributes(body, RTMSG.size)
        if RTA_TABLE in attrs and len(attrs[RTA_TABLE]) == 4:
            table = struct.unpack("=I", attrs[RTA_TABLE])[0]
        routes.append({"type": rtype, "dst_len": dst_len, "table": table,
                       "oif": _index(attrs.get(RTA_OIF, b"")),
                       "prefsrc": _address(attrs.get(RTA_PREFSRC, b""), family),
                       "priority": _index(attrs.get(RTA_PRIORITY, b""))})
    return routes


def nics_of(links, addresses):
    """parse_ip_addr's list from parsed links and addresses."""
    nics = []
    for index, name, flags in links:
        mine = [(family, a) for i, family, a in addresses if i == index]
        nics.append({"name": name, "up": bool(flags & IFF_UP),
                     "loopback": bool(flags & IFF_LOOPBACK),
                     "ipv4": [a for family, a in mine if family == socket.AF_INET],
                     "ipv6": [a for family, a in mine if family == socket.AF_INET6]})
    return nics


def _ask(kind, flags, body):
    """The kernel's answer to one request: the bytes of every reply up to NLMSG_DONE (a dump)
    or the first reply; OSError when netlink cannot be used or the kernel says no."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE) as sock:
        sock.settimeout(TIMEOUT_S)
        sock.bind((0, 0))
        seq = os.getpid() & 0xFFFF
        sock.sendto(NLMSG.pack(NLMSG.size + len(body), kind, NLM_F_REQUEST | flags, seq, 0)
                    + body, (0, 0))
        chunks, size = [], 0
        while size < MAX_REPLY_BYTES:
            data = sock.recv(1 << 16)
            if not data:
                break
            chunks.append(data)
            size += len(data)
            kinds = messages(data)
            for k, payload in kinds:
                if k == NLMSG_ERROR and len(payload) >= 4:
                    code = struct.unpack_from("=i", payload)[0]
                    if code:
                        raise OSError(-code, os.strerror(-code))
            if not flags & NLM_F_DUMP or any(k in (NLMSG_DONE, NLMSG_ERROR) for k, _payload in kinds):
                break
        return b"".join(chunks)


def _links():
    return parse_links(_ask(RTM_GETLINK, NLM_F_DUMP, IFINFO.pack(socket.AF_UNSPEC, 0, 0, 0, 0)))


def _names():
    return {index: name for index, name, _flags in _links()}


def interfaces():
    """parse_ip_addr's answer, from the kernel."""
    addresses = parse_addresses(_ask(RTM_GETADDR, NLM_F_DUMP,
                                     IFADDR.pack(socket.AF_UNSPEC, 0, 0, 0, 0)))
    return nics_of(_links(), addresses)


def default_route_dev():
    """parse_default_route_dev's answer: the interface of the main table's first IPv4 default
    route (in the kernel's order, as `ip route show default` lists them), or None."""
    routes = parse_routes(_ask(RTM_GETROUTE, NLM_F_DUMP,
                               RTMSG.pack(socket.AF_INET, 0, 0, 0, 0, 0, 0, 0, 0)))
    names = _names()
    for r in routes:
        if r["dst_len"] == 0 and r["table"] == RT_TABLE_MAIN and r["type"] == RTN_UNICAST \
                and r["oif"] in names:
            return names[r["oif"]]
    return None


def route_get(address):
    """parse_ip_route_get's answer for one IPv4 or IPv6 address (the kernel's lookup, policy
    routing included); ValueError for what is no address, OSError where there is no route."""
    ip = ipaddress.ip_address(address)
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    raw = ip.packed
    attr = RTATTR.pack(RTATTR.size + len(raw), RTA_DST) + raw
    body = RTMSG.pack(family, len(raw) * 8, 0, 0, 0, 0, 0, 0, 0) + attr
    routes = parse_routes(_ask(RTM_GETROUTE, 0, body))
    if not routes:
        raise OSError("no route to %s" % address)
    route = routes[0]
    return {"dev": _names().get(route["oif"]), "src": route["prefsrc"],
            "local": route["type"] == RTN_LOCAL}
