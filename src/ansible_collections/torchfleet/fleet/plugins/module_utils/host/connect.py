"""TCP reachability from one host to the master: the `nc -zv MASTER PORT` of the guides.

Shared by node_probe (the one-round preflight, where every host connects while the master's
own probe is starting its listener) and port_probe (the separate second round).
"""
from __future__ import annotations

import errno
import math
import socket
import threading
import time

from ansible_collections.torchfleet.fleet.plugins.module_utils.host import netlink
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.net import (
    nic_holding, parse_default_route_dev, parse_ip_addr, parse_ip_route_get)

RETRY_INTERVAL_S = 0.05


CLOCK_PREFIX = b"TFCLK "
CLOCK_LINE_MAX = 64
CLOCK_WAIT_S = 1.0


def read_clock(sock, wall0, mono0, wait_s=CLOCK_WAIT_S):
    """{offset_s, uncertainty_s}: the peer's clock minus ours, from the one line the master's
    listener sends on accept, or None (another program on the port, nothing sent, garbage).
    The peer stamped its time between our connect and our read: the midpoint is our best
    guess of when, and half the round trip bounds the error."""
    data = b""
    sock.settimeout(wait_s)
    try:
        while b"\n" not in data and len(data) < CLOCK_LINE_MAX:
            chunk = sock.recv(CLOCK_LINE_MAX - len(data))
            if not chunk:
                break
            data += chunk
    except OSError:
        return None
    mono1 = time.monotonic()
    line = data.split(b"\n")[0]
    if not line.startswith(CLOCK_PREFIX):
        return None
    try:
        theirs = float(line[len(CLOCK_PREFIX):].decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not math.isfinite(theirs) or abs(theirs) > 1e11:  # no clock at all
        return None
    half = (mono1 - mono0) / 2
    return {"offset_s": round(theirs - (wall0 + half), 4), "uncertainty_s": round(half, 4)}


def connect(addr, port, timeout_s, retry_s=None):
    """{port, ok, error, elapsed_s, dialled_at, clock}: a TCP handshake with addr:port within
    timeout_s, and the master listener's clock line when it sends one (read_clock).
    dialled_at (this host's wall clock) tells a host that dialled after the master's listener
    had ended (too slow to start: nothing was tested) from a firewall that rejects.

    "Connection refused" is retried for retry_s (default timeout_s), because the master's
    listener may start a while after this host begins; a firewall that drops shows as
    "timed out" after timeout_s.
    """
    start, dialled_at = time.monotonic(), time.time()
    window = timeout_s if retry_s is None else max(timeout_s, retry_s)
    error, clock = None, None
    while True:
        left = window - (time.monotonic() - start)
        if left <= 0:
            error = error or "timed out"
            break
        try:
            wall0, mono0 = time.time(), time.monotonic()
            with socket.create_connection((addr, port), timeout=min(left, timeout_s)) as sock:
                error = None
                clock = read_clock(sock, wall0, mono0)
                break
        except socket.timeout:
            error = "timed out"
            break
        except OSError as exc:
            error = "refused" if exc.errno == errno.ECONNREFUSED else (exc.strerror or str(exc))
            if exc.errno != errno.ECONNREFUSED:
                break
            time.sleep(min(RETRY_INTERVAL_S, max(0.0, left)))
    return {"port": port, "ok": error is None, "error": error,
            "elapsed_s": round(time.monotonic() - start, 3), "dialled_at": round(dialled_at, 3),
            "clock": clock}


class Connector:
    """Connect to every port at once in the background; results() waits for them."""

    def __init__(self, addr, ports, timeout_s, retry_s=None):
        self._ports = list(ports)
        self._found = {}
        self._threads = [threading.Thread(target=self._one, args=(addr, port, timeout_s, retry_s),
                                          daemon=True) for port in self._ports]
        for thread in self._threads:
            thread.start()

    def _one(self, addr, port, timeout_s, retry_s):
        self._found[port] = connect(addr, port, timeout_s, retry_s)

    def results(self):
        """One entry per port, in order."""
        for thread in self._threads:
            thread.join()
        return [self._found[p] for p in self._ports]


def connect_all(addr, ports, timeout_s):
    return Connector(addr, ports, timeout_s).results()


def _ip_json(run, argv, parse):
    """(parse's answer, None) from `ip -j ...`, or (None, why) on any failure to get JSON: no
    iproute2, one that cannot be run, or one from before `-j` (RHEL / CentOS 7 ship 3.10-4.11:
    `Option "-j" is unknown`) all leave the answer to the kernel (netlink.py)."""
    out, err = run(argv)
    if out is None:
        return None, err
    try:
        return parse(out), None
    except (ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
        return None, "`%s` gave no JSON (%s)" % (" ".join(argv), exc)


def interfaces(run):
    """(parse_ip_addr's list, None), or (None, why): from `ip -j addr`, else from the kernel
    itself (netlink.py gives the same answer)."""
    nics, err = _ip_json(run, ["ip", "-j", "addr"], parse_ip_addr)
    if err is None:
        return nics, None
    try:
        return netlink.interfaces(), None
    except OSError as exc:
        return None, "neither `ip -j addr` (%s) nor netlink (%s) lists them" % (err, exc)


def default_dev(run):
    """The default route's interface (`ip -j route show default`, else netlink), or None."""
    dev, err = _ip_json(run, ["ip", "-j", "route", "show", "default"], parse_default_route_dev)
    if err is None:
        return dev
    try:
        return netlink.default_route_dev()
    except OSError:
        return None


def route_to(addr, run, nics=None):
    """(route, error): how traffic to addr leaves this host, naming the NIC that holds it when
    addr is local (from `nics`, parse_ip_addr's list, when the caller already has it). `run` is
    the module's command runner (command.bounded). Where `ip -j` gives no answer, the kernel's
    own lookup (netlink RTM_GETROUTE, policy routing included)."""
    route, err = _ip_json(run, ["ip", "-j", "route", "get", addr], parse_ip_route_get)
    if err is not None:
        try:
            route, err = netlink.route_get(addr), None
        except (OSError, ValueError) as exc:
            route, err = None, "%s; netlink: %s" % (err, exc)
    if route is None:
        return None, err or "no route"
    route["nic"] = route["dev"]
    if route["local"]:
        if nics is None:
            nics = interfaces(run)[0] or []
        route["nic"] = nic_holding(nics, addr) or route["dev"]
    return route, None
