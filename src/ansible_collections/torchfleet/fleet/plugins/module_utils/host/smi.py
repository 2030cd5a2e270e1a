"""What the GPU vendors' tools say about each GPU's health, as plain per-GPU dicts.

NVIDIA: one `nvidia-smi -q` answers every question (ECC counts, retired pages, remapped rows,
PCIe link, clock-event reasons, persistence, fabric state, processes), so the hosts run it once;
`nvidia-smi nvlink -s` gives each NVLink's state. AMD: `amd-smi metric --json` (ECC, PCIe,
XGMI), `amd-smi static --json` (the link's maximum), `amd-smi process --json` and
`amd-smi bad-pages --json`. Field names and layouts are those of the recorded real outputs in
tests/fixtures/health/ (their sources are named there). Every parser takes any text: what it
cannot read is left out (None), never raised.
"""
from __future__ import annotations

import json
import math
import re

# nvidia-smi's documented exit codes (nvidia-smi(1), RETURN VALUE).
SMI_EXIT = {
    2: "an invalid argument or flag was given",
    3: "the requested operation is not available on the target device",
    4: "the current user does not have permission to access this device",
    6: "the query was unsuccessful",
    8: "a device's external power cables are not properly attached",
    9: "the NVIDIA driver is not loaded",
    10: "the NVIDIA kernel detected an interrupt issue with a GPU",
    12: "the NVML shared library could not be found or loaded",
    13: "the local NVML library does not implement this function",
    14: "the infoROM is corrupted",
    15: "the GPU has fallen off the bus or has otherwise become inaccessible",
}
MAX_TEXT = 4 << 20  # an 8-GPU `nvidia-smi -q` is ~100 KB; anything past this is not read

_KEY_VALUE = re.compile(r"^(\s*)(\S.*?)\s+:\s?(.*)$")
_NA = ("", "N/A", "[N/A]", "Not Available", "[Not Supported]", "Not Supported")


def smi_exit_meaning(rc):
    return SMI_EXIT.get(rc, "exit status %s" % rc)


class Node:
    """One line of `nvidia-smi -q`: its key, its value (None for a section) and what is
    indented under it, in order (keys repeat: one "Process ID" per process)."""

    __slots__ = ("key", "value", "children")

    def __init__(self, key, value=None):
        self.key, self.value, self.children = key, value, []

    def get(self, *path):
        node = self
        for key in path:
            node = next((c for c in node.children if c.key == key), None)
            if node is None:
                return None
        return node

    def text(self, *path):
        node = self.get(*path)
        value = node.value if node is not None else None
        return None if value is None or value.strip() in _NA else value.strip()


def _tree(text):
    """The GPU sections of `nvidia-smi -q` (a Node each, its value the bus id), by indentation."""
    gpus, stack = [], []
    for line in str(text)[:MAX_TEXT].splitlines():
        if not line.strip() or line.startswith("="):
            continue
        indent = len(line) - len(line.lstrip(" \t"))
        if indent == 0:
            stack = []
            if line.startswith("GPU ") and len(line.split()) == 2:
                root = Node("GPU", line.split()[1])
                gpus.append(root)
                stack = [(-1, root)]
            continue
        if not stack:
            continue
        match = _KEY_VALUE.match(line)
        node = Node(match.group(2).strip(), match.group(3)) if match else Node(line.strip())
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        stack[-1][1].children.append(node)
        stack.append((indent, node))
    return gpus


def _int(value):
    if value is None:
        return None
    match = re.match(r"\s*([0-9]{1,18})(?![0-9])", str(value))
    return int(match.group(1)) if match else None


def _sum(values):
    numbers = [v for v in values if v is not None]
    return sum(numbers) if numbers else None


def _ecc(node):
    """(uncorrected, corrected) of one ECC block ("Volatile"): newer drivers name each memory
    (SRAM/DRAM Correctable/Uncorrectable...), older ones Single Bit / Double Bit totals."""
    if node is None:
        return None, None
    leaves = {c.key: _int(c.value) for c in node.children if c.value is not None}
    uncorrected = _sum(v for k, v in leaves.items() if "Uncorrectable" in k)
    corrected = _sum(v for k, v in leaves.items() if "Correctable" in k and "Un" not in k)
    if uncorrected is None and corrected is None:
        double, single = node.get("Double Bit"), node.get("Single Bit")
        uncorrected = _int(double.text("Total")) if double else None
        corrected = _int(single.text("Total")) if single else None
    return uncorrected, corrected


