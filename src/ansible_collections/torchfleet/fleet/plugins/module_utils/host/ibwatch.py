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

The files are read on a thread of their own, never on the agent's loop: on mlx5 a counter read
is a firmware command with a 60 s timeout, and an HCA whose firmware hangs would stop the
heartbeats (the host called lost, not its HCA). A look asks the thread for a sample when one is
due and waits HANDOFF_S for it (sysfs answers in microseconds; one answered later is taken by
a later look, dated when it was asked); a read unanswered DEADLINE_S is an event naming the
port and its HCA (code "mlx5_0/1 timeout"), a warning: the driver's own lines of a stuck
firmware (health compromised) are kmsg's fatal ones. The calls are watched as gpuwatch's NVML
calls are (watched.py).

Only the standard library: it runs inside the agent on every host.
"""
from __future__ import annotations

import os
import queue
import threading

from ansible_collections.torchfleet.fleet.plugins.module_utils.host import rdma, watched

EVERY_S = 5.0
COUNTERS = ("link_downed", "link_error_recovery")
DEADLINE_S = 2.0    # a port file unanswered this long: its HCA is named (sysfs: microseconds)
HANDOFF_S = 0.05    # a look waits this long for the sample it asked, then goes on


def _read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read(256).strip()
    except OSError:
        return None


def sample(root=rdma.SYSFS, ports=None, read=None):
    """{"mlx5_0/1": {"state", "rate", "pci_bus", "link_downed", "link_error_recovery"}} of every
    port under root (ports: only those named). read(path, port, pci_bus): a port file's text or
    None (default: read here)."""
    read = read or (lambda path, _port, _bus: _read(path))
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
            port = "%s/%s" % (name, number)
            state = read(os.path.join(base, "state"), port, bus or None)
            counts = {}
            for counter in COUNTERS:
                text = read(os.path.join(base, "counters", counter), port, bus or None)
                counts[counter] = int(text) if text and text.isdigit() else None
            out[port] = dict(
                counts, state=rdma.parse_state(state) if state else None,
                rate=read(os.path.join(base, "rate"), port, bus or None), pci_bus=bus or None)
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
    """The RDMA ports named (ports: {"mlx5_0/1", ...}; None: every port under root), sampled
    by a thread of its own (started at the first look) when look() asks. read: a port file's
    reader, read(path) -> text or None (the tests give one that hangs)."""

    def __init__(self, root=rdma.SYSFS, ports=None, read=_read):
        self.root, self.ports, self.read = root, ports, read
        self.present = os.path.isdir(root) and ports != set()
        self.samples = []   # (look time asked at, sample), the newest three
        self.next_m = 0.0
        self.calls = watched.Calls(("sample",))
        self.lock = threading.Lock()
        self.asks = queue.Queue(maxsize=1)
        self.asked = None       # the look time of the sample asked and not yet done
        self.done = []          # (look time, sample) done by the thread, not yet taken
        self.stopping = threading.Event()
        self.thread = None
        self.stall_sent = False

    def look(self, now_m):
        """The ports' events since the last look, and a read stuck past DEADLINE_S. Waits for
        the thread HANDOFF_S at most."""
        if not self.present:
            return []
        if now_m >= self.next_m and self.asked is None and not self.stopping.is_set():
            self.next_m = now_m + EVERY_S
            answered = threading.Event()
            self.asked = now_m
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="ibwatch", daemon=True)
                self.thread.start()
            self.asks.put((now_m, answered))
            answered.wait(HANDOFF_S)
        return self._taken(now_m) + self._stalled(now_m)

    def _taken(self, now_m):
        with self.lock:
            done, self.done = self.done, []
        events = []
        for at, ports in done:
            self.samples = (self.samples + [(at, ports)])[-3:]
            if len(self.samples) < 2:
                continue
            padded = [(self.samples[0][0], {})] * (3 - len(self.samples)) + self.samples
            for event in changes(*(s for _t, s in padded), times=tuple(t for t, _s in padded)):
                # Taken at a later look than it was asked: as much older.
                event["age_s"] = round(event["age_s"] + max(0.0, now_m - at), 3)
                events.append(event)
        return events

    def _stalled(self, now_m):
        """The port file read unanswered past DEADLINE_S, once per stall: a warning naming the
        port (its HCA) and the file, dated from the read's start."""
        late = self.calls.late(now_m, DEADLINE_S)
        if not late:
            self.stall_sent = False
            return []
        if self.stall_sent:
            return []
        self.stall_sent = True
        (path, port, bus, started_m), answered_m = late[0]
        ages = watched.stall_ages(now_m, started_m, answered_m)
        device, _sep, number = port.partition("/")
        name = os.path.relpath(path, os.path.join(self.root, device, "ports", number))
        event = _event(port, "timeout", "reading %s did not answer in %g s: the HCA's "
                       "firmware may be stuck (on mlx5 a counter is a firmware command)" % (
                           name, DEADLINE_S), False, {"pci_bus": bus}, ages)
        event["count"] = 1
        return [event]

    def _run(self):
        while not self.stopping.is_set():
            asked = self.asks.get()   # (waits without waking: close() puts None)
            if asked is None:
                break
            at, answered = asked
            try:
                ports = sample(self.root, self.ports, self._read)
            except Exception:  # a sample the thread could not take: the next one may
                ports = None
            with self.lock:
                if ports is not None:
                    self.done = (self.done + [(at, ports)])[-3:]
                self.asked = None
            answered.set()

    def _read(self, path, port, bus):
        return self.calls.run("sample", self.read, path, call=path, device=port, bus=bus)

    def close(self):
        """Stop the thread (one stuck in a read is left, a daemon)."""
        self.stopping.set()
        if self.thread is not None:
            try:
                self.asks.put_nowait(None)
            except queue.Full:
                pass
            self.thread.join(timeout=1.0)
