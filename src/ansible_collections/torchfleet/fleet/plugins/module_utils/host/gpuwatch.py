"""The NVIDIA GPUs of a host during a run: NVML through nvidia-ml-py where the agent's
interpreter has it, else `nvidia-smi --query-gpu` at a bounded rate.

What is read per GPU (a sample): volatile uncorrected ECC errors, remapped rows pending, the
clock event reasons, and through NVML the GPU recovery action field and Xid events
(nvmlDeviceRegisterEvents / nvmlEventSetWait with a zero wait). changes() turns two samples
into events (pure: the tests feed it recorded samples):

- fatal: uncorrected ECC errors that climbed, a recovery action that asks for a reset or a
  reboot, an Xid that xid.py drains on;
- warning: remapped rows that became pending, clocks held down for a reason other than those
  gpu.throttle accepts (idle, the SW power cap: the H200 under a matmul reads reason 4 all the
  time), any other Xid.

On the H200 every one of these NVML calls answered in under 4 ms
(tests/fixtures/h200-1gpu/nvml-idle.json); nvidia-smi costs ~50 ms of CPU a call, so it is
asked every SMI_EVERY_S only.

Only the standard library (nvidia-ml-py when it is there): it runs inside the agent.
"""
from __future__ import annotations

import os

from ansible_collections.torchfleet.fleet.plugins.module_utils.host import xid

NVML_EVERY_S = 5.0
SMI_EVERY_S = 15.0
# clocks_event_reasons bits (nvml.h): GPU idle, applications clocks setting, SW power cap.
REASONS_OK = 0x1 | 0x2 | 0x4
REASON_NAMES = {0x8: "HW slowdown", 0x10: "sync boost", 0x20: "SW thermal slowdown",
                0x40: "HW thermal slowdown", 0x80: "HW power brake slowdown",
                0x100: "display clock setting"}
# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P,
# 4 drain and reset.
RECOVERY = {1: "GPU reset", 2: "node reboot", 3: "drain P2P", 4: "drain and reset"}
RECOVERY_FATAL = (1, 2, 4)
SMI_FIELDS = ("index,pci.bus_id,ecc.errors.uncorrected.volatile.total,remapped_rows.pending,"
              "clocks_event_reasons.active")


def has_nvidia():
    return os.path.exists("/proc/driver/nvidia/gpus") or os.path.exists("/dev/nvidiactl")


def _int(text, base=10):
    try:
        return int(str(text).strip(), base)
    except ValueError:
        return None


def parse_smi(text):
    """{index: sample} from `nvidia-smi --query-gpu=<fields> --format=csv`, read by its header
    (preflight's health query, tests/fixtures/h200-1gpu/query-health.csv, reads the same way)."""
    rows = [[c.strip() for c in row.split(",")] for row in str(text).splitlines()[:65]]
    if not rows or "index" not in rows[0]:
        return {}
    head = [h.split(" [")[0] for h in rows[0]]
    out = {}
    for cells in rows[1:]:
        if len(cells) != len(head) or _int(cells[0]) is None:
            continue
        row = dict(zip(head, cells, strict=True))
        bus = row.get("pci.bus_id", "").lower()
        pending = row.get("remapped_rows.pending")
        reasons = row.get("clocks_event_reasons.active", "")
        out[_int(row["index"])] = {
            "pci_bus": (bus[4:] if len(bus) == 16 else bus) or None,  # 00000000:00:06.0
            "ecc_uncorrected": _int(row.get("ecc.errors.uncorrected.volatile.total", "")),
            "remap_pending": pending == "Yes" if pending in ("Yes", "No") else None,
            "reasons": _int(reasons, 16) if reasons.startswith("0x") else None}
    return out


def _event(kind, code, gpu, sample, what, fatal):
    return {"source": "nvml", "kind": kind, "code": code, "gpu": gpu,
            "pci_bus": sample.get("pci_bus"), "pid": None, "fatal": fatal, "what": what,
            "line": "GPU %d (%s): %s" % (gpu, sample.get("pci_bus") or "?", what)}


