"""What a host's agent watches of its hardware while the run runs: one unit per signal (the
kernel log: kmsg.py; NVIDIA GPUs: gpuwatch.py; RDMA ports: ibwatch.py), composed here. Each
event is tied to the run (an OOM victim must be one of the run's ranks, by PID: lab hosts and
containers share one kernel), to the ranks that hold its GPU (the processes with
/dev/nvidiaN open, never LOCAL_RANK taken for a GPU index), deduplicated (a flood of one Xid
is one event and a count), and bounded before it goes to the master in a heartbeat.

An event's age is measured on this host's clock (a /dev/kmsg record carries its time since
boot; any other line is as old as the look that read it), so the master dates it on its own
clock without comparing two hosts' clocks.

Only the standard library: it runs inside the agent on every host.
"""
from __future__ import annotations

import os
import re
import time

from ansible_collections.torchfleet.fleet.plugins.module_utils.host import gpuwatch, ibwatch, kmsg, net

PER_BEAT = 8        # events per heartbeat
PER_RUN = 64        # events a host sends in a run; more are counted, not sent
AGE_MAX_S = 600.0   # a kmsg stamp further off than this is not believed
_MINOR = re.compile(r"Device Minor:\s*([0-9]{1,3})")


def gpu_minor(pci_bus, root="/proc/driver/nvidia/gpus"):
    """The /dev/nvidiaN number of the GPU at pci_bus, from the driver's own file; None."""
    try:
        with open(os.path.join(root, pci_bus, "information")) as f:
            match = _MINOR.search(f.read(4096))
    except (OSError, TypeError):
        return None
    return int(match.group(1)) if match else None


def holders(minor, pids):
    """The PIDs among pids that hold /dev/nvidia<minor> open (the first 4096 descriptors of
    each)."""
    device = "/dev/nvidia%d" % minor
    return [pid for pid in pids if device in net.fd_targets("/proc/%d/fd" % pid, 4096)]


class HostWatch:
    """The host's hardware from the run's start: look() each beat, take() what to send."""

    def __init__(self, kernel_log=kmsg.KMSG, rdma_sysfs=ibwatch.rdma.SYSFS, command=None):
        self.log = kmsg.KernelLog(kernel_log)
        self.gpu = gpuwatch.GpuWatch(command)
        self.ib = ibwatch.IbWatch(rdma_sysfs)
        self.pending = []   # (event, monotonic time it was read)
        self.seen = {}      # what an event is -> how many times
        self.sent = self.dropped = 0

    def status(self):
        """What the master's record says of this host's watch."""
        return {"kmsg": self.log.how, "kmsg_error": self.log.why, "gpu": self.gpu.how,
                "dropped": self.dropped}

    def _kernel_events(self, ranks):
        events = []
        for line in self.log.read():
            event = kmsg.parse(line)
            if event is None:
                continue
            if event["kind"] == "oom" and event["pid"] not in ranks:
                continue  # another program's, or another lab host's (one kernel)
            age = 0.0
            if self.log.how == kmsg.KMSG and event["boot_s"] is not None:
                since = time.clock_gettime(time.CLOCK_MONOTONIC) - event["boot_s"]
                age = since if 0.0 <= since <= AGE_MAX_S else 0.0
            event.pop("boot_s")
            event.update(source="kmsg", gpu=None, age_s=age)
            events.append(event)
        return events

    def look(self, now_m, ranks):
        """Read every source that is due. ranks: {pid: (local_rank, rank)} of the run's live and
        dead ranks on this host (the agent's own list). Never raises."""
        try:
            found = self._kernel_events(ranks)
            found += [dict(e, age_s=0.0) for e in self.gpu.look(now_m) + self.ib.look(now_m)]
        except Exception as exc:  # a watcher's fault never stops the run's agent
            self.log.why = self.log.why or "the hardware watch failed: %s" % exc
            return
        for event in found:
            key = (event["kind"], event["code"], event["pci_bus"], event["pid"], event["gpu"])
            self.seen[key] = self.seen.get(key, 0) + 1
            if self.seen[key] > 1:
                continue
            self._tie(event, ranks)
            self.pending.append((event, now_m))

    def _tie(self, event, ranks):
        """The rank an event belongs to: its PID's, else the one rank that holds its GPU."""
        rank = ranks.get(event.get("pid"))
        gpu_kinds = ("xid", "ecc", "remap", "recovery", "aer")
        if rank is None and event.get("pci_bus") and event["kind"] in gpu_kinds:
            minor = gpu_minor(event["pci_bus"])
            if minor is not None:
                event["gpu"] = event["gpu"] if event["gpu"] is not None else minor
                held = holders(minor, list(ranks))
                rank = ranks[held[0]] if len(held) == 1 else None
        event["rank"] = rank[1] if rank else None

    def take(self, now_m):
        """At most PER_BEAT events for this beat, their ages grown by how long they waited."""
        out = []
        while self.pending and len(out) < PER_BEAT:
            event, read_m = self.pending.pop(0)
            if self.sent >= PER_RUN:
                self.dropped += 1
                continue
            self.sent += 1
            out.append(dict(event, age_s=round(event["age_s"] + max(0.0, now_m - read_m), 3)))
        return out

    def close(self):
        self.log.close()