def _yes(value):
    return None if value is None else value.strip().lower() in ("yes", "active", "enabled")


def _reasons(node):
    """Names of the active clock-event reasons (nested ones too: HW Slowdown's children)."""
    active = []
    for child in (node.children if node is not None else []):
        if child.value is not None and child.value.strip() == "Active":
            active.append(child.key)
        active.extend(_reasons(child))
    return active


def _processes(node):
    found = []
    for child in (node.children if node is not None else []):
        if child.key == "Process ID" and _int(child.value) is not None:
            found.append({"pid": _int(child.value), "name": child.text("Name"),
                          "type": child.text("Type"),
                          "used_mib": _int(child.text("Used GPU Memory"))})
    return found


def parse_smi_q(text):
    """One dict per GPU of `nvidia-smi -q`, in its order (nvidia-smi's index order)."""
    gpus = []
    for index, gpu in enumerate(_tree(text)):
        link = gpu.get("PCI", "GPU Link Info")
        width = link.get("Link Width") if link else None
        gen = link.get("PCIe Generation") if link else None
        uncorrected, corrected = _ecc(gpu.get("ECC Errors", "Volatile"))
        remap = gpu.get("Remapped Rows")
        retired = gpu.get("Retired Pages")
        pending_page = None
        if retired is not None:
            pending_page = next((_yes(c.value) for c in retired.children
                                 if c.key.startswith("Pending") and c.text() is not None), None)
        reasons = gpu.get("Clocks Event Reasons") or gpu.get("Clocks Throttle Reasons")
        processes = gpu.get("Processes")
        gpus.append({
            "index": index,
            "bus_id": gpu.value,
            "name": gpu.text("Product Name"),
            "persistence": _yes(gpu.text("Persistence Mode")),
            "ecc_enabled": _yes(gpu.text("ECC Mode", "Current")),
            "ecc_uncorrected": uncorrected,
            "ecc_corrected": corrected,
            "retired_pending": pending_page,
            "remap_pending": _yes(remap.text("Pending")) if remap else None,
            "remap_failed": _yes(remap.text("Remapping Failure Occurred")) if remap else None,
            "remap_uncorrectable": _int(remap.text("Uncorrectable Error")) if remap else None,
            "pcie_width": _int(width.text("Current")) if width else None,
            "pcie_width_max": _int(width.text("Max")) if width else None,
            "pcie_gen": _int(gen.text("Current")) if gen else None,
            "pcie_gen_max": _int((gen.text("Device Max") or gen.text("Max"))) if gen else None,
            "clock_events": _reasons(reasons),
            "fabric_state": gpu.text("Fabric", "State"),
            "fabric_status": gpu.text("Fabric", "Status"),
            "processes": _processes(processes),
        })
    return gpus


def parse_nvlink_status(text):
    """{gpu index: {link: "25 GB/s" | "<inactive>"}} of `nvidia-smi nvlink -s`."""
    links, gpu = {}, None
    for line in str(text)[:MAX_TEXT].splitlines():
        head = re.match(r"^GPU ([0-9]{1,6}):", line)
        if head:
            gpu = int(head.group(1))
            links.setdefault(gpu, {})
            continue
        link = re.match(r"^\s+Link ([0-9]{1,6}): (.*)$", line)
        if link and gpu is not None:
            links[gpu][int(link.group(1))] = link.group(2).strip()
    return links


def inactive_links(links):
    return sorted(n for n, state in links.items() if "inactive" in state.lower())


# -- AMD ---------------------------------------------------------------------------------------

def _gpu_list(text):
    """amd-smi's --json: a list of GPU objects, or (ROCm 7) an object whose gpu_data holds it."""
    try:
        data = json.loads(str(text)[:MAX_TEXT])
    except ValueError:
        return []
    if isinstance(data, dict):
        data = data.get("gpu_data", [])
    return [g for g in data if isinstance(g, dict)] if isinstance(data, list) else []


def _list(value):
    return value if isinstance(value, list) else []


def _number(value):
    if isinstance(value, dict):
        value = value.get("value")
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if abs(value) < 1 << 62 else None
    if isinstance(value, float):
        # NaN, infinities and absurd sizes are no count: a rule formats counts as integers.
        return value if math.isfinite(value) and abs(value) < 1e18 else None
    return _int(value) if isinstance(value, str) and re.fullmatch("[0-9]{1,18}", value.strip()) else None


def _gpu_id(item, n):
    gpu = item.get("gpu", n)
    return gpu if isinstance(gpu, int) and not isinstance(gpu, bool) else n


