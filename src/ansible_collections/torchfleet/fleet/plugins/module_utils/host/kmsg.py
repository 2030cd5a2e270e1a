"""The kernel log during a run: what a line says (pure parsers) and how the log is followed.

parse() reads one line as the kernel writes it, in the formats the log is seen in: a
/dev/kmsg record (`6,3973,227996636,-;message`), `dmesg` output (`[ 1843.308145] message`,
`-T`'s ctime, `--time-format iso`), journalctl's or syslog's prefixes, or the bare message.
It knows the lines of (format strings from the kernel and the drivers that print them):

- NVIDIA Xids (`NVRM: Xid (PCI:0000:5d:00): 79, pid=..., name=..., ...`): fatal when xid.py
  drains on the code;
- NVSwitch SXids (`nvidia-nvswitch3: SXid (PCI:0000:8a:00.0): 24007, Fatal, Link 44 ...`):
  `Fatal` is fatal to the host (the switch's NVLink fabric serves every GPU of it: the event
  names the switch and its link and no device of the run, so no one GPU or rank is blamed),
  judged host-wide for a run on some of the host's GPUs too, and its words say so (the link's
  GPU is Fabric Manager's topology, not in the line), unless the host watch finds it follows
  another GPU's fatal Xid (hwwatch); `Non-fatal` a warning (xid_catalog.SXID);
- PCIe AER (drivers/pci/pcie/aer.c and err.c, 3.x to 6.x: `AER: Uncorrected (Fatal) error
  received: ...`, 6.x's `AER: Uncorrectable (Non-Fatal) error message received from ...`,
  `PCIe Bus Error: severity=...`, `AER: device recovery failed`): an uncorrected fatal error,
  or a recovery that failed, is fatal (on the run's devices: the host watch scopes it); a
  non-fatal one, which the kernel recovers, and a corrected one are warnings. The device is
  the error's source: the BDF after `received from` / `received:`, or up to 4.18 the
  requester ID after `id=` (bus = id >> 8, device.function = id & 0xff, in the reporting
  port's PCI domain; id=0000, a source not recorded, names none), else the line's own device
  (the port). The block's detail lines
  (`AER:    [13] NonFatalErr (First)`, 4.x's `   [14] Corrected Internal Error`) are not
  events of their own, whatever driver prints them;
- AMD GPUs (drivers/gpu/drm/amd/amdgpu: `GPU reset begin!`, RAS `... uncorrectable hardware
  errors detected in ... block`): a reset or an uncorrectable error is fatal, a correctable one
  a warning;
- mlx5 (drivers/net/ethernet/mellanox/mlx5/core: health.c's `device's health compromised`,
  `internal error`, `unrecoverable`, events.c's `Port module event: ... Cable unplugged`):
  fatal; its link messages (`Link down`) a warning; a firmware command that failed (cmd.c's
  `mlx5_cmd_out_err:838:(pid N): ACCESS_REG(0x805) op_mod(0x1) failed, status internal
  error(0x1), ...`, printed for a register read by `ethtool -m`, `mlxlink` or a counter read)
  is the command's answer, not the device's health: nothing;
- the OOM killer (mm/oom_kill.c: `Out of memory: Killed process 12584 (python3) total-vm:...kB,
  anon-rss:...kB, ...`, `Memory cgroup out of memory: Killed process ...`; before 5.0 `...: Kill
  process N (name) score S or sacrifice child` then `Killed process N (name) total-vm:...`;
  since 4.19 `oom-kill:constraint=...,task_memcg=/...,task=name,pid=N,uid=0`, whose task_memcg
  is the event's `cgroup`): kind oom, one event per kill, from the `Killed process` line. The
  summary before it names the task the killer chose; 4.19 to 5.2 may then sacrifice a child
  of it instead (`Kill process N (...) score S or sacrifice child`, then `Killed process M`):
  the kill is M's, the summary's cgroup goes with it only when it names M. A summary is held
  for its kill line (the kernel writes both in one call; a summary alone killed nobody).

KernelLog follows the log from the moment it is opened: /dev/kmsg (from its end), else
`journalctl -k -f`, or a file followed like `tail -F` (a container that sees the host's log
elsewhere, the lab); where none can be read it says why, once. A look reads and judges lines
for BUDGET_S of the agent's CPU (at most LINES_MAX), a cheap test of a few words before the
parsers' expressions and a flood of one line's words parsed once; what is not returned waits
for the next look, never dropped: the bytes held are bounded by reading less (HOLD_MAX), the
rest waits in the file, the pipe or the kernel's ring. Where the ring overwrote records before
they were read (/dev/kmsg's EPIPE, a gap in its sequence numbers) the log says how many were
lost: `how` carries it to the watch's status, a reason the log was not wholly read, never a
failure. age_of() turns a line's printk stamp into an age on CLOCK_MONOTONIC: the printk
clock drifts from it by tens of seconds over weeks of uptime, so a root agent calibrates it
once, when the log is opened, by writing one marker record to /dev/kmsg and reading its stamp
back; without that, a line is dated by the looks (after the last look that read everything,
before this one).

Only the standard library: it runs inside the agent on every host.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import subprocess
import time

from ansible_collections.torchfleet.fleet.plugins.module_utils.host import gpuwatch, xid
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import procs

KMSG = "/dev/kmsg"
FIX = ("run the agents as root, or `sysctl kernel.dmesg_restrict=0`, or add the user to group "
       "adm / systemd-journal, or set kernel_log to a file that holds the kernel's log")
LINE_MAX = 1024       # bytes of one line kept (a kmsg record is at most ~1 KiB)
READ_MAX = 64 << 10   # bytes read from the log per look
HOLD_MAX = 256 << 10  # bytes read and not yet returned; past it, the log is read less
LINES_MAX = 8192      # lines returned per look at most, whatever the budget leaves
STEP = 64             # lines read between two looks at the budget
BUDGET_S = 0.02       # the agent's CPU seconds a look reads and judges lines for (the parsers
#                       take 10-40 us a line that names a device, ~1 us one that does not)
MARK_RECORDS = 256    # records read back for the calibration's marker
SAME_MAX = 256        # messages whose event is remembered (a flood of one kind parsed once)
OVERRAN = "the kernel log overran"
AGE_MAX_S = 600.0     # the most uncertain an age is said to be
DRIFT = 1e-4          # printk clock against CLOCK_MONOTONIC, s/s, allowed after calibration
MARK = "torchfleet: printk clock mark %d"

_DMESG_RAW = re.compile(r"^\s*(?:<[0-9]{1,3}>)?\[\s*([0-9]{1,12}\.[0-9]{1,9})\]\s?")
# (a domain of 4 hex digits, or 5 behind an Intel VMD: pcieport 10000:e0:1b.0)
_BDF = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?"
_PID = re.compile(r"\bpid=([0-9]{1,10})\b")
_AER_RECEIVED = re.compile(r"AER: (?:Multiple )?(Corrected|Correctable|Uncorrected \((?:Non-)?"
                           r"Fatal\)|Uncorrectable \((?:Non-)?Fatal\)) error (?:message )?"
                           r"received(?::| from) ?(?:id=([0-9a-fA-F]{4})\b)?(" + _BDF + r")?")
# aer.c's detail lines of a block: "AER:   device [15b3:1021] error status/mask=...",
# "AER:    [13] NonFatalErr            (First)", before 4.19 without "AER: " and with 4.x's
# names ("   [14] Corrected Internal Error (First)", "   [13] Advisory Non-Fatal").
_AER_DETAIL = re.compile(r"^\s*(?:AER:\s*)?(?:\[\s?[0-9]{1,2}\] |device \[[0-9a-fA-F]{4}:"
                         r"[0-9a-fA-F]{4}\] error status)")
_AER_SEVERITY = re.compile(r"PCIe Bus Error: severity=(Corrected|Correctable|Uncorrected "
                           r"\((?:Non-)?Fatal\)|Uncorrectable \((?:Non-)?Fatal\))")
_DEVICE = re.compile(r"(?:^|\s)([a-z0-9_]+) (" + _BDF + r")(?: [^:\s]+)?: ")
_AMD_RESET = re.compile(r"GPU reset begin|GPU reset\(\d+\) failed|ring \S+ timeout")
_AMD_RAS = re.compile(r"([0-9]+) (uncorrectable|correctable) hardware errors detected")
_MLX5_FATAL = re.compile(r"health compromised|internal error|unrecoverable|Cable unplugged|"
                         r"PCI (?:error|slot)|device is in error state|fatal", re.I)
_MLX5_LINK = re.compile(r"Link down|Link DOWN")
# health.c's print_health_info (5.16+): "Health issue observed, <syndrome>, severity(N) <LEVEL>:"
# with the firmware's severity as a kernel log level; a syndrome of WARNING (4) or milder is
# the firmware telling, not the HCA failing (its name may still say "internal error").
_MLX5_SEVERITY = re.compile(r"Health issue observed, .{0,80}?severity\(([0-9])\)")
# cmd.c: a firmware command's failed answer (mlx5_cmd_out_err, before 5.x mlx5_cmd_check).
_MLX5_CMD = re.compile(r"^\s*mlx5_cmd_(?:out_err|check):[0-9]{1,6}:")
_SXID = re.compile(r"(nvidia-nvswitch[0-9]{1,3}): SXid \(PCI:(" + _BDF + r")\): ([0-9]{1,6}), "
                   r"(Fatal|Non-fatal), (.{0,200})")
_SXID_LINK = re.compile(r"\s*Link ([0-9]{1,3})\b")
# A fatal SXid's words (the verdict's, through the event's `what`).
SXID_HOST_WIDE = ("judged host-wide: every GPU's NVLink fabric, a run on some of the host's GPUs "
                  "too")
_OOM = re.compile(r"(?:(Memory cgroup out of memory|Out of memory[^:]{0,40}): |(?:^|\s))"
                  r"Killed process ([0-9]{1,10}),? (?:UID [0-9]+, )?\(([^)]{0,64})\)"
                  r"(?:.*?anon-rss:([0-9]+)kB)?")
_OOM_CHOSEN = re.compile(r"(Memory cgroup out of memory|Out of memory[^:]{0,40}): Kill process "
                         r"([0-9]{1,10}) \(([^)]{0,64})\) score [0-9]+ or sacrifice child")
_OOM_KILL = re.compile(r"oom-kill:constraint=(CONSTRAINT_[A-Z_]{1,20}),")
_OOM_MEMCG = re.compile(r",task_memcg=([^,]{1,400}),task=")
_OOM_PID = re.compile(r",task=[^,]{0,64},pid=([0-9]{1,10}),uid=")
_RECOVERY = re.compile(r"AER: [Dd]evice recovery (failed|successful)")
_SEQ = re.compile(rb"^[0-9]{1,3},([0-9]{1,20}),")
# Every line a parser acts on holds one of these (a test far cheaper than the expressions).
WORDS = ("Xid", "AER", "PCIe Bus Error", "Kill", "oom-kill", "amdgpu", "mlx5_core")


def _maybe(text):
    """Whether a parser may act on text (WORDS, spelled out: twice any()'s speed)."""
    return ("Xid" in text or "AER" in text or "PCIe Bus Error" in text or "Kill" in text
            or "oom-kill" in text or "amdgpu" in text or "mlx5_core" in text)


def split(line):
    """(seconds since boot or None, the message): the kmsg record's prefix (xid.KMSG_PREFIX,
    with any caller= field) or dmesg's stamp taken off; any other prefix (a wall time, a host
    name) stays, the parsers search past it."""
    kmsg = xid.KMSG_PREFIX.match(line)
    if kmsg:
        return int(kmsg.group(1)) / 1e6, line[kmsg.end():]
    raw = _DMESG_RAW.match(line)
    if raw:
        return float(raw.group(1)), line[raw.end():]
    return None, line


def parse(line, memo=None):
    """One kernel log line: {"kind", "code", "pci_bus", "pid", "fatal", "what", "line",
    "boot_s"} (an OOM event adds "cgroup") or None when it says nothing torchfleet acts on.
    memo: a dict kept between the lines of one log (KernelLog.parse keeps one): the kernels
    before 5.0 say in one line whether the OOM was a memory cgroup's and in the next whom it
    killed. Never raises."""
    if not isinstance(line, str):
        return None
    line = line[:LINE_MAX].rstrip("\r\n")
    boot_s, msg = split(line)
    if not _maybe(msg):
        return None
    memo = memo if isinstance(memo, dict) else {}
    event = (_xid(msg) or _sxid(msg) or _oom(msg, memo) or _aer(msg) or _amd(msg)
             or _mlx5(msg))
    if event is None:
        return None
    return dict({"code": None, "pci_bus": None, "pid": None}, **event,
                line=msg.strip()[:300], boot_s=boot_s)


def _xid(msg):
    match = xid._XID.search(msg)
    if not match:
        return None
    code = int(match.group(2)[:6])
    pid = _PID.search(match.group(3))
    kind, meaning = xid.classify(code, match.group(3))
    return {"kind": "xid", "code": code, "pci_bus": gpuwatch.bus_id(match.group(1)),
            "pid": int(pid.group(1)) if pid else None, "fatal": kind == "drain",
            "what": "Xid %d, %s" % (code, meaning)}


def _sxid(msg):
    match = _SXID.search(msg)
    if not match:  # also its "Severity 1 Engine instance ..." and "Data {...}" lines
        return None
    switch, bus, fatal = match.group(1), match.group(2).lower(), match.group(4) == "Fatal"
    link = _SXID_LINK.match(match.group(5))
    # pci_bus None: the switch is none of the run's devices and every GPU's fabric; a device
    # would make the host watch call it another device's and no GPU is the one at fault.
    # Host-wide even for a run on some of the host's GPUs (CUDA_VISIBLE_DEVICES), and said so:
    # the line names a switch port, which GPU that port serves is Fabric Manager's topology
    # (not in the line, sysfs or NVML's bus ids), and its recovery resets the GPUs and the
    # switches together (xid_catalog.SXID).
    return {"kind": "nvswitch", "code": int(match.group(3)), "fatal": fatal,
            "what": "NVSwitch %s (PCI %s) SXid %s, %s%s: %s" % (
                switch, bus, match.group(3), match.group(4).lower(),
                " (link %s)" % link.group(1) if link else "",
                SXID_HOST_WIDE if fatal else match.group(5).strip()[:60])}


def _oom_event(memcg, pid, rss=None, cgroup=None):
    size = "" if rss is None else ", anon-rss %.1f GiB" % (rss / (1 << 20)) if rss >= 1 << 20 \
        else ", anon-rss %.0f MiB" % (rss / 1024)
    return {"kind": "oom", "code": "memcg" if memcg else "global", "pid": pid, "fatal": True,
            "cgroup": cgroup, "what": "killed by the kernel's OOM killer (%s%s)" % (
                "memory cgroup" if memcg else "out of memory", size)}


def _oom(msg, memo):
    if "oom-kill:" in msg:  # 4.19+: the summary before the kill: the task chosen, its cgroup
        constraint = _OOM_KILL.search(msg)
        if not constraint:
            return None
        memo["oom"] = constraint.group(1) == "CONSTRAINT_MEMCG"
        pid, memcg = _OOM_PID.search(msg), _OOM_MEMCG.search(msg)
        # Held for the kill line: 4.19-5.2 may kill a child of the task named here instead.
        memo["summary"] = (int(pid.group(1)) if pid else None,
                           memcg.group(1)[:300] if memcg else None)
        return None
    chosen = _OOM_CHOSEN.search(msg)
    if chosen:  # before 5.3; not the kill yet (a child may be sacrificed instead)
        memo["oom"] = chosen.group(1).startswith("Memory cgroup")
        return None
    match = _OOM.search(msg)
    if not match:
        return None
    memcg = match.group(1).startswith("Memory cgroup") if match.group(1) else memo.get(
        "oom", False)
    pid = int(match.group(2))
    summary = memo.pop("summary", None)
    # The summary's task_memcg is this victim's only when it names this victim (a sacrificed
    # child's own cgroup is not printed).
    cgroup = summary[1] if summary and summary[0] == pid else None
    return _oom_event(memcg, pid, int(match.group(4)) if match.group(4) else None, cgroup)


def _aer(msg):
    recovery = _RECOVERY.search(msg)
    if recovery:  # err.c: "AER: Device recovery failed" (before 5.8), "device recovery failed"
        if recovery.group(1) != "failed":
            return None
        named = _DEVICE.search(msg)
        return {"kind": "aer", "code": "recovery failed",
                "pci_bus": gpuwatch.bus_id(named.group(2)) if named else None, "fatal": True,
                "what": "PCIe AER: the kernel could not recover the device"}
    received = _AER_RECEIVED.search(msg)
    severity = received or _AER_SEVERITY.search(msg)
    if not severity:
        return None
    level = severity.group(1)
    named = _DEVICE.search(msg)
    device = received.group(3) if received and received.group(3) else None
    rid = int(received.group(2), 16) if received and received.group(2) else 0
    if device is None and rid:
        # Up to 4.18 the source is a requester ID: bus, device.function, in the port's domain
        # (an NVMe drive under the GPU's root port is the drive, not the port). id=0000 is a
        # source the port did not record ("Multiple ... id=0000"): the port is named.
        # (the domain whatever its width: a VMD's root port is 10000:e0:1b.0)
        device = "%s:%02x:%02x.%d" % (named.group(2).split(":")[0] if named else "0000",
                                      rid >> 8, (rid & 0xff) >> 3, rid & 7)
    if device is None:
        device = named.group(2) if named else None
    # 6.x names them Correctable / Uncorrectable; one code whichever kernel wrote it.
    level = level.replace("Uncorrectable", "Uncorrected").replace("Correctable", "Corrected")
    fatal = level == "Uncorrected (Fatal)"
    what = "PCIe AER %s error" % level.lower()
    if level == "Uncorrected (Non-Fatal)":
        what += " (the kernel recovers it; a failed recovery is said apart)"
    return {"kind": "aer", "code": level, "pci_bus": gpuwatch.bus_id(device) if device else None,
            "fatal": fatal, "what": what}


def _amd(msg):
    if "amdgpu" not in msg:
        return None
    named = _DEVICE.search(msg)
    bus = gpuwatch.bus_id(named.group(2)) if named else None
    if _AMD_RESET.search(msg):
        return {"kind": "amdgpu", "code": "reset", "pci_bus": bus, "fatal": True,
                "what": "AMD GPU reset"}
    ras = _AMD_RAS.search(msg)
    if ras:
        fatal = ras.group(2) == "uncorrectable"
        return {"kind": "amdgpu", "code": "ras-" + ras.group(2), "pci_bus": bus, "fatal": fatal,
                "what": "AMD GPU RAS: %s %s errors" % (ras.group(1), ras.group(2))}
    return None


def _mlx5(msg):
    if "mlx5_core" not in msg:
        return None
    named = _DEVICE.search(msg)
    bus = gpuwatch.bus_id(named.group(2)) if named else None
    text = msg[named.end():] if named else msg
    if "AER:" in text or _AER_DETAIL.match(text) or _MLX5_CMD.match(text):
        return None  # an AER block's detail (its severity line is judged), a command's answer
    mild = _MLX5_SEVERITY.search(text)
    if mild and int(mild.group(1)) >= 4:
        return {"kind": "mlx5", "code": "health", "pci_bus": bus, "fatal": False,
                "what": "mlx5 NIC: %s" % text.strip()[:120]}
    if _MLX5_FATAL.search(text):
        return {"kind": "mlx5", "code": "cable" if "Cable unplugged" in text else "health",
                "pci_bus": bus, "fatal": True,
                "what": "mlx5 NIC: %s" % text.strip()[:120]}
    if _MLX5_LINK.search(text):
        return {"kind": "mlx5", "code": "link", "pci_bus": bus, "fatal": False,
                "what": "mlx5 NIC: %s" % text.strip()[:120]}
    return None


def readable(source=KMSG):
    """None when the kernel log a run's agent will follow can be read here, else why (what
    preflight warns of: host.kmsg). A file not there yet is not an error (tail -F waits)."""
    path = source or KMSG
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        return None
    except FileNotFoundError:
        return None if path != KMSG else "%s does not exist" % KMSG
    except OSError as exc:
        fallback = "; the agent will try journalctl -k -f" if path == KMSG and shutil.which(
            "journalctl") else ""
        return "cannot read %s (%s)%s" % (path, exc.strerror or exc, fallback)


class KernelLog:
    """The kernel log from now on, a few lines per look. source: /dev/kmsg (falls back to
    journalctl -k -f where it cannot be read) or a file followed like tail -F. `how` names what
    is read; `why` says why nothing can be (None while it can). clock: CLOCK_MONOTONIC's
    seconds (time.monotonic), injected by tests."""

    def __init__(self, source=KMSG, command=None, clock=time.monotonic):
        self.source, self.command, self.clock = source or KMSG, command, clock
        self.fd, self.proc, self.file, self.inode, self.rest = None, None, None, None, b""
        self.how, self.why, self.skip, self.memo, self.early = None, None, False, {}, []
        self.mark = None
        self.seq = None          # the last /dev/kmsg record's sequence number
        self.lost = self.overruns = 0   # records the ring overwrote unread; EPIPEs
        self.judged = {}         # id(line) -> (line, event) of the last read()
        self.same = {}           # message -> event (a flood's repeats), SAME_MAX at most
        self.budget_s = BUDGET_S
        # printk stamp + offset = CLOCK_MONOTONIC, within offset_err (None: not calibrated)
        self.offset = self.offset_err = self.calibrated_m = None
        self.look_m = self.since_m = self.caught_m = self.clock()
        if self.source == KMSG:
            self._open_kmsg()
        else:
            self.how = self.source
            self._open_file(from_end=True)

    @property
    def how(self):
        """What is read ("/dev/kmsg", "journalctl -k -f", the file), and where the ring
        overran, how many records were lost (the watch's status carries it as "kmsg")."""
        lost = self.overran()
        return self._how if self._how is None or lost is None else "%s (%s)" % (self._how, lost)

    @how.setter
    def how(self, value):
        self._how = value

    def overran(self):
        """"the kernel log overran: N records were lost before they were read", or None."""
        if self.lost:
            return "%s: %d record%s lost before %s read" % (
                OVERRAN, self.lost, " was" if self.lost == 1 else "s were",
                "it was" if self.lost == 1 else "they were")
        if self.overruns:
            return "%s %d time%s: records were lost before they were read" % (
                OVERRAN, self.overruns, "" if self.overruns == 1 else "s")
        return None

    def parse(self, line):
        """parse() with this log's memo (the OOM lines of kernels before 5.0); a line the last
        read() returned was judged there, within its budget: its event is handed over."""
        judged = getattr(self, "judged", {}).pop(id(line), None)
        if judged is not None and judged[0] is line:
            return judged[1]
        return parse(line, self.memo)

    def _judge(self, line):
        """parse() for read(), a flood's repeated message parsed once (not the OOM killer's
        lines: the memo ties them to the lines before)."""
        try:
            if not _maybe(line):  # most of a busy log: no stamp or prefix holds these words
                self.judged[id(line)] = (line, None)
                return
            boot_s, msg = split(line[:LINE_MAX].rstrip("\r\n"))
            key = msg.strip()
            if "Kill" in key or "oom-kill" in key:
                event = parse(line, self.memo)
            elif key in self.same:
                event = self.same[key]
                event = None if event is None else dict(event, boot_s=boot_s)
            else:
                event = parse(line, self.memo)
                if len(self.same) >= SAME_MAX:
                    self.same.clear()
                self.same[key] = None if event is None else dict(event)
        except Exception:  # never: parse() is total; the line is parsed again by parse()
            return
        self.judged[id(line)] = (line, event)

    def _count(self, record):
        """A /dev/kmsg record's sequence number: a gap after the last is records the ring
        overwrote before they were read."""
        seq = _SEQ.match(record)
        if seq is None:
            return
        seq = int(seq.group(1))
        if self.seq is not None and seq > self.seq + 1:
            self.lost = min(1 << 62, self.lost + seq - self.seq - 1)
        self.seq = seq

    # -- /dev/kmsg, else journalctl ---------------------------------------------------------

    def _open_kmsg(self):
        try:
            self.fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
            os.lseek(self.fd, 0, os.SEEK_END)
            self.how = KMSG
            self.calibrate()
            return
        except OSError as exc:
            denied = exc.strerror or str(exc)
        try:
            # -n 0: nothing from before the run. It ends with the agent, killed or not.
            parent = os.getpid()
            self.proc = subprocess.Popen(
                ["journalctl", "-k", "-f", "-n", "0", "-q", "-o", "short-monotonic"],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                preexec_fn=lambda: procs.die_with(parent, signal.SIGKILL))
            os.set_blocking(self.proc.stdout.fileno(), False)
            self.how = "journalctl -k -f"
        except OSError:
            self.proc = None
        if self.proc is None:
            self.why = ("cannot read %s (%s) and journalctl is not there: run the agent as "
                        "root, or set kernel.dmesg_restrict=0, or set kernel_log to a file "
                        "that holds the kernel's log" % (KMSG, denied))

    def calibrate(self, path=KMSG):
        """Where /dev/kmsg can be written (root): write one marker record, read its printk
        stamp back, and keep stamp -> CLOCK_MONOTONIC. The records read before the marker are
        kept for the next look. True when calibrated; never raises."""
        mark = self.mark = MARK % (os.getpid() * 1000 + int(self.clock() * 1000) % 1000)
        try:
            out = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return False  # not root: lines are dated by the looks
        try:
            before = self.clock()
            os.write(out, ("<6>%s\n" % mark).encode())
            after = self.clock()
        except OSError:
            return False
        finally:
            os.close(out)
        for _record in range(MARK_RECORDS):
            try:
                record = os.read(self.fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    self.overruns += 1
                    continue
                break
            self._count(record)
            record = record.decode("utf-8", "replace")
            boot_s, msg = split(record)
            if msg.rstrip("\r\n") == mark and boot_s is not None:
                self.offset, self.offset_err = (before + after) / 2 - boot_s, (after - before) / 2
                self.calibrated_m = after
                return True
            self.early.append(record)
        return False

    def _read_kmsg(self, n):
        lines, drained = self.early[:n], False
        del self.early[:n]
        while len(lines) < n:
            try:
                record = os.read(self.fd, 8192)
            except BlockingIOError:
                drained = True
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten before we read them
                    self.overruns += 1        # (the next record's number says how many)
                    continue
                self.why = "reading %s failed: %s" % (KMSG, exc.strerror)
                self.close()
                break
            if not record:
                drained = True
                break
            self._count(record)
            text = record.decode("utf-8", "replace")
            if split(text)[1].rstrip("\r\n") != self.mark:
                lines.append(text)
        return lines, drained and not self.early

    def _read_pipe(self, n):
        if self.proc.poll() is not None and not self.rest:
            if self.why is None:
                self.why = ("journalctl -k -f ended (exit %s): the agent's user may not read "
                            "the journal; add it to group systemd-journal or adm, or set "
                            "kernel_log" % self.proc.returncode)
            return [], True
        want = self._room(n)
        try:
            data = os.read(self.proc.stdout.fileno(), want) if want else b""
        except (BlockingIOError, OSError):
            data = b""
        return self._lines(data, want and len(data) < want, n)

    # -- a file, like tail -F -----------------------------------------------------------------

    def _open_file(self, from_end):
        try:
            f = open(self.source, "rb")
        except OSError:
            return  # not there yet (tail -F waits for it)
        st = os.fstat(f.fileno())
        if from_end:
            f.seek(0, os.SEEK_END)
        self.file, self.inode = f, (st.st_dev, st.st_ino)

    def _read_file(self, n):
        if self.file is None:
            self._open_file(from_end=False)  # appeared after the run began: all of it is new
            if self.file is None:
                return [], True
        try:
            st = os.stat(self.source)
            rotated = (st.st_dev, st.st_ino) != self.inode
            if rotated or st.st_size < self.file.tell():
                # rotated: what the old file still holds first; truncated: nothing left of it
                want = self._room()
                rest = (self.file.read(want) or b"") if rotated and want else b""
                if not rotated or len(rest) < want:
                    self.file.close()  # then the new file from its start
                    self.file, self.skip = None, False
                    if not (self.rest + rest).endswith(b"\n") and (self.rest + rest):
                        rest += b"\n"  # the old file's unfinished last line ends here
                    self._open_file(from_end=False)
                if self.file is None or len(rest) >= want:
                    return self._lines(rest, False, n)[0], False
                self.rest, rest = self.rest + rest, b""
        except OSError:
            pass  # removed: what was written before stays readable on the open file
        want = self._room(n)
        data = self.file.read(want) if want else b""
        return self._lines(data or b"", want and len(data or b"") < want, n)

    def _room(self, n=None):
        """How much to read now: READ_MAX, less what is held (a flood is read less, not
        dropped); nothing while n whole lines are held already."""
        if n is not None and self.rest.count(b"\n") >= n:
            return 0
        return max(0, min(READ_MAX, HOLD_MAX - len(self.rest)))

    def _lines(self, data, eof, n=STEP):
        """At most n whole lines of what is held and data; the rest is held. A line longer
        than LINE_MAX keeps its first LINE_MAX bytes."""
        if self.skip:
            cut = data.find(b"\n")
            if cut < 0:
                data = b""
            else:
                data, self.skip = b"\n" + data[cut + 1:], False
        parts = (self.rest + data).split(b"\n", n)
        self.rest = parts.pop()
        if b"\n" not in self.rest and len(self.rest) > LINE_MAX:
            self.rest, self.skip = self.rest[:LINE_MAX], True  # its end is not kept
        lines = [p[:LINE_MAX].decode("utf-8", "replace") for p in parts]
        return lines, bool(eof) and b"\n" not in self.rest

    def read(self):
        """The new lines since the last look, STEP at a time while the look's BUDGET_S of CPU
        lasts (each judged as it is read: parse() hands its event over), at most LINES_MAX;
        the others wait for the next look. Never raises."""
        start, spent = self.clock(), time.thread_time()
        lines, drained = [], False
        self.judged = {}
        try:
            while len(lines) < LINES_MAX:
                n = min(STEP, LINES_MAX - len(lines))
                if self.fd is not None:
                    got, drained = self._read_kmsg(n)
                elif self.proc is not None:
                    got, drained = self._read_pipe(n)
                elif self._how == self.source:
                    got, drained = self._read_file(n)
                else:
                    got, drained = [], True
                for line in got:
                    self._judge(line)
                lines += got
                if drained or not got or time.thread_time() - spent >= self.budget_s:
                    break
        except (OSError, ValueError) as exc:
            self.why = "reading %s failed: %s" % (self._how, exc)
        # These lines were written after the last look that read everything, before now.
        self.since_m, self.look_m = self.caught_m, self.clock()
        if drained:
            self.caught_m = start
        return lines

    def age_of(self, boot_s, now_m=None):
        """(age_s, age_err_s) of a line the last read() returned, on CLOCK_MONOTONIC at now_m
        (that read's time if None): it happened between now_m - age_s - age_err_s and
        now_m - age_s. A calibrated /dev/kmsg stamp (boot_s) dates it within the calibration's
        uncertainty and DRIFT since; else the looks bound it."""
        now_m = self.look_m if now_m is None else now_m
        lo, hi = self.since_m, self.look_m
        if (self.offset is not None and isinstance(boot_s, (int, float))
                and not isinstance(boot_s, bool)):
            at = boot_s + self.offset
            err = self.offset_err + DRIFT * abs(hi - self.calibrated_m)
            s_lo, s_hi = max(lo, at - err), min(hi, at + err)
            if s_lo <= s_hi:  # a stamp outside the looks' bounds is not believed
                lo, hi = s_lo, s_hi
        age = max(0.0, now_m - hi)
        return round(age, 6), round(min(AGE_MAX_S, max(0.0, hi - lo)), 6)

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc.stdout.close()
            self.proc = None
        if self.file is not None:
            self.file.close()
            self.file = None
