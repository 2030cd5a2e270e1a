"""NVIDIA Xid events in a kernel log, and what each code means for a training run.

Each code's class is NVIDIA's Xid catalog's resolution for the running application
(xid_catalog.py: the catalog as data, its source and what each bucket needs):

- "drain" (fatal: the run ends and the host is drained): the GPU must be reset or the node
  rebooted before it runs work right again (RESET_GPU, RESTART_BM, RESTART_VM, and the DBE and
  NVLink workflows that begin with a reset); also 94, a memory error the GPU contained by
  ending the application that touched it, with a row remap pending until a reset (as Azure's,
  Meta's and AWS's health checks drain on it); the codes the catalog marks unused on A100
  and later that these three fleets' lists drain on (older GPUs'); and 167 and 169, for which
  the catalog gives no bucket yet (torchfleet's reading: a fatal PCIe timeout like 158's, a
  micro-controller halt like 62's, both RESET_GPU).
- NVLink5's 144-150 (WORKFLOW_NVLINK5_ERR) by their own line: `<unit>  Fatal   XC0 i0 Link 01
  (...)` drains (the decode sheet's Fatal and Link Fatal rows reset the GPU), but for the
  two rows the sheet marks IGNORE (149's NETIR_LINK_EVT sub-codes 38 and 40, read from the
  line's intrInfo: xid_catalog.NVLINK5_IGNORE), a warning; `Nonfatal` is a warning (an Xid
  154 follows where a reset is needed, and is judged itself).
- "application" (a warning): the application is ended for its own fault or restarts
  (RESTART_APP with CHECK_APP/CUDA, or the Xid 13/31/45 workflows): the GPU runs the next
  program; the rank's own exit is the run's failure.
- "warning": running work goes on (IGNORE): a row remap pending until the next reset (63), a
  high single-bit ECC rate (92) ...
- a code of the catalog not in the tables below takes its bucket's class (BUCKETS);
- any other code is "unknown", a warning, unless its line says the GPU must be reset or the
  node rebooted, in those words ("GPU Reset Required", "reboot required", "must be reset";
  e.g. Xid 154's "GPU recovery action changed ... to 0x1 (GPU Reset Required)"); a "reset"
  alone (an engine's or channel's own recovery) or one that only applies a pending change
  ("reset gpu to activate") is not one.

Log lines come as `dmesg` prints them (raw `[  1843.308145]` seconds since boot, `-T`'s
`[Sun Feb 23 16:24:18 2025]`, `--time-format iso` with or without `--decode`'s facility
prefix), as /dev/kmsg records (`6,3973,227996636,-;`) or without a time at all.
"""
from __future__ import annotations

import re
from datetime import datetime

from ansible_collections.torchfleet.fleet.plugins.module_utils.host import xid_catalog