def parse_amd_metric(text):
    """{gpu: {ecc_uncorrected, ecc_corrected, ecc_deferred, pcie_width, xgmi_error}} of
    `amd-smi metric --json`."""
    found = {}
    for n, item in enumerate(_gpu_list(text)):
        ecc = item.get("ecc") if isinstance(item.get("ecc"), dict) else {}
        pcie = item.get("pcie") if isinstance(item.get("pcie"), dict) else {}
        xgmi = item.get("xgmi_err")
        # "XGMI_STATUS_ERROR" / "XGMI_STATUS_MULTIPLE_ERRORS"; "N/A" or "..._NO_ERRORS" is fine.
        xgmi_error = (str(xgmi) if isinstance(xgmi, str) and "ERROR" in xgmi.upper()
                      and "NO_ERROR" not in xgmi.upper() and "NO ERROR" not in xgmi.upper()
                      else None)
        found[_gpu_id(item, n)] = {
            "ecc_uncorrected": _number(ecc.get("total_uncorrectable_count")),
            "ecc_corrected": _number(ecc.get("total_correctable_count")),
            "ecc_deferred": _number(ecc.get("total_deferred_count")),
            "pcie_width": _number(pcie.get("width")),
            "xgmi_error": xgmi_error,
        }
    return found


def parse_amd_static(text):
    """{gpu: {name, bus_id, pcie_width_max}} of `amd-smi static --json`."""
    found = {}
    for n, item in enumerate(_gpu_list(text)):
        bus = item.get("bus") if isinstance(item.get("bus"), dict) else {}
        asic = item.get("asic") if isinstance(item.get("asic"), dict) else {}
        found[_gpu_id(item, n)] = {"name": asic.get("market_name"), "bus_id": bus.get("bdf"),
                                   "pcie_width_max": _number(bus.get("max_pcie_width"))}
    return found


def parse_amd_process(text):
    """{gpu: [{pid, name, used_mib}]} of `amd-smi process --json` (VRAM in bytes there)."""
    found = {}
    for n, item in enumerate(_gpu_list(text)):
        procs = []
        for entry in _list(item.get("process_list")):
            info = entry.get("process_info") if isinstance(entry, dict) else None
            if not isinstance(info, dict) or _number(info.get("pid")) is None:
                continue  # "No running processes detected"
            usage = info.get("memory_usage") if isinstance(info.get("memory_usage"), dict) else {}
            vram = _number(usage.get("vram_mem"))
            procs.append({"pid": _number(info.get("pid")), "name": info.get("name"),
                          "used_mib": None if vram is None else int(vram) >> 20})
        found[_gpu_id(item, n)] = procs
    return found


def parse_amd_bad_pages(text):
    """{gpu: pages pending retirement} of `amd-smi bad-pages --json` (status "PENDING")."""
    found = {}
    for n, item in enumerate(_gpu_list(text)):
        pages = _list(item.get("retired")) or _list(item.get("bad_pages"))
        pending = [p for p in pages if isinstance(p, dict)
                   and "PENDING" in str(p.get("status", "")).upper()]
        found[_gpu_id(item, n)] = len(pending)
    return found


def amd_gpus(metric="", static="", process="", bad_pages=""):
    """The AMD GPUs' health in parse_smi_q's shape, from whichever amd-smi outputs exist."""
    metrics, statics = parse_amd_metric(metric), parse_amd_static(static)
    procs, pending = parse_amd_process(process), parse_amd_bad_pages(bad_pages)
    gpus = []
    for gpu in sorted(set(metrics) | set(statics) | set(procs) | set(pending)):
        m, s = metrics.get(gpu, {}), statics.get(gpu, {})
        gpus.append({
            "index": gpu, "bus_id": s.get("bus_id"), "name": s.get("name"),
            "persistence": None, "ecc_enabled": None,
            "ecc_uncorrected": m.get("ecc_uncorrected"), "ecc_corrected": m.get("ecc_corrected"),
            "ecc_deferred": m.get("ecc_deferred"),
            "retired_pending": bool(pending[gpu]) if gpu in pending else None,
            "remap_pending": None, "remap_failed": None, "remap_uncorrectable": None,
            "pcie_width": m.get("pcie_width"), "pcie_width_max": s.get("pcie_width_max"),
            "pcie_gen": None, "pcie_gen_max": None, "clock_events": [],
            "fabric_state": None, "fabric_status": None,
            "processes": procs.get(gpu, []), "xgmi_error": m.get("xgmi_error"),
        })
    return gpus
