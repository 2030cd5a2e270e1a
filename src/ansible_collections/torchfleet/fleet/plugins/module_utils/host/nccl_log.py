"""What NCCL really used, read from its INFO lines (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET).

A pure function over log text: the network NCCL chose (IB, Socket, or a plugin such as
IBext_v8), its devices, GPUDirect RDMA per HCA, and each channel's transport (P2P/IPC, SHM,
NET/IB/<n>[/GDRDMA], NET/Socket/<n>). Lines are grouped by the process that printed them
(`host:pid:tid [dev] NCCL INFO ...`, optionally behind an MPI-style `[rank] ` prefix); the
rank comes from the communicator's init line. Formats from NCCL 2.4 to 2.28 are recognised
(tests/fixtures/nccl/ says where each recorded log came from).

Logs come from the hosts: lines are bounded and whatever does not match is skipped, so no
input makes this raise. Imports nothing of Ansible's (the CLI's `torchfleet transport` reads
the same file).
"""
from __future__ import annotations

import re
from collections import Counter

MAX_LINE, MAX_PROCESSES, MAX_DEVICES = 4096, 4096, 64
# NCCL prints its INIT and NET lines when a communicator starts: the head of a rank's log.
HEAD_BYTES = 4 << 20

PREFIX = re.compile(r"^(?:\[\d+\]\s*)?(?P<host>[^\s:]*):(?P<pid>\d+):\d+ \[\d+\] NCCL INFO (?P<msg>.*)$")
VERSION = re.compile(r"NCCL version (\S+)")
COMM_RANK = re.compile(r"\bcomm 0x[0-9a-fA-F]+ rank (\d+) n[Rr]anks (\d+)")
IB_USING = re.compile(r"^NET/(?P<name>\w+) ?: ?Using (?P<rest>.*)$")
IB_DEVICE = re.compile(r"\[\d+\]\s*([A-Za-z0-9_.-]+:\d+)/(IB|RoCE)")
SOCKET_DEVICE = re.compile(r"\[\d+\]([A-Za-z0-9_.@-]+):")
USING_NETWORK = re.compile(r"^Using network (\S+)")
PLUGIN = re.compile(r"^P2P plugin (?:v\d+ )?(\S+)")
GDR = re.compile(r"GPU Direct RDMA (Enabled|Disabled) for HCA \d+ '([^']+)'(?:\s*\(([^)]*)\))?")
CHANNEL = re.compile(r"^(?:Channel|Ring) \d+(?:/\d+)?\s*:\s*(?P<src>\d+)(?:\[[0-9a-fA-F]+\])?\s*->\s*"
                     r"(?P<dst>\d+)(?:\[[0-9a-fA-F]+\])?(?:\s*\[(?P<dir>send|receive)\])?\s+via\s+"
                     r"(?P<via>.+?)\s*$")


def transport_of(via):
    """("NET/IB", True) for "NET/IB/0/GDRDMA"; ("P2P/IPC", None) for "P2P/IPC/read"; ("SHM",
    None) for "SHM/direct/direct" or "direct shared memory"."""
    parts = via.split("/")
    if parts[0] == "NET" and len(parts) >= 2:
        return "NET/" + parts[1], "GDRDMA" in parts[3:]
    if parts[0] == "P2P" and len(parts) >= 2:
        return "P2P/" + parts[1].split()[0], None
    if parts[0] == "SHM" or via.startswith("direct shared memory"):
        return "SHM", None
    return parts[0].split()[0] if parts[0].split() else "unknown", None


def _new(host, pid):
    return {"host": host, "pid": pid, "rank": None, "nranks": None, "version": None,
            "net": None, "plugin": None, "ib_devices": [], "socket_devices": [],
            "ib_missing": False, "gdr_hcas": {}, "channels": {}, "rdma_channels": 0,
            "gdr_channels": 0, "rank_from": None}


def read_head(path):
    """The head of a log file as text; OSError when it cannot be read."""
    with open(path, "rb") as f:
        return f.read(HEAD_BYTES).decode("utf-8", "replace")


def parse(text):
    """One record per process that printed NCCL INFO lines, in the order first seen:
    {host, pid, rank, nranks, version, net, plugin, ib_devices, socket_devices, ib_missing,
    gdr_hcas: {hca: [enabled, why]}, channels: {transport: count}, rdma_channels (NET channels
    other than Socket), gdr_channels, rank_from}. A bare "NCCL version" line (older NCCL prints it without the prefix) is
    given to every process of the text that names none."""
    procs, bare_version = {}, None
    for line in text.splitlines():
        if len(line) > MAX_LINE:
            continue
        m = PREFIX.match(line.strip())
        if not m:
            v = VERSION.search(line)
            if v and line.lstrip().startswith("NCCL version"):
                bare_version = bare_version or v.group(1)
            continue
        key = (m.group("host"), int(m.group("pid")))
        proc = procs.get(key)
        if proc is None:
            if len(procs) >= MAX_PROCESSES:
                continue
            proc = procs[key] = _new(*key)
        _take(proc, m.group("msg"))
    for proc in procs.values():
        proc["version"] = proc["version"] or bare_version
    return list(procs.values())


