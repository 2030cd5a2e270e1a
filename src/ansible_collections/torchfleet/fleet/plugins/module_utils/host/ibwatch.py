"""The RDMA ports of a host during a run, from sysfs (the kernel's stable ABI, as rdma.py reads it
for preflight): each port's state, rate and its link_downed / link_error_recovery counters,
every EVERY_S, of the ports the run's NCCL uses only (hwwatch.Scope.hca_ports: NCCL_IB_HCA).

changes() turns three samples in a row into events (pure: the tests feed it a recorded sysfs
tree): a port that left ACTIVE and is still down at the next sample is fatal (the NIC's traffic
is gone); counters that climbed, or a rate that dropped (a link renegotiated to fewer lanes or
a lower speed, which slows every collective through it), on a port ACTIVE now are warnings,
compared with the newest earlier sample in which the port was ACTIVE (a flap caught
mid-sample, ACTIVE, DOWN, ACTIVE, is compared with the first). Each event's code names its
port ("mlx5_0/1 down"): two ports are two events.

Only the standard library: it runs inside the agent on every host.
"""
from __future__ import annotations

import os

from ansible_collections.torchfleet.fleet.plugins.module_utils.host import rdma

EVERY_S = 5.0
COUNTERS = ("link_downed", "link_error_recovery")


def _read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read(256).strip()
    except OSError:
        return None


def sample(root=rdma.SYSFS, ports=None):
    """{"mlx5_0/1": {"state", "rate", "pci_bus", "link_downed", "link_error_recovery"}} of every
    port under root (ports: only those named)."""
    out = {}
    try:
        names = sorted(os.listdir(root))[:rdma.MAX_DEVICES]
    except OSError:
        return out
    for name in names:
        base_dev = os.path.join(root, name)
        try:
            numbers = sorted(os.listdir(os.path.join(base_dev, "ports")))[:rdma.MAX_PORTS]
        except OSError:
            continue
        bus = None
        for number in numbers:
            if ports is not None and "%s/%s" % (name, number) not in ports:
                continue
            if bus is None:
                bus = os.path.basename(os.path.realpath(os.path.join(base_dev, "device"))) \
                    if os.path.exists(os.path.join(base_dev, "device")) else ""
            base = os.path.join(base_dev, "ports", number)
            state = _read(os.path.join(base, "state"))
            counts = {}
            for counter in COUNTERS:
                text = _read(os.path.join(base, "counters", counter))
                counts[counter] = int(text) if text and text.isdigit() else None
            out["%s/%s" % (name, number)] = dict(
                counts, state=rdma.parse_state(state) if state else None,
                rate=_read(os.path.join(base, "rate")), pci_bus=bus or None)
    return out


def _event(port, code, what, fatal, now, ages):
    return {"source": "sysfs", "kind": "link", "code": "%s %s" % (port, code), "gpu": None,
            "pci_bus": now.get("pci_bus"), "pid": None, "fatal": fatal,
            "what": "RDMA port %s: %s" % (port, what), "line": "RDMA port %s: %s" % (port, what),
            "age_s": ages[0], "age_err_s": ages[1]}


def _gbps(port):
    return rdma.parse_rate(port.get("rate") or "")


def changes(before, middle, after, times=(0.0, 0.0, 0.0)):
    """Events from three samples in a row (taken at times): a port down in the last two that
    was ACTIVE in the first went down and stayed down (between the first two samples); on a
    port ACTIVE now, counters that climbed and a rate that dropped since the newest earlier
    sample in which it was ACTIVE (between that sample and the last)."""
    events = []
    for port, now in sorted(after.items()):
        was, mid = before.get(port) or {}, middle.get(port) or {}
        if was.get("state") == "ACTIVE" and mid.get("state") not in (None, "ACTIVE") \
                and now.get("state") not in (None, "ACTIVE"):
            events.append(_event(port, "down", "went %s and stayed down" % now["state"], True,
                                 now, (times[2] - times[1], times[1] - times[0])))
            continue
        if now.get("state") != "ACTIVE":
            continue
        ref, at = (mid, times[1]) if mid.get("state") == "ACTIVE" else (was, times[0])
        if ref.get("state") != "ACTIVE":
            continue
        ages = (0.0, times[2] - at)
        for counter in COUNTERS:
            new, old = now.get(counter), ref.get(counter)
            if new is not None and old is not None and new > old:
                events.append(_event(port, counter, "%s %d -> %d (the link flapped and came "
                                     "back)" % (counter, old, new), False, now, ages))
        rate, rate_was = _gbps(now), _gbps(ref)
        if rate is not None and rate_was is not None and rate < rate_was:
            events.append(_event(port, "rate", "rate dropped from %s to %s" % (
                ref["rate"], now["rate"]), False, now, ages))
    return events


class IbWatch:
    """The RDMA ports named (ports: {"mlx5_0/1", ...}; None: every port under root)."""

    def __init__(self, root=rdma.SYSFS, ports=None):
        self.root, self.ports = root, ports
        self.present = os.path.isdir(root) and ports != set()
        self.samples = []   # (monotonic time, sample), the newest three
        self.next_m = 0.0

    def look(self, now_m):
        if not self.present or now_m < self.next_m:
            return []
        self.next_m = now_m + EVERY_S
        self.samples = (self.samples + [(now_m, sample(self.root, self.ports))])[-3:]
        if len(self.samples) < 2:
            return []
        padded = [(self.samples[0][0], {})] * (3 - len(self.samples)) + self.samples
        return changes(*(s for _t, s in padded), times=tuple(t for t, _s in padded))
