"""The NVIDIA GPUs of a host during a run: NVML through nvidia-ml-py where the agent's
interpreter has it, else `nvidia-smi --query-gpu` at a bounded rate.

What is read per GPU (a sample): volatile uncorrected ECC errors, remapped rows pending and
whether a remapping failed, the clock event reasons, the GPU recovery action field (NVML) and
the processes running compute work on it; and NVML's Xid events, waited on all the time in
slices of EVENT_WAIT_S.
changes() turns two samples into events (pure: the tests feed it recorded samples):

- fatal: uncorrected ECC errors that climbed, a row remapping that failed (NVML's
  failureOccurred, "set if a row remapping ever failed", nvidia-smi's remapped_rows.failure:
  the GPU could not replace a bad row; NVIDIA's GPU memory error management has the GPU reset
  and judged for RMA), a recovery action that asks for a reset or a reboot, an Xid that
  xid.py drains on;
- warning: remapped rows that became pending, clocks held down for a reason other than those
  gpu.throttle accepts (idle, the SW power cap: the H200 under a matmul reads reason 4 all the
  time), any other Xid.

Everything that asks the driver runs in threads of its own, never on the agent's loop (on
the master the judge runs there too): a GPU whose firmware stops answering (Xid 119's case)
blocks each NVML call for seconds. One thread samples, another waits on the Xid event set, so
a GPU whose calls hang leaves the other GPUs' Xids read. Each call is watched from the loop
(watched.py, as ibwatch's reads of the RDMA ports are): one unanswered past NVML_DEADLINE_S is
itself an event (kind "nvml", code "timeout"): a warning, fatal once an NVML call on a GPU it
names lasts NVML_FATAL_S (a stalled nvidia-smi stays a warning: another tool may hold the
driver). Every exception of the binding is survived per call, and a call the binding lacks
(pynvml 11.x has the clocks "throttle" reasons, not the "event" ones) is asked by the name it
has.

Each event carries age_s (since it was read) and age_err_s (how much earlier it may have
happened): an Xid from the event set, the time since the last wait that found the set empty
(<= EVENT_WAIT_S plus a sample); a change between two samples, the time between them
(NVML_EVERY_S, SMI_EVERY_S).

On the H200 every one of these NVML calls answered in under 4 ms
(tests/fixtures/h200-1gpu/nvml-idle.json); nvidia-smi costs ~50 ms of CPU a call, so it is
asked every SMI_EVERY_S only, and its compute processes every SMI_APPS_EVERY_S once known.

Only the standard library (nvidia-ml-py when it is there): it runs inside the agent.
"""
from __future__ import annotations

import os
import re
import threading
import time

from ansible_collections.torchfleet.fleet.plugins.module_utils.host import watched, xid

NVML_EVERY_S = 5.0
SMI_EVERY_S = 15.0
SMI_APPS_EVERY_S = 60.0   # nvidia-smi's compute processes once some are known (a rank keeps
#                           its GPU for the run; each call costs ~50 ms of CPU)
SMI_TIMEOUT_S = 10.0
EVENT_WAIT_S = 0.5        # one nvmlEventSetWait: an Xid is read within this (and a sample)
NVML_DEADLINE_S = 2.0     # a call unanswered this long past its own wait: a warning
# ... and fatal once unanswered this long. A healthy driver answers in milliseconds (the
# H200: under 4 ms a call), so 30 s is no slow moment; a tool that holds the driver for a few
# seconds (nvidia-bug-report) stays a warning; and it is well under hang_timeout_s (300 s by
# default) and lost_after_s (30 s: the agent's own loop is never blocked), so a stuck GPU is
# named as the cause before its ranks' silence is judged a hang.
NVML_FATAL_S = 30.0
NVML_INIT_S = 10.0        # nvmlInit on GPUs without persistence mode initialises each one
MAX_GPUS = 64
MAX_PENDING = 256         # distinct events not yet taken; a repeat adds to its event's count
# clocks_event_reasons bits (nvml.h): GPU idle, applications clocks setting, SW power cap.
REASONS_OK = 0x1 | 0x2 | 0x4
REASON_NAMES = {0x8: "HW slowdown", 0x10: "sync boost", 0x20: "SW thermal slowdown",
                0x40: "HW thermal slowdown", 0x80: "HW power brake slowdown",
                0x100: "display clock setting"}
# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P,
# 4 drain and reset.
RECOVERY = {1: "GPU reset", 2: "node reboot", 3: "drain P2P", 4: "drain and reset"}
RECOVERY_FATAL = (1, 2, 4)
# What the nvidia-smi fallback asks, each by the first name the driver lists in
# `nvidia-smi --help-query-gpu`: drivers before R535 know the clock reasons only as
# clocks_throttle_reasons, and one unknown field fails the whole query.
SMI_WANT = (("index",), ("pci.bus_id",), ("ecc.errors.uncorrected.volatile.total",),
            ("remapped_rows.pending",), ("remapped_rows.failure",),
            ("clocks_event_reasons.active", "clocks_throttle_reasons.active"))
SMI_APPS = ["nvidia-smi", "--query-compute-apps=gpu_bus_id,pid", "--format=csv"]
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
# The binding's calls, newest name first (pynvml 11.x: the "throttle" names, no _v3).
REASONS_CALLS = ("nvmlDeviceGetCurrentClocksEventReasons",
                 "nvmlDeviceGetCurrentClocksThrottleReasons")
PROCS_CALLS = ("nvmlDeviceGetComputeRunningProcesses_v3",
               "nvmlDeviceGetComputeRunningProcesses_v2",
               "nvmlDeviceGetComputeRunningProcesses")
WAIT_CALLS = ("nvmlEventSetWait_v2", "nvmlEventSetWait")
NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_TIMEOUT = 3, 10
_VALUE = {1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}  # nvmlValueType_t
_NAME = re.compile(r'"([a-z0-9_.]+)"')


def has_nvidia():
    return os.path.exists("/proc/driver/nvidia/gpus") or os.path.exists("/dev/nvidiactl")


def _int(text, base=10):
    try:
        return int(str(text).strip(), base)
    except ValueError:
        return None


# A PCI domain is 4 hex digits in sysfs and the kernel's lines, 8 in NVML's bus ids, and 5
# behind an Intel VMD (10000:e0:1b.0: the domain the vmd driver adds above 0xffff).
_BDF = re.compile(r"^([0-9a-f]{4,8}):([0-9a-f]{2}):([0-9a-f]{2})(?:\.([0-7]))?$")


def bus_id(text):
    """A PCI address as sysfs and the kernel write it (0000:5d:00.0, a VMD's 10000:e0:1b.0) from
    NVML's and nvidia-smi's (00000000:5D:00.0, str or bytes) or an Xid line's (0000:5d:00);
    None for anything else."""
    text = (text.decode("ascii", "replace") if isinstance(text, bytes) else str(text or ""))
    match = _BDF.match(text.strip().lower()[:32])
    if not match:
        return None
    # One spelling of a domain whatever its width: its value, in 4 hex digits or as many as it
    # takes (00000000 -> 0000, 00010000 -> 10000), as sysfs names the device.
    return "%04x:%s:%s.%s" % (int(match.group(1), 16), match.group(2), match.group(3),
                              match.group(4) or "0")


def _rows(text, first):
    """CSV rows as dicts by the header, which must name `first`; at most 64 + 1 lines."""
    rows = [[c.strip() for c in row.split(",")] for row in str(text).splitlines()[:65]]
    if not rows or first not in [h.split(" [")[0] for h in rows[0]]:
        return []
    head = [h.split(" [")[0] for h in rows[0]]
    return [dict(zip(head, cells, strict=True)) for cells in rows[1:] if len(cells) == len(head)]


