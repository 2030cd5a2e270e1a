"""The RDMA ports of a host during a run, from sysfs (the kernel's stable ABI, as rdma.py reads it
for preflight): each port's state and its link_downed / link_error_recovery counters, every
EVERY_S.

changes() turns two samples into events (pure: the tests feed it a recorded sysfs tree):
a port that left ACTIVE and is still down at the next sample is fatal (the NIC's traffic is
gone); a link_downed or link_error_recovery that climbed while the port is ACTIVE again is a
warning (the link flapped and came back).

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


def sample(root=rdma.SYSFS):
    """{"mlx5_0/1": {"state", "link_downed", "link_error_recovery"}} of every port under root."""
    out = {}
    try:
        names = sorted(os.listdir(root))[:rdma.MAX_DEVICES]
    except OSError:
        return out
    for name in names:
        ports = os.path.join(root, name, "ports")
        try:
            numbers = sorted(os.listdir(ports))[:rdma.MAX_PORTS]
        except OSError:
            continue
        for number in numbers:
            base = os.path.join(ports, number)
            state = _read(os.path.join(base, "state"))
            counts = {}
            for counter in COUNTERS:
                text = _read(os.path.join(base, "counters", counter))
                counts[counter] = int(text) if text and text.isdigit() else None
            out["%s/%s" % (name, number)] = dict(
                counts, state=rdma.parse_state(state) if state else None)
    return out


def _event(port, code, what, fatal):
    return {"source": "sysfs", "kind": "link", "code": code, "gpu": None, "pci_bus": None,
            "pid": None, "fatal": fatal, "what": "RDMA port %s: %s" % (port, what),
            "line": "RDMA port %s: %s" % (port, what)}


def changes(before, middle, after):
    """Events from three samples in a row: a port down in the last two that was ACTIVE in the
    first went down and stayed down; counters that climbed on a port ACTIVE now flapped."""
    events = []
    for port, now in sorted(after.items()):
        was, mid = before.get(port) or {}, middle.get(port) or {}
        if was.get("state") == "ACTIVE" and mid.get("state") not in (None, "ACTIVE") \
                and now.get("state") not in (None, "ACTIVE"):
            events.append(_event(port, "down", "went %s and stayed down" % now["state"], True))
            continue
        if now.get("state") != "ACTIVE":
            continue
        for counter in COUNTERS:
            new, old = now.get(counter), mid.get(counter)
            if new is not None and old is not None and new > old:
                events.append(_event(port, counter, "%s %d -> %d (the link flapped and came "
                                     "back)" % (counter, old, new), False))
    return events


class IbWatch:
    def __init__(self, root=rdma.SYSFS):
        self.root = root
        self.present = os.path.isdir(root)
        self.samples = []
        self.next_m = 0.0

    def look(self, now_m):
        if not self.present or now_m < self.next_m:
            return []
        self.next_m = now_m + EVERY_S
        self.samples = (self.samples + [sample(self.root)])[-3:]
        if len(self.samples) < 2:
            return []
        return changes(*([{}] * (3 - len(self.samples)) + self.samples))