# code: (meaning, NVIDIA's immediate action) -- docs/checks.md's Xid table is made of these.
DRAIN = {
    46: ("GPU stopped processing", "RESET_GPU"),
    48: ("double-bit ECC error", "WORKFLOW_XID_48"),
    56: ("display engine error", "unused on A100+; drained by the fleet lists"),
    57: ("error programming video memory interface",
         "unused on A100+; drained by the fleet lists"),
    58: ("unstable video memory interface detected",
         "unused on A100+; drained by the fleet lists"),
    62: ("internal micro-controller halt", "RESET_GPU"),
    64: ("ECC page retirement or row remapper recording failure", "RESET_GPU"),
    65: ("video processor exception", "unused on A100+; drained by the fleet lists"),
    73: ("NVENC2 error", "unused on A100+; drained by the fleet lists"),
    74: ("NVLink error", "WORKFLOW_NVLINK_ERR"),
    79: ("GPU has fallen off the bus", "RESTART_BM"),
    81: ("VGA subsystem error", "unused on A100+; drained by the fleet lists"),
    94: ("contained ECC error", "RESTART_APP; drained by the fleet lists (remap pending)"),
    95: ("uncontained ECC error", "RESET_GPU"),
    109: ("context switch timeout", "RESET_GPU"),
    110: ("security fault error", "RESET_GPU"),
    119: ("GSP RPC timeout", "RESET_GPU"),
    120: ("GSP error", "RESET_GPU"),
    136: ("link training failed", "RESET_GPU"),
    140: ("unrecovered ECC error", "RESET_GPU"),
    143: ("GPU initialization error", "RESET_GPU"),
    151: ("key rotation error", "RESTART_VM"),
    155: ("NVLink SW defined error", "RESET_GPU"),
    156: ("resource retirement event (a reset applies it)", "RESET_GPU"),
    158: ("GPU fatal timeout", "RESET_GPU"),
    167: ("PCIe fatal timeout", "no bucket in the catalog; torchfleet: as 158, RESET_GPU"),
    169: ("SEC2 micro-controller halt", "no bucket in the catalog; torchfleet: as 62, RESET_GPU"),
}
# NVLink5 (WORKFLOW_NVLINK5_ERR): fatal or not by the severity its own line gives.
NVLINK5 = {
    144: "NVLink5 SAW error", 145: "NVLink5 RLW error", 146: "NVLink5 TLW error",
    147: "NVLink5 TREX error", 148: "NVLink5 NVLPW_CTRL error", 149: "NVLink5 NETIR error",
    150: "NVLink5 MSE error",
}
APPLICATION = {
    8: ("GPU stopped processing (the channel's idle timeout)", "RESTART_APP"),
    11: ("invalid or corrupted push buffer stream", "RESTART_APP, CHECK_APP/CUDA"),
    13: ("graphics engine exception (often an illegal address in a kernel)",
         "RESTART_APP, WORKFLOW_XID_13"),
    25: ("invalid or illegal push buffer stream", "RESTART_APP, CHECK_APP/CUDA"),
    31: ("GPU memory page fault (often the program's own bad address)",
         "RESTART_APP, WORKFLOW_XID_31"),
    32: ("invalid or corrupted push buffer stream", "RESTART_APP, CHECK_APP/CUDA"),
    43: ("GPU stopped processing (a program's fault)", "IGNORE"),
    45: ("preemptive cleanup after a program ended", "WORKFLOW_XID_45"),
    68: ("NVDEC0 exception", "RESTART_APP"),
    69: ("graphics engine class error", "RESTART_APP, CHECK_APP/CUDA"),
    80: ("corrupted data sent to GPU", "RESTART_APP, CHECK_APP/CUDA"),
}
WARNING = {
    63: ("row remapping pending (running work goes on; a GPU reset applies it)", "IGNORE"),
    92: ("high single-bit ECC error rate (corrected)", "IGNORE"),
    93: ("InfoROM wear limit exceeded (non-fatal)", "IGNORE"),
    121: ("C2C error", "IGNORE"),
    137: ("NVLink privilege error", "IGNORE"),
}
SOURCES = ("NVIDIA Xid catalog (resolution buckets); azurehpc-health-checks, Meta GCM, AWS EKS "
           "node monitoring agent for the codes unused on A100 and later")
# A catalog code none of the tables above names: its immediate action's class.
BUCKETS = {"RESET_GPU": "drain", "RESTART_BM": "drain", "RESTART_VM": "drain",
           "WORKFLOW_XID_48": "drain", "WORKFLOW_NVLINK_ERR": "drain",
           "RESTART_APP": "application", "WORKFLOW_XID_13": "application",
           "WORKFLOW_XID_31": "application", "WORKFLOW_XID_45": "application",
           "IGNORE": "warning"}
MAX_LOG = 16 << 20  # the kernel ring buffer is at most a few MiB

_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})[^)]*\): "
                  r"([0-9]+),\s*(.*)$")
_RAW = re.compile(r"^\[\s*([0-9]+\.[0-9]+)\]")
_CTIME = re.compile(r"^\[(\w{3} \w{3} +[0-9]+ [0-9][0-9]:[0-9][0-9]:[0-9][0-9] [0-9]{4})\]")
_ISO = re.compile(r"([0-9]{4}-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9])[,.]?([0-9]*)([+-][0-9][0-9]:?[0-9][0-9])?")
# A /dev/kmsg record's prefix (Documentation/ABI/testing/dev-kmsg): facility*8+level, sequence
# number, microseconds since boot, flags, then optional comma-separated fields (6.x's
# CONFIG_PRINTK_CALLER adds caller=T1234567 or C3), up to the ';'. kmsg.py strips it too.
KMSG_PREFIX = re.compile(r"^[0-9]{1,10},[0-9]{1,20},([0-9]{1,20}),[^,;]{0,8}"
                         r"(?:,[^,;]{0,64}){0,8};")