def _take(proc, msg):
    m = COMM_RANK.search(msg)
    if m and proc["rank_from"] != "comm":  # the first communicator: the default process group
        proc["rank"], proc["nranks"], proc["rank_from"] = int(m.group(1)), int(m.group(2)), "comm"
        return
    m = CHANNEL.match(msg)
    if m:
        kind, gdr = transport_of(m.group("via"))
        proc["channels"][kind] = proc["channels"].get(kind, 0) + 1
        if kind.startswith("NET/") and kind != "NET/Socket":
            proc["rdma_channels"] += 1
            proc["gdr_channels"] += bool(gdr)
        if proc["rank"] is None:  # the printing rank: the receiver of a receive, else the sender
            proc["rank"] = int(m.group("dst" if m.group("dir") == "receive" else "src"))
            proc["rank_from"] = "channel"
        return
    if msg.startswith("NCCL version"):
        proc["version"] = VERSION.match(msg).group(1)
        return
    m = USING_NETWORK.match(msg)
    if m:
        proc["net"] = m.group(1)
        return
    m = PLUGIN.match(msg)
    if m:
        proc["plugin"] = m.group(1)
        return
    if msg.startswith("NET/IB") and "No device found" in msg:
        proc["ib_missing"] = True
        return
    m = GDR.search(msg)
    if m:
        if len(proc["gdr_hcas"]) < MAX_DEVICES:
            proc["gdr_hcas"][m.group(2)] = [m.group(1) == "Enabled", m.group(3)]
        return
    m = IB_USING.match(msg)
    if m:
        if m.group("name") == "Socket":
            proc["socket_devices"] = SOCKET_DEVICE.findall(m.group("rest"))[:MAX_DEVICES]
        elif m.group("name") == "IB":
            found = ["%s/%s" % d for d in IB_DEVICE.findall(m.group("rest"))]
            proc["ib_devices"] = found[:MAX_DEVICES]


def network_of(proc):
    """The network a process used: what NCCL said it chose ("Using network X", 2.12+), else
    what its channels went over, else what it initialised (older NCCL)."""
    if proc["net"]:
        return proc["net"]
    nets = [k.split("/", 1)[1] for k in proc["channels"] if k.startswith("NET/")]
    if nets:
        return Counter(nets).most_common(1)[0][0]
    if proc["ib_devices"] and not proc["ib_missing"]:
        return "IB"
    if proc["socket_devices"]:
        return "Socket"
    return None


def used_sockets(proc):
    """True where the process moved data between hosts over plain TCP sockets."""
    return network_of(proc) == "Socket" or "NET/Socket" in proc["channels"]


def summarize(procs):
    """What a host's (or any set of) processes used, for the reports: {ranks, version, network,
    devices, transports: {kind: channels}, gdr: True (every RDMA channel GDRDMA) / False (some
    not) / None (no RDMA channel), gdr_disabled, socket_ranks (None for a process whose rank
    it did not print)}. None when no process printed NCCL INFO."""
    if not procs:
        return None
    transports = Counter()
    for p in procs:
        transports.update(p["channels"])
    nets = Counter(n for n in (network_of(p) for p in procs) if n)
    rdma_channels = sum(p["rdma_channels"] for p in procs)
    gdr_channels = sum(p["gdr_channels"] for p in procs)
    devices = sorted({d for p in procs for d in p["ib_devices"] or p["socket_devices"]})
    return {
        "ranks": sorted(p["rank"] for p in procs if p["rank"] is not None),
        "version": next((p["version"] for p in procs if p["version"]), None),
        "network": ", ".join(n for n, _count in nets.most_common()) or None,
        "devices": devices[:MAX_DEVICES],
        "transports": dict(sorted(transports.items())),
        "gdr": None if not rdma_channels else gdr_channels == rdma_channels,
        "gdr_disabled": sorted({"%s (%s)" % (h, why or "disabled")
                                for p in procs for h, (on, why) in p["gdr_hcas"].items()
                                if not on}),
        "socket_ranks": [p["rank"] for p in procs if used_sockets(p)],
    }


def describe(summary):
    """One line for a table: "IB mlx5_0:1/IB, GDRDMA; NET/IB 8, P2P/IPC 4"."""
    if not summary:
        return "-"
    gdr = {True: ", GDRDMA", False: ", no GDRDMA", None: ""}[summary["gdr"]]
    kinds = ", ".join("%s %d" % kv for kv in summary["transports"].items())
    devices = " ".join(summary["devices"][:4]) + (" …" if len(summary["devices"]) > 4 else "")
    return "%s%s%s%s" % (summary["network"] or "no network", " " + devices if devices else "", gdr,
                         "; " + kinds if kinds else "")
