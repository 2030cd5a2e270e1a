"""NVIDIA Xid events in a kernel log, and what each code means for a training run.

The codes that drain a node are the union of the lists three fleet operators act on: Azure's
azurehpc-health-checks (check_gpu_xid), Meta's GCM health checks (xid) and AWS's EKS node
monitoring agent (NVIDIA Xid conditions), as gathered in torchfleet issue 36; their names are
NVIDIA's Xid catalog's (docs.nvidia.com/deploy/xid-errors). Application-level codes (a
program's own fault: an illegal address, a page fault, a preemption) are reported, not failed:
the GPU is fine and the next program runs. Any other code is reported as unknown.

Log lines come as `dmesg` prints them (raw `[  1843.308145]` seconds since boot, `-T`'s
`[Sun Feb 23 16:24:18 2025]`, `--time-format iso` with or without `--decode`'s facility
prefix), as /dev/kmsg records (`6,3973,227996636,-;`) or without a time at all.
"""
from __future__ import annotations

import re
from datetime import datetime

DRAIN = {
    48: "double-bit ECC error",
    56: "display engine error",
    57: "error programming video memory interface",
    58: "unstable video memory interface detected",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    65: "video processor exception",
    69: "graphics engine class error",
    73: "NVENC2 error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    80: "corrupted data sent to GPU",
    81: "VGA subsystem error",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
APPLICATION = {
    13: "graphics engine exception (often an illegal address in a kernel)",
    31: "GPU memory page fault (often the program's own bad address)",
    43: "GPU stopped processing (a program's fault)",
    45: "preemptive cleanup after a program ended",
    68: "NVDEC0 exception",
    109: "context switch timeout",
}
SOURCES = "azurehpc-health-checks, Meta GCM, AWS EKS node monitoring agent; NVIDIA Xid catalog"
MAX_LOG = 16 << 20  # the kernel ring buffer is at most a few MiB

_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})[^)]*\): "
                  r"([0-9]+),\s*(.*)$")
_RAW = re.compile(r"^\[\s*([0-9]+\.[0-9]+)\]")
_CTIME = re.compile(r"^\[(\w{3} \w{3} +[0-9]+ [0-9][0-9]:[0-9][0-9]:[0-9][0-9] [0-9]{4})\]")
_ISO = re.compile(r"([0-9]{4}-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9])[,.]?([0-9]*)([+-][0-9][0-9]:?[0-9][0-9])?")
_KMSG = re.compile(r"^[0-9]{1,20},[0-9]{1,20},([0-9]{1,20}),[^;]*;")


def _stamp(line):
    """("boot", seconds since boot) | ("wall", epoch seconds) | (None, None)."""
    raw = _RAW.match(line)
    if raw:
        return "boot", float(raw.group(1))
    kmsg = _KMSG.match(line)
    if kmsg:
        return "boot", int(kmsg.group(1)) / 1e6
    ctime = _CTIME.match(line)
    try:
        if ctime:
            return "wall", datetime.strptime(ctime.group(1), "%a %b %d %H:%M:%S %Y").timestamp()
        iso = _ISO.search(line[:64])
        if iso:
            zone = (iso.group(3) or "").replace(":", "")
            when = datetime.strptime(iso.group(1) + (zone or ""),
                                     "%Y-%m-%dT%H:%M:%S" + ("%z" if zone else ""))
            return "wall", when.timestamp()
    except (ValueError, OverflowError):
        pass
    return None, None


def classify(code):
    """("drain" | "application" | "unknown", meaning)."""
    if code in DRAIN:
        return "drain", DRAIN[code]
    if code in APPLICATION:
        return "application", APPLICATION[code]
    return "unknown", "not in torchfleet's list"


def parse_xids(text):
    """Every Xid line: {pci, code, kind, meaning, clock, at, message}."""
    events = []
    for line in str(text)[:MAX_LOG].splitlines():
        match = _XID.search(line)
        if not match:
            continue
        code = int(match.group(2)[:6])
        clock, at = _stamp(line)
        kind, meaning = classify(code)
        events.append({"pci": match.group(1).lower(), "code": code, "kind": kind,
                       "meaning": meaning, "clock": clock, "at": at,
                       "message": match.group(3).strip()[:200]})
    return events


def within(events, window_s, now_wall=None, uptime_s=None):
    """The events of the last window_s seconds (since boot if shorter). Without a time of
    reference for a clock, the log's own last time of that clock stands for now; lines
    without a time are always kept (the ring buffer holds this boot only)."""
    ends = {"wall": now_wall, "boot": uptime_s}
    for clock in ends:
        if ends[clock] is None:
            ends[clock] = max((e["at"] for e in events if e["clock"] == clock), default=None)
    kept = []
    for event in events:
        end = ends.get(event["clock"])
        if event["clock"] is None or end is None or event["at"] >= end - window_s:
            kept.append(event)
    return kept
