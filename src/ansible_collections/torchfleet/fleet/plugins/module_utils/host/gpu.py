"""The host's GPUs: NVIDIA's from `nvidia-smi --query-gpu=... --format=csv,noheader,nounits`,
AMD's from `amd-smi static --json`, `rocm-smi --json` or the kernel's KFD topology."""
from __future__ import annotations

import json

GPU_QUERY_FIELDS = ("index", "name", "uuid", "driver_version", "memory.total", "pci.bus_id")
NVIDIA_SMI_ARGV = [
    "nvidia-smi",
    "--query-gpu=" + ",".join(GPU_QUERY_FIELDS),
    "--format=csv,noheader,nounits",
]


def parse_gpu_csv(text):
    """One dict per GPU: index, name, uuid, driver_version, memory_total_mib, pci_bus_id."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(GPU_QUERY_FIELDS):
            raise ValueError("unexpected nvidia-smi line: %r" % line)
        index, name, uuid, driver, memory, bus = cells
        gpus.append({
            "index": int(index),
            "name": name,
            "uuid": uuid,
            "driver_version": driver,
            "memory_total_mib": int(memory) if memory.isdigit() else None,
            "pci_bus_id": bus,
            "vendor": "nvidia",
        })
    return gpus


# AMD GPUs, where nvidia-smi is absent: amd-smi (ROCm 6+), else rocm-smi (older ROCm), else the
# kernel's KFD topology (a GPU node has SIMDs; a CPU node has none).
AMD_SMI_ARGV = ["amd-smi", "static", "--json"]
ROCM_SMI_ARGV = ["rocm-smi", "--showproductname", "--showbus", "--showdriverversion", "--json"]
KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"
ROCM_VERSION_FILE = "/opt/rocm/.info/version"
RCCL_HEADERS = ("/opt/rocm/include/rccl/rccl.h", "/opt/rocm/include/rccl.h")


def _gpu(index, name, uuid=None, driver=None, memory_mib=None, bus=None, vendor="amd"):
    return {"index": index, "name": name, "uuid": uuid, "driver_version": driver,
            "memory_total_mib": memory_mib, "pci_bus_id": bus, "vendor": vendor}


def _mib(value):
    """{"value": 65536, "unit": "MB"} or "65536 MB" -> 65536; None otherwise."""
    if isinstance(value, dict):
        value = "%s %s" % (value.get("value"), value.get("unit", "MB"))
    parts = str(value).split()
    if not parts or not parts[0].isdigit():
        return None
    return int(parts[0]) * (1024 if len(parts) > 1 and parts[1].upper().startswith("G") else 1)


def parse_amd_smi_static(text):
    """GPUs of `amd-smi static --json`: a list of GPU objects, or (newer releases) an object
    whose "gpu_data" holds that list."""
    data = json.loads(text)
    if isinstance(data, dict):
        data = data.get("gpu_data", [])
    if not isinstance(data, list):
        raise ValueError("amd-smi static --json: not a list of GPUs")
    gpus = []
    for n, item in enumerate(data):
        if not isinstance(item, dict):
            continue
        asic, bus = item.get("asic") or {}, item.get("bus") or {}
        driver, vram = item.get("driver") or {}, item.get("vram") or {}
        gpus.append(_gpu(item.get("gpu", n) if isinstance(item.get("gpu", n), int) else n,
                         str(asic.get("market_name") or "AMD GPU"),
                         asic.get("asic_serial"), driver.get("version"),
                         _mib(vram.get("size")) if vram.get("size") is not None else None,
                         bus.get("bdf")))
    return gpus


def parse_rocm_smi_json(text):
    """GPUs of `rocm-smi --showproductname --showbus --showdriverversion --json`: one "cardN"
    object per GPU (the driver version under "system")."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("rocm-smi --json: not an object")
    driver = (data.get("system") or {}).get("Driver version")
    cards = sorted((k for k in data if k.startswith("card") and k[4:].isdigit()),
                   key=lambda k: int(k[4:]))
    gpus = []
    for key in cards:
        card = data[key] if isinstance(data[key], dict) else {}
        # Keys changed case across releases ("Card series" / "Card Series").
        lower = {str(k).lower(): v for k, v in card.items()}
        name = lower.get("card series") or lower.get("device name") or "AMD GPU"
        gpus.append(_gpu(int(key[4:]), str(name), lower.get("unique id"), driver, None,
                         lower.get("pci bus")))
    return gpus


def parse_kfd_properties(text):
    """{name: int} of a KFD topology node's properties file."""
    props = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1].lstrip("-").isdigit():
            props[fields[0]] = int(fields[1])
    return props


def kfd_gpus(read, listdir, root=KFD_NODES):
    """GPU nodes of the KFD topology (simd_count > 0), for hosts without amd-smi/rocm-smi."""
    gpus = []
    for node in sorted((n for n in listdir(root) if n.isdigit()), key=int):
        props = parse_kfd_properties(read("%s/%s/properties" % (root, node)))
        if props.get("simd_count", 0) > 0:
            gpus.append(_gpu(len(gpus), "AMD GPU (KFD node %s, gfx target %s)"
                             % (node, props.get("gfx_target_version", "?"))))
    return gpus