def changes(before, after):
    """Events from two samples ({index: sample}) of the same host's GPUs."""
    events = []
    for gpu, now in sorted(after.items()):
        was = before.get(gpu) or {}
        ecc, ecc_was = now.get("ecc_uncorrected"), was.get("ecc_uncorrected")
        if ecc is not None and ecc_was is not None and ecc > ecc_was:
            events.append(_event("ecc", ecc, gpu, now, "uncorrected ECC errors %d -> %d"
                                 % (ecc_was, ecc), True))
        if now.get("remap_pending") and not was.get("remap_pending"):
            events.append(_event("remap", "pending", gpu, now, "remapped rows pending (a reset "
                                 "applies them)", False))
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
            kind, meaning = xid.classify(code)
            events.append(_event("xid", code, gpu, now, "Xid %d, %s" % (code, meaning),
                                 kind == "drain"))
    return events


class Nvml:
    """NVML through nvidia-ml-py: one handle per GPU, Xid events registered once."""

    def __init__(self, pynvml):
        self.nv = pynvml
        pynvml.nvmlInit()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                        for i in range(min(64, pynvml.nvmlDeviceGetCount()))]
        self.events = None
        try:
            self.events = pynvml.nvmlEventSetCreate()
            for h in self.handles:
                pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError,
                                                self.events)
        except pynvml.NVMLError:
            self.events = None

    def _try(self, call, *args):
        try:
            return call(*args)
        except self.nv.NVMLError:
            return None

    def sample(self):
        nv, out = self.nv, {}
        xids = {}
        while self.events is not None and sum(len(v) for v in xids.values()) < 64:
            data = self._try(nv.nvmlEventSetWait_v2, self.events, 0)
            if data is None:
                break
            index = self._try(nv.nvmlDeviceGetIndex, data.device)
            xids.setdefault(index, []).append(int(data.eventData))
        for i, h in enumerate(self.handles):
            pci = self._try(nv.nvmlDeviceGetPciInfo, h)
            rows = self._try(nv.nvmlDeviceGetRemappedRows, h)
            field = self._try(nv.nvmlDeviceGetFieldValues, h,
                              [getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 0)])
            bus = getattr(pci, "busId", b"") if pci is not None else b""
            bus = (bus.decode() if isinstance(bus, bytes) else str(bus)).lower()
            out[i] = {
                "pci_bus": bus[4:] if len(bus) == 16 else bus or None,
                "ecc_uncorrected": self._try(nv.nvmlDeviceGetTotalEccErrors, h,
                                             nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                             nv.NVML_VOLATILE_ECC),
                "remap_pending": bool(rows[2]) if rows else None,
                "reasons": self._try(nv.nvmlDeviceGetCurrentClocksEventReasons, h),
                "recovery": (int(field[0].value.ullVal) if field and field[0].nvmlReturn == 0
                             else None),
                "xids": xids.get(i, [])}
        return out


class GpuWatch:
    """The host's NVIDIA GPUs, looked at every few seconds; nothing on a host without them."""

    def __init__(self, command=None):
        self.command, self.nvml, self.how, self.last = command, None, None, {}
        self.next_m = 0.0
        if not has_nvidia():
            return
        try:
            import pynvml  # nvidia-ml-py
            self.nvml, self.how = Nvml(pynvml), "nvml"
        except Exception:  # not installed, or NVML not loadable: nvidia-smi then
            self.nvml = None
            self.how = "nvidia-smi" if command is not None else None

    def _sample(self):
        if self.nvml is not None:
            return self.nvml.sample()
        out, why = self.command(["nvidia-smi", "--query-gpu=" + SMI_FIELDS, "--format=csv"],
                                timeout_s=10)
        return parse_smi(out) if why is None else None

    def look(self, now_m):
        """The events since the last sample, when a sample is due."""
        if self.how is None or now_m < self.next_m:
            return []
        self.next_m = now_m + (NVML_EVERY_S if self.nvml is not None else SMI_EVERY_S)
        try:
            sample = self._sample()
        except Exception:  # a driver that stops answering is the kernel log's to name
            sample = None
        if not sample:
            return []
        events = changes(self.last, sample) if self.last else [
            e for e in changes({}, sample) if e["kind"] == "xid"]
        self.last = sample
        return events
