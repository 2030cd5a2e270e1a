"""The kernel log during a run: what a line says (pure parsers) and how the log is followed.

parse() reads one line as the kernel writes it, in the formats the log is seen in: a
/dev/kmsg record (`6,3973,227996636,-;message`), `dmesg` output (`[ 1843.308145] message`,
`-T`'s ctime, `--time-format iso`), journalctl's or syslog's prefixes, or the bare message.
It knows the lines of (format strings from the kernel and the drivers that print them):

- NVIDIA Xids (`NVRM: Xid (PCI:0000:5d:00): 79, pid=..., name=..., ...`): fatal when xid.py
  drains on the code;
- PCIe AER (drivers/pci/pcie/aer.c: `AER: Uncorrected (Fatal) error received: ...`,
  `PCIe Bus Error: severity=...`): uncorrected (fatal or not) is fatal, corrected a warning;
- AMD GPUs (drivers/gpu/drm/amd/amdgpu: `GPU reset begin!`, RAS `... uncorrectable hardware
  errors detected in ... block`): a reset or an uncorrectable error is fatal, a correctable one
  a warning;
- mlx5 (drivers/net/ethernet/mellanox/mlx5/core: health.c's `device's health compromised`,
  `internal error`, `unrecoverable`, events.c's `Port module event: ... Cable unplugged`):
  fatal; its link messages (`Link down`) a warning;
- the OOM killer (mm/oom_kill.c: `Out of memory: Killed process 12584 (python3) total-vm:...kB,
  anon-rss:...kB, ...`, `Memory cgroup out of memory: Killed process ...`): kind oom.

KernelLog follows the log from the moment it is opened: /dev/kmsg (from its end), else
`journalctl -k -f`, or a file followed like `tail -F` (a container that sees the host's log
elsewhere, the lab); where none can be read it says why, once.

Only the standard library: it runs inside the agent on every host.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import subprocess

from ansible_collections.torchfleet.fleet.plugins.module_utils.host import xid
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import procs

KMSG = "/dev/kmsg"
FIX = ("run the agents as root, or `sysctl kernel.dmesg_restrict=0`, or add the user to group "
       "adm / systemd-journal, or set kernel_log to a file that holds the kernel's log")
LINE_MAX = 512        # bytes of one line kept (a kmsg record is at most ~1 KiB)
READ_MAX = 64 << 10   # bytes read from the log per look
LINES_MAX = 256       # lines parsed per look: a flood is not read faster than this

_KMSG_PREFIX = re.compile(r"^[0-9]{1,3},[0-9]{1,20},([0-9]{1,20}),[^;]{0,16};")
_DMESG_RAW = re.compile(r"^\s*(?:<[0-9]{1,3}>)?\[\s*([0-9]{1,12}\.[0-9]{1,9})\]\s?")
_BDF = r"[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?"
_PID = re.compile(r"\bpid=([0-9]{1,10})\b")
_AER_RECEIVED = re.compile(r"AER: (?:Multiple )?(Corrected|Uncorrected \((?:Non-)?Fatal\)|"
                           r"Uncorrectable \((?:Non-)?Fatal\)) error (?:message )?received"
                           r"(?::| from) ?(?:id=[0-9a-fA-F]+)?(" + _BDF + r")?")
_AER_SEVERITY = re.compile(r"PCIe Bus Error: severity=(Corrected|Uncorrected \((?:Non-)?Fatal\)"
                           r"|Uncorrectable \((?:Non-)?Fatal\))")
_DEVICE = re.compile(r"(?:^|\s)([a-z0-9_]+) (" + _BDF + r")(?: [^:\s]+)?: ")
_AMD_RESET = re.compile(r"GPU reset begin|GPU reset\(\d+\) failed|ring \S+ timeout")
_AMD_RAS = re.compile(r"([0-9]+) (uncorrectable|correctable) hardware errors detected")
_MLX5_FATAL = re.compile(r"health compromised|internal error|unrecoverable|Cable unplugged|"
                         r"PCI (?:error|slot)|device is in error state|fatal", re.I)
_MLX5_LINK = re.compile(r"Link down|Link DOWN")
_OOM = re.compile(r"(Memory cgroup out of memory|Out of memory[^:]{0,40}): Killed process "
                  r"([0-9]{1,10}),? (?:UID [0-9]+, )?\(([^)]{0,64})\)(?:.*?anon-rss:([0-9]+)kB)?")


def _bus(text):
    """A PCI address as NVML and sysfs write it: 0000:5d:00.0 (Xid lines leave out the
    function)."""
    text = text.lower()
    return text if "." in text else text + ".0"


def split(line):
    """(seconds since boot or None, the message): the kmsg record's or dmesg's stamp taken off;
    any other prefix (a wall time, a host name) stays, the parsers search past it."""
    kmsg = _KMSG_PREFIX.match(line)
    if kmsg:
        return int(kmsg.group(1)) / 1e6, line[kmsg.end():]
    raw = _DMESG_RAW.match(line)
    if raw:
        return float(raw.group(1)), line[raw.end():]
    return None, line


def parse(line):
    """One kernel log line: {"kind", "code", "pci_bus", "pid", "fatal", "what", "line",
    "boot_s"} or None when it says nothing torchfleet acts on. Never raises."""
    if not isinstance(line, str):
        return None
    line = line[:LINE_MAX].rstrip("\r\n")
    boot_s, msg = split(line)
    event = _xid(msg) or _oom(msg) or _aer(msg) or _amd(msg) or _mlx5(msg)
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
    kind, meaning = xid.classify(code)
    return {"kind": "xid", "code": code, "pci_bus": _bus(match.group(1)),
            "pid": int(pid.group(1)) if pid else None, "fatal": kind == "drain",
            "what": "Xid %d, %s" % (code, meaning)}


def _oom(msg):
    match = _OOM.search(msg)
    if not match:
        return None
    memcg = match.group(1).startswith("Memory cgroup")
    rss = int(match.group(4)) if match.group(4) else None
    size = "" if rss is None else ", anon-rss %.1f GiB" % (rss / (1 << 20)) if rss >= 1 << 20 \
        else ", anon-rss %.0f MiB" % (rss / 1024)
    return {"kind": "oom", "code": "memcg" if memcg else "global", "pid": int(match.group(2)),
            "fatal": True, "what": "killed by the kernel's OOM killer (%s%s)" % (
                "memory cgroup" if memcg else "out of memory", size)}


def _aer(msg):
    received = _AER_RECEIVED.search(msg)
    severity = received or _AER_SEVERITY.search(msg)
    if not severity:
        return None
    level = severity.group(1)
    device = (received.group(2) if received and received.group(2) else None)
    if device is None:
        named = _DEVICE.search(msg)
        device = named.group(2) if named else None
    corrected = level == "Corrected"
    return {"kind": "aer", "code": level, "pci_bus": _bus(device) if device else None,
            "fatal": not corrected, "what": "PCIe AER %s error" % level.lower()}


def _amd(msg):
    if "amdgpu" not in msg:
        return None
    named = _DEVICE.search(msg)
    bus = _bus(named.group(2)) if named else None
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
    bus = _bus(named.group(2)) if named else None
    text = msg[named.end():] if named else msg
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
    is read; `why` says why nothing can be (None while it can)."""

    def __init__(self, source=KMSG, command=None):
        self.source, self.command = source or KMSG, command
        self.fd, self.proc, self.file, self.inode, self.rest = None, None, None, None, b""
        self.how, self.why = None, None
        if self.source == KMSG:
            self._open_kmsg()
        else:
            self.how = self.source
            self._open_file(from_end=True)

    # -- /dev/kmsg, else journalctl ---------------------------------------------------------

    def _open_kmsg(self):
        try:
            self.fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
            os.lseek(self.fd, 0, os.SEEK_END)
            self.how = KMSG
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

    def _read_kmsg(self):
        lines = []
        while len(lines) < LINES_MAX:
            try:
                record = os.read(self.fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten before we read them
                    continue
                self.why = "reading %s failed: %s" % (KMSG, exc.strerror)
                self.close()
                break
            if not record:
                break
            lines.append(record.decode("utf-8", "replace"))
        return lines

    def _read_pipe(self):
        if self.proc.poll() is not None and not self.rest:
            if self.why is None:
                self.why = ("journalctl -k -f ended (exit %s): the agent's user may not read "
                            "the journal; add it to group systemd-journal or adm, or set "
                            "kernel_log" % self.proc.returncode)
            return []
        try:
            data = os.read(self.proc.stdout.fileno(), READ_MAX)
        except (BlockingIOError, OSError):
            data = b""
        return self._lines(data)

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

    def _read_file(self):
        if self.file is None:
            self._open_file(from_end=False)  # appeared after the run began: all of it is new
            if self.file is None:
                return []
        try:
            st = os.stat(self.source)
            if (st.st_dev, st.st_ino) != self.inode or st.st_size < self.file.tell():
                self.file.close()  # rotated or truncated: the new file from its start
                self.file, self.rest = None, b""
                self._open_file(from_end=False)
                if self.file is None:
                    return []
        except OSError:
            pass  # removed: what was written before stays readable on the open file
        data = self.file.read(READ_MAX)
        return self._lines(data or b"")

    def _lines(self, data):
        data = self.rest + data
        parts = data.split(b"\n")
        self.rest = parts.pop()[-LINE_MAX:]  # a line not finished yet
        return [p[:LINE_MAX].decode("utf-8", "replace") for p in parts[:LINES_MAX]]

    def read(self):
        """The new lines since the last look (at most LINES_MAX). Never raises."""
        try:
            if self.fd is not None:
                return self._read_kmsg()
            if self.proc is not None:
                return self._read_pipe()
            if self.how == self.source:
                return self._read_file()
        except (OSError, ValueError) as exc:
            self.why = "reading %s failed: %s" % (self.how, exc)
        return []

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
