"""Parser for `nvidia-smi --query-gpu=... --format=csv,noheader,nounits`."""
from __future__ import annotations

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
        })
    return gpus