def _stamp(line):
    """("boot", seconds since boot) | ("wall", epoch seconds) | (None, None)."""
    raw = _RAW.match(line)
    if raw:
        return "boot", float(raw.group(1))
    kmsg = KMSG_PREFIX.match(line)
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


# A line that says the GPU must be reset or the node rebooted: "GPU Reset Required", "Node
# Reboot Required" (Xid 154's recovery actions), "reset required", "requires a GPU reset",
# "must be reset", "Drain and Reset"; not any "reset" ("engine reset", "channel reset",
# "reset gpu to activate" a pending change: the driver's own recoveries say the word too).
_RESET = re.compile(r"\b(?:reset|reboot)\s+(?:is\s+)?(?:required|needed)\b"
                    r"|\brequires?\s+(?:an?\s+)?(?:gpu\s+|node\s+|system\s+)?(?:reset|reboot)\b"
                    r"|\bmust\s+be\s+(?:reset|rebooted)\b|\bdrain\s+and\s+reset\b", re.I)
_ACTIVATE = re.compile(r"to activate", re.I)
_NVLINK5_SEVERITY = re.compile(r"^\s*([A-Z0-9_/]{1,40})\s+(Fatal|Nonfatal)\b"
                               r"(?:.{0,40}?\(0x([0-9a-fA-F]{1,8})\b)?")
_ACTION = re.compile(r"recovery action changed (?:from 0x[0-9a-f]+ \([^)]*\) )?to (0x[0-9a-f]+)"
                     r"(?: \(([^)]{0,40})\))?", re.I)


def _nvlink5_ignored(code, severity):
    """The meaning of an NVLink5 line whose decode row NVIDIA marks IGNORE though it says
    Fatal (xid_catalog.NVLINK5_IGNORE: 149's NETIR_LINK_EVT sub-codes 38 and 40), else None."""
    if not severity or severity.group(3) is None:
        return None
    unit, intr = severity.group(1), int(severity.group(3), 16)
    sub = (intr >> 20) & 0x3f
    row = xid_catalog.NVLINK5_IGNORE.get((code, unit, sub))
    if row is None or not any(intr & mask == bits
                              for mask, bits in xid_catalog.NVLINK5_UNIT_BITS.get(unit, ())):
        return None
    return ("%s, %s sub-code %d: NVIDIA's decode says IGNORE (no reset; investigate: %s)"
            % (NVLINK5[code], unit, sub, row[1]))


def classify(code, message=""):
    """("drain" | "application" | "warning" | "unknown", meaning). message: the rest of the
    NVRM line, read for a code not in the lists (does it say the GPU must be reset?)."""
    for kind, table in (("drain", DRAIN), ("application", APPLICATION), ("warning", WARNING)):
        if code in table:
            return kind, table[code][0]
    message = str(message or "")[:300]
    if code in NVLINK5:  # "NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 ...)"
        severity = _NVLINK5_SEVERITY.match(message)
        ignored = _nvlink5_ignored(code, severity)
        if ignored:
            return "warning", ignored
        if severity and severity.group(2) == "Fatal":
            return "drain", "%s, fatal (NVIDIA's decode: reset the GPU)" % NVLINK5[code]
        return "warning", "%s, %s" % (NVLINK5[code], "non-fatal (a reset only where an Xid 154 "
                                      "asks it)" if severity else "its line gives no severity")
    if code == 154:  # "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
        action = _ACTION.search(message)
        # NVML's recovery actions: 0 none, 3 drain P2P (gpuwatch.RECOVERY_FATAL's reading:
        # running work goes on); reset, reboot, drain and reset, and any later one end it.
        if action and int(action.group(1), 16) not in (0, 3):
            return "drain", "GPU recovery action changed to %s" % (
                action.group(2) or action.group(1))
        return "warning", "GPU recovery action changed"
    entry = xid_catalog.CATALOG.get(code)
    if entry and entry[2] in BUCKETS:
        return BUCKETS[entry[2]], "%s (NVIDIA: %s)" % (entry[1], entry[2])
    if _RESET.search(message) and not _ACTIVATE.search(message):
        return "drain", "not in torchfleet's list; its line says the GPU must be reset"
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
        kind, meaning = classify(code, match.group(3))
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