def parse_smi(text):
    """{index: sample} from `nvidia-smi --query-gpu=<fields> --format=csv`, read by its header
    (preflight's health query, tests/fixtures/h200-1gpu/query-health.csv, reads the same way;
    the clock reasons under either name)."""
    out = {}
    for row in _rows(text, "index"):
        index = _int(row["index"])
        if index is None:
            continue
        pending, failure = row.get("remapped_rows.pending"), row.get("remapped_rows.failure")
        reasons = next((row[f] for f in REASON_FIELDS if f in row), "")
        out[index] = {
            "pci_bus": bus_id(row.get("pci.bus_id")),
            "ecc_uncorrected": _int(row.get("ecc.errors.uncorrected.volatile.total", "")),
            "remap_pending": pending == "Yes" if pending in ("Yes", "No") else None,
            "remap_failed": failure == "Yes" if failure in ("Yes", "No") else None,
            "reasons": _int(reasons, 16) if reasons.startswith("0x") else None}
    return out


def parse_help(text):
    """The field names `nvidia-smi --help-query-gpu` lists (an R535+ line reads
    '"clocks_event_reasons.active" or "clocks_throttle_reasons.active"')."""
    names = set()
    for line in str(text)[:400_000].splitlines():
        if line.startswith('"'):
            names.update(_NAME.findall(line))
    return names


def smi_fields(names):
    """The --query-gpu fields to ask a driver that lists `names`; None without an index."""
    fields = [next(n for n in group if n in names) for group in SMI_WANT
              if any(n in names for n in group)]
    return ",".join(fields) if fields and fields[0] == "index" else None


def parse_apps(text):
    """{pci_bus: set of PIDs} from `nvidia-smi --query-compute-apps=gpu_bus_id,pid
    --format=csv`; None when the output is not that table."""
    if "gpu_bus_id" not in str(text).split("\n", 1)[0]:
        return None
    out = {}
    for row in _rows(text, "gpu_bus_id"):
        pid, bus = _int(row.get("pid", "")), bus_id(row.get("gpu_bus_id"))
        if pid is not None and pid > 0 and bus:
            out.setdefault(bus, set()).add(pid)
    return out


def _event(kind, code, gpu, sample, what, fatal):
    return {"source": "nvml", "kind": kind, "code": code, "gpu": gpu,
            "pci_bus": sample.get("pci_bus"), "pid": None, "fatal": fatal, "what": what,
            "line": "GPU %s (%s): %s" % ("?" if gpu is None else gpu,
                                         sample.get("pci_bus") or "?", what)}


def xid_event(code, gpu, sample):
    kind, meaning = xid.classify(code)
    return _event("xid", code, gpu, sample, "Xid %d, %s" % (code, meaning), kind == "drain")


def changes(before, after):
    """Events from two samples ({index: sample}) of the same host's GPUs."""
    events = []
    for gpu, now in sorted(after.items()):
        was = before.get(gpu) or {}
        ecc, ecc_was = now.get("ecc_uncorrected"), was.get("ecc_uncorrected")
        if ecc is not None and ecc_was is not None and ecc > ecc_was:
            events.append(_event("ecc", ecc, gpu, now, "uncorrected ECC errors %d -> %d"
                                 % (ecc_was, ecc), True))
        if now.get("remap_failed") and was.get("remap_failed") is False:
            # Sticky (it says a remapping ever failed): said once, when it turned, from a
            # sample that read it false (an unread one, None, says nothing: the flag set long
            # ago and read again after a failed read is no new fault; preflight's gpu.remap
            # judges a flag already set).
            events.append(_event("remap", "failed", gpu, now, "row remapping failed (a row "
                                 "with an uncorrectable error could not be replaced): reset "
                                 "the GPU, and have it judged for RMA", True))
        elif now.get("remap_pending") and was.get("remap_pending") is False:
            events.append(_event("remap", "pending", gpu, now, "remapped rows pending (a GPU "
                                 "reset applies them)", False))
        reasons = now.get("reasons")
        bad = (reasons or 0) & ~REASONS_OK
        if bad and bad != (was.get("reasons") or 0) & ~REASONS_OK:
            names = [n for bit, n in sorted(REASON_NAMES.items()) if bad & bit] or [hex(bad)]
            events.append(_event("clocks", bad, gpu, now, "clocks held down: %s"
                                 % ", ".join(names), False))
        action = now.get("recovery")
        if action and action != was.get("recovery"):
            events.append(_event("recovery", action, gpu, now, "NVML asks for recovery: %s"
                                 % RECOVERY.get(action, action), action in RECOVERY_FATAL))
        for code in now.get("xids") or ():
            events.append(xid_event(code, gpu, now))
    return events


def _why(exc):
    return ("%s: %s" % (type(exc).__name__, exc))[:120]


class GpuWatch:
    """The host's NVIDIA GPUs, read by threads of their own from construction to close();
    nothing on a host without them. look(), processes(), buses(), error() and `how` only read
    what the thread left, so none of them waits on the driver.

    pynvml: the binding (None: import nvidia-ml-py's, if there is one; False: nvidia-smi
    only); present: whether the host has NVIDIA GPUs (None: the driver's files say)."""

    def __init__(self, command=None, pynvml=None, present=None, every_s=None,
                 wait_s=EVENT_WAIT_S):
        self.command, self.nv, self.wait_s = command, None, wait_s
        self.every_s = every_s
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.pending = {}          # (kind, code, gpu) -> event not yet taken
        # Per thread ("sample": the samples, nvidia-smi's too; "xid": NVML's event set): the
        # call in flight (call, gpu, pci_bus, started_m, its own wait_s), and the last answer.
        self.calls = watched.Calls(("sample", "xid"))
        self.stuck = None          # (call, gpu, pci_bus, started_m): nvidia-smi timed out
        self.t = threading.local()   # the thread's slot, errors and unsupported calls
        self.stall_sent = 0        # 1: its warning sent, 2: its fatal too
        self.mode = None           # "nvml" | "nvidia-smi" once chosen
        self.read_any = False      # the newest sample read something
        self.whole_why = None      # why the GPUs are not read at all
        self.wait_why = None       # why NVML's Xid events are not read
        self.failed = {}           # call -> why, in the newest sample, failed on every GPU
        self.last, self.last_m = None, None   # the newest sample and when it began
        self.apps = None           # {pci_bus: set of PIDs} of the newest sample that said
        self.gpus = None           # [pci_bus] in index order
        self.dropped = 0
        self.thread = None
        if not (has_nvidia() if present is None else present):
            return
        if pynvml is None:
            try:
                import pynvml  # nvidia-ml-py
            except Exception:  # not installed, or not importable: nvidia-smi then
                pynvml = False
        self.nv = pynvml or None
        if self.nv is None and command is None:
            self.whole_why = "no pynvml (nvidia-ml-py) and no way to run nvidia-smi"
            return
        self.thread = threading.Thread(target=self._run, name="gpuwatch", daemon=True)
        self.thread.start()

    # -- what the agent's loop asks (never waits on the driver) --------------------------

    @property
    def how(self):
        """"nvml" or "nvidia-smi" while its newest sample read something; else None."""
        return self.mode if self.read_any else None

    def error(self):
        """Why the GPUs are not (or not wholly) read, for the watch's status; None."""
        if self.whole_why:
            return self.whole_why[:300]
        failed = list(self.failed.items()) + ([("Xid events", self.wait_why)]
                                              if self.wait_why else [])
        if not failed:
            return None
        by_why = {}          # the calls that failed alike, named together
        for call, why in failed:
            by_why.setdefault(why, []).append(call)
        return ("%s: %s" % (self.mode, "; ".join(
            "%s: %s" % (", ".join(calls), why) for why, calls in by_why.items())))[:300]

    @property
    def why(self):
        """error(), by the name the other watches give it (kmsg.KernelLog.why)."""
        return self.error()

    def processes(self):
        """{pci_bus: set of PIDs running compute work on it} from the newest sample that could
        say (CUDA opens every /dev/nvidiaN in every rank: these are the ranks whose context
        is on the GPU); None when unknown."""
        apps = self.apps
        return None if apps is None else {bus: set(pids) for bus, pids in apps.items()}

    def buses(self):
        """The PCI addresses of the GPUs watched, in NVML's / nvidia-smi's index order."""
        return list(self.gpus) if self.gpus is not None else None

    def look(self, now_m):
        """The events read since the last look, each with age_s and age_err_s at now_m."""
        with self.lock:
            found, self.pending = list(self.pending.values()), {}
        out = []
        for event in found:
            read_m = event.pop("read_m")
            out.append(dict(event, age_s=round(max(0.0, now_m - read_m), 3)))
        return out + self._stalled(now_m)

    def _stalled(self, now_m):
        """The "did not answer" event: a warning past NVML_DEADLINE_S, fatal past
        NVML_FATAL_S only for an NVML call stuck on a GPU it names (nvidia-smi, or a call of
        no one GPU, waits as long behind another tool that holds the driver: DCGM, another
        nvidia-smi; it stays a warning); dated from the unanswered call's start back to the
        last answer."""
        late = self.calls.late(now_m, NVML_DEADLINE_S)
        if self.stuck is not None:
            late.append((self.stuck, self.calls.answered["sample"]))
        if not late:
            self.stall_sent = 0
            return []

        def fatal_of(call, gpu, started_m):
            return call != "nvidia-smi" and gpu is not None and now_m - started_m >= NVML_FATAL_S
        # A GPU's stuck call first (the fault to name), else the oldest.
        (call, gpu, bus, started_m), answered_m = min(late, key=lambda x: (
            not fatal_of(x[0][0], x[0][1], x[0][3]), x[0][3]))
        fatal = fatal_of(call, gpu, started_m)
        if self.stall_sent >= (2 if fatal else 1):
            return []
        self.stall_sent = 2 if fatal else 1
        who = "nvidia-smi" if call == "nvidia-smi" else "NVML"
        what = ("%s did not answer in %g s (%s%s)" % (
            who, NVML_FATAL_S if fatal else NVML_DEADLINE_S, call,
            "" if gpu is None else ", GPU %d" % gpu)
            + (": the GPU's firmware or driver is stuck" if fatal else ""))
        event = _event("nvml", "timeout", gpu, {"pci_bus": bus}, what, fatal)
        age_s, age_err_s = watched.stall_ages(now_m, started_m, answered_m)
        event.update(age_s=age_s, age_err_s=age_err_s, count=1)
        return [event]

    def close(self):
        """Stop the thread at its next answer (one stuck in the driver is left, a daemon)."""
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=1.0)

    # -- the thread ----------------------------------------------------------------------

    def _put(self, event, read_m, age_err_s):
        """Hand an event to the next look; a repeat not yet taken adds to its count."""
        key = (event["kind"], event["code"], event["gpu"])
        with self.lock:
            kept = self.pending.get(key)
            if kept is not None:
                kept["count"] += 1
            elif len(self.pending) < MAX_PENDING or event["fatal"]:
                self.pending[key] = dict(event, read_m=read_m, count=1,
                                         age_err_s=round(min(600.0, max(0.0, age_err_s)), 3))
            else:
                self.dropped += 1

    errors = property(lambda self: self.t.__dict__.setdefault("errors", {}),
                      lambda self, value: setattr(self.t, "errors", value))
    unsupported = property(lambda self: self.t.__dict__.setdefault("unsupported", {}),
                           lambda self, value: setattr(self.t, "unsupported", value))

    def _run(self):
        self.t.slot = "sample"
        try:
            if self.nv is not None and self._nvml_open():
                self.mode, self.whole_why = "nvml", None
                self._nvml_loop()
            elif self.command is not None and not self.stopping.is_set():
                self.mode, self.nv = "nvidia-smi", None
                self._smi_loop()
        except Exception as exc:  # the thread's own fault: said in the status, never raised
            self.whole_why = "the GPU watch stopped: %s" % _why(exc)
            self.read_any = False
        finally:
            if self.mode == "nvml":
                self._call("nvmlShutdown")

    def _publish(self, sample, began_m, ended_m, apps):
        """A sample taken between began_m and ended_m: its changes since the last one."""
        if self.last is not None:
            for event in changes(self.last, sample):
                self._put(event, ended_m, ended_m - self.last_m)
        self.last, self.last_m = sample, began_m
        # By index, a GPU whose address is unknown (None) keeping its slot: CUDA_VISIBLE_DEVICES
        # counts it.
        self.gpus = [(sample.get(i) or {}).get("pci_bus") for i in range(
            min(MAX_GPUS, max(sample) + 1))] if sample else []
        if apps is not None:
            self.apps = apps

    # -- NVML ------------------------------------------------------------------------------

    def _call(self, name, *args, gpu=None, bus=None, wait_s=0.0, quiet=()):
        """One NVML call by name: its answer, or None with why kept in self.errors (a missing
        call, any exception). The call is `busy` meanwhile, for the loop's deadline."""
        call = getattr(self.nv, name, None)
        if call is None:
            self.errors[name] = "not in this pynvml"
            return None
        try:
            return self.calls.run(getattr(self.t, "slot", "sample"), call, *args, call=name,
                                  device=gpu, bus=bus, wait_s=wait_s)
        except Exception as exc:
            if not isinstance(exc, quiet):
                self.errors.setdefault(name, _why(exc))
                self.unsupported[name] = getattr(exc, "value", None) == NVML_ERROR_NOT_SUPPORTED
            return None

    def _first(self, names, *args, **kw):
        """The first of names the binding has and answers (remembered for the next calls)."""
        chosen = self.chosen.get(names)
        for name in [chosen] if chosen else names:
            if getattr(self.nv, name, None) is None:
                continue
            self.errors.pop(name, None)
            value = self._call(name, *args, **kw)
            if name not in self.errors or self.unsupported.get(name):  # it answered
                self.chosen[names] = name
                for other in names:   # an older name's FunctionNotFound is no fault
                    if other != name:
                        self.errors.pop(other, None)
                return value
        whys = [self.errors.pop(n) for n in names if n in self.errors]   # said once, by
        self.errors[names[0]] = (whys[0] if whys else                    # the newest name
                                 "not in this pynvml (nor %s)" % ", ".join(names[1:]))
        return None

    def _nvml_open(self):
        nv = self.nv
        self.errors, self.unsupported, self.chosen = {}, {}, {}
        if self._call("nvmlInit", wait_s=NVML_INIT_S) is None and "nvmlInit" in self.errors:
            self.whole_why = "nvml: nvmlInit: %s" % self.errors["nvmlInit"]
            return False
        count = self._call("nvmlDeviceGetCount")
        if not isinstance(count, int) or count < 1:
            self.whole_why = "nvml: no GPU (nvmlDeviceGetCount: %s)" % self.errors.get(
                "nvmlDeviceGetCount", count)
            self._call("nvmlShutdown")
            return False
        self.handles, self.pci = [], []
        for i in range(min(MAX_GPUS, count)):
            handle = self._call("nvmlDeviceGetHandleByIndex", i, gpu=i)
            pci = self._call("nvmlDeviceGetPciInfo", handle, gpu=i) if handle else None
            self.handles.append(handle)
            self.pci.append(bus_id(getattr(pci, "busId", None)) if pci is not None else None)
        self.gpus = list(self.pci)
        self.events = self._call("nvmlEventSetCreate")
        xid_type = getattr(nv, "nvmlEventTypeXidCriticalError", 0x8)
        registered = 0
        for i, h in enumerate(self.handles if self.events is not None else ()):
            self.errors.pop("nvmlDeviceRegisterEvents", None)
            if h is not None:   # one GPU that cannot is no reason to leave the others
                self._call("nvmlDeviceRegisterEvents", h, xid_type, self.events, gpu=i,
                           bus=self.pci[i])
                registered += "nvmlDeviceRegisterEvents" not in self.errors
        if not registered:
            self.events = None
            self.wait_why = "no Xid events: %s" % self.errors.get(
                "nvmlDeviceRegisterEvents", self.errors.get("nvmlEventSetCreate"))
        self.empty_m = time.monotonic()   # the event set was last seen empty
        return True

    def _nvml_loop(self):
        """Samples here; the event set waited on by a thread of its own, so that a GPU whose
        calls hang (its firmware stuck) leaves the other GPUs' Xids read."""
        xids = None
        if self.events is not None:
            xids = threading.Thread(target=self._xid_loop, name="gpuwatch-xid", daemon=True)
            xids.start()
        every = self.every_s or NVML_EVERY_S
        try:
            while not self.stopping.is_set():
                began_m = time.monotonic()   # the next begins an interval after this one did
                self._nvml_sample(began_m)
                self.stopping.wait(max(0.0, began_m + every - time.monotonic()))
        finally:
            self.stopping.set()
            if xids is not None:   # before nvmlShutdown; one stuck in the driver is left
                xids.join(timeout=self.wait_s + 1.0)

    def _xid_loop(self):
        self.t.slot = "xid"
        try:
            while not self.stopping.is_set():
                self._nvml_xids(self.wait_s)
        except Exception as exc:  # said in the status, never raised
            self.wait_why = "stopped: %s" % _why(exc)

    def _nvml_xids(self, wait_s):
        """Wait up to wait_s on the Xid event set, then take what else it holds (64 at most)."""
        nv = self.nv
        timeout = getattr(nv, "NVMLError_Timeout", None)
        quiet = timeout if isinstance(timeout, type) else ()
        for n in range(64):
            self.errors = {}
            ms = int(wait_s * 1000) if n == 0 else 0
            data = self._first(WAIT_CALLS, self.events, ms, wait_s=wait_s if n == 0 else 0.0,
                               quiet=quiet)
            now_m = time.monotonic()
            if data is None:
                if not self.errors:   # timed out: the set is empty now
                    self.empty_m, self.wait_why = now_m, None
                elif n == 0:          # a broken wait: said, and no busy loop on it
                    self.wait_why = "; ".join("%s: %s" % kv for kv in self.errors.items())
                    self.stopping.wait(wait_s)
                return
            xid_type = getattr(nv, "nvmlEventTypeXidCriticalError", 0x8)
            if getattr(data, "eventType", xid_type) != xid_type:
                continue
            code = _int(getattr(data, "eventData", None))
            if code is None:
                continue
            gpu = self._call("nvmlDeviceGetIndex", getattr(data, "device", None))
            gpu = gpu if isinstance(gpu, int) and 0 <= gpu < len(self.pci) else None
            sample = {"pci_bus": self.pci[gpu] if gpu is not None else None}
            self._put(xid_event(code, gpu, sample), now_m, now_m - self.empty_m)

    def _nvml_sample(self, began_m):
        nv = self.nv
        self.errors, self.unsupported = {}, {}
        failed = {}          # call -> [why] per GPU
        out, apps = {}, {}
        recovery_id = getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        for i, h in enumerate(self.handles):
            bus = self.pci[i]
            if h is None:   # its slot kept: the GPUs after it keep their indices
                out[i] = {"pci_bus": bus}
                continue
            self.errors, self.unsupported = {}, {}
            kw = {"gpu": i, "bus": bus}
            ecc = self._call("nvmlDeviceGetTotalEccErrors", h,
                             getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
                             getattr(nv, "NVML_VOLATILE_ECC", 0), **kw)
            # (corrRows, uncRows, isPending, failureOccurred)
            rows = self._call("nvmlDeviceGetRemappedRows", h, **kw)
            rows = rows if isinstance(rows, (tuple, list)) and len(rows) > 3 else None
            reasons = self._first(REASONS_CALLS, h, **kw)
            field = (self._call("nvmlDeviceGetFieldValues", h, [recovery_id], **kw)
                     if recovery_id is not None else None)
            procs = self._first(PROCS_CALLS, h, **kw)
            out[i] = {
                "pci_bus": bus,
                "ecc_uncorrected": ecc if isinstance(ecc, int) else None,
                "remap_pending": bool(rows[2]) if rows else None,
                "remap_failed": bool(rows[3]) if rows else None,
                "reasons": reasons if isinstance(reasons, int) else None,
                "recovery": _field(field)}
            if procs is not None and bus:
                try:
                    apps[bus] = {int(p.pid) for p in list(procs)[:1024]}
                except (TypeError, ValueError, AttributeError):
                    self.errors[PROCS_CALLS[-1]] = "no PIDs in its answer"
            for name, why in self.errors.items():
                if not self.unsupported.get(name):
                    failed.setdefault(name, []).append(why)
        read = [v for s in out.values() for k, v in s.items() if k != "pci_bus"]
        self.read_any = any(v is not None for v in read) or bool(apps)
        gpus = len([h for h in self.handles if h is not None])
        self.failed = {name: whys[0] for name, whys in failed.items() if len(whys) >= gpus}
        self._publish(out, began_m, time.monotonic(), apps or None)

    # -- nvidia-smi ------------------------------------------------------------------------

    def _smi(self, argv):
        """One bounded nvidia-smi call; a timed-out one stays `stuck` until one answers."""
        started_m = self.calls.begin("sample", "nvidia-smi", wait_s=SMI_TIMEOUT_S)
        try:
            out, why = self.command(argv, timeout_s=SMI_TIMEOUT_S)
        except Exception as exc:   # the command runner's own fault
            out, why = None, _why(exc)
        timed_out = why is not None and "did not answer" in str(why)
        self.calls.end("sample", answered=not timed_out)
        if timed_out:
            self.stuck = self.stuck or ("nvidia-smi", None, None, started_m)
        else:
            self.stuck = None
        return out, why

    def _smi_loop(self):
        fields, apps_m = None, 0.0
        every = self.every_s or SMI_EVERY_S
        while not self.stopping.is_set():
            began_m = time.monotonic()
            if fields is None:     # asked once the driver answers it
                out, why = self._smi(["nvidia-smi", "--help-query-gpu"])
                fields = smi_fields(parse_help(out)) if why is None else None
                self.whole_why = None if fields else "nvidia-smi --help-query-gpu: %s" % (
                    str(why)[:200] if why is not None else "no index field")
            if fields is not None:
                out, why = self._smi(["nvidia-smi", "--query-gpu=" + fields, "--format=csv"])
                sample = parse_smi(out) if why is None else {}
                self.read_any = bool(sample)
                self.failed = {} if sample else {"--query-gpu": str(why or "no GPU rows")[:200]}
                apps = None
                if sample and (not any((self.apps or {}).values()) or began_m >= apps_m):
                    out, why = self._smi(SMI_APPS)
                    apps = parse_apps(out) if why is None else None
                    if apps is not None:
                        apps = {s["pci_bus"]: set() for s in sample.values()
                                if s["pci_bus"]} | apps
                        apps_m = began_m + SMI_APPS_EVERY_S
                if sample:
                    self._publish(sample, began_m, time.monotonic(), apps)
            self.stopping.wait(max(0.0, began_m + every - time.monotonic()))


def _field(values):
    """The recovery action from nvmlDeviceGetFieldValues' answer, by its value type; None."""
    try:
        value = values[0]
        if value.nvmlReturn != 0:
            return None
        return int(getattr(value.value, _VALUE.get(getattr(value, "valueType", 3), "ullVal")))
    except (TypeError, IndexError, AttributeError, ValueError):
        return None
