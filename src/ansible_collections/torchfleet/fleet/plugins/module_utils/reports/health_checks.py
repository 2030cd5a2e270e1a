"""Node health's verdicts: a GPU or host that will break the run, named before launch with the
reason the vendor's tool gives. `checks` turns one host's facts (health.facts) into check records
(the registry's gpu.* and host.* ids), each naming the host, the GPU index where there is one, and
the fix; `clock_checks` compares the hosts' clocks. Runs on the controller (preflight) and in
`torchfleet health --from DIR`.
"""
from __future__ import annotations

import os

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.host import smi
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.records import ERROR, WARNING, check


def limits(values=None, rdma_in_use=True):
    """The thresholds the rules read, from the variables given (their defaults otherwise).
    `rdma_in_use`: whether NCCL will use the hosts' RDMA devices (not with the ethernet preset)."""
    values = values or {}

    def get(name, kind):
        return kind(values.get(name, defaults.default(name)))

    return {"health_ecc_corrected_max": get("health_ecc_corrected_max", int),
            "health_disk_min_gb": get("health_disk_min_gb", float), "rdma_in_use": rdma_in_use}


THROTTLE_OK = ("Idle", "SW Power Cap")  # clocks lowered on purpose, not a fault
FABRIC_OK = (("Completed", "Success"),)


def _gpu_check(cid, host, gpu, ok, detail, hint, severity=ERROR):
    return check(cid, host, ok, detail, hint, severity, gpu)


def _name(gpu):
    return "GPU %s%s" % (gpu["index"], " (%s)" % gpu["bus_id"] if gpu.get("bus_id") else "")


def gpu_checks(host, f, limits):
    """gpu.* records of one host's facts."""
    records = []
    failed = f.get("smi_failed")
    if failed:
        rc = failed.get("rc")
        meaning = smi.smi_exit_meaning(rc) if rc is not None else "it did not answer in time"
        records.append(check("gpu.smi", host, False,
                             "nvidia-smi failed: %s%s" % (meaning, " (%s)" % failed["error"]
                                                          if failed.get("error") else ""),
                             "reload the NVIDIA driver or reset/replace the GPU (rc 15: a GPU "
                             "fell off the bus; 14: InfoROM corrupted; 9/12: driver or NVML "
                             "missing); drain %s until nvidia-smi answers" % host))
        return records
    gpus = f.get("gpus") or []
    if not gpus:
        # No GPU tool's output (a kernel log saved alone): an Xid line is itself proof of an
        # NVIDIA GPU, judged by its PCI address as with nvidia-smi's output.
        return records + (xid_checks(host, f, gpus) if f.get("xids") else [])
    records.append(check("gpu.smi", host, True, "%s answered for %d GPU(s)" % (
        "nvidia-smi" if f.get("vendor") == "nvidia" else "amd-smi", len(gpus))))
    ecc_max = limits["health_ecc_corrected_max"]
    for g in gpus:
        name = _name(g)
        if g.get("ecc_uncorrected"):
            records.append(_gpu_check("gpu.ecc", host, g["index"], False,
                                      "%s: %d uncorrected ECC error(s) since the driver loaded"
                                      % (name, g["ecc_uncorrected"]),
                                      "drain %s and reset GPU %s (nvidia-smi -r -i %s); replace "
                                      "it if they return" % (host, g["index"], g["index"])))
        elif g.get("ecc_corrected") is not None and g["ecc_corrected"] > ecc_max:
            records.append(_gpu_check("gpu.ecc", host, g["index"], False,
                                      "%s: %d corrected ECC errors (threshold %d)"
                                      % (name, g["ecc_corrected"], ecc_max),
                                      "watch GPU %s; a rising count precedes row remapping "
                                      "and replacement" % g["index"], WARNING))
        if g.get("ecc_deferred"):
            records.append(_gpu_check("gpu.ecc", host, g["index"], False,
                                      "%s: %d deferred ECC error(s)" % (name, g["ecc_deferred"]),
                                      "drain %s and reset GPU %s (amd-smi reset -G -g %s)"
                                      % (host, g["index"], g["index"])))
        if g.get("remap_failed"):
            records.append(_gpu_check("gpu.remap", host, g["index"], False,
                                      "%s: row remapping failed" % name,
                                      "replace GPU %s: its memory has no spare rows left"
                                      % g["index"]))
        elif g.get("remap_pending"):
            records.append(_gpu_check("gpu.remap", host, g["index"], False,
                                      "%s: row remapping pending (%s uncorrectable)"
                                      % (name, g.get("remap_uncorrectable")),
                                      "reset GPU %s (nvidia-smi -r -i %s, or reboot %s) so the "
                                      "remap takes effect" % (g["index"], g["index"], host)))
        if g.get("retired_pending"):
            records.append(_gpu_check("gpu.retired_pages", host, g["index"], False,
                                      "%s: pages pending retirement" % name,
                                      "reset GPU %s or reboot %s to retire them"
                                      % (g["index"], host)))
        if g.get("pcie_width") and g.get("pcie_width_max") and g["pcie_width"] < g["pcie_width_max"]:
            records.append(_gpu_check("gpu.pcie", host, g["index"], False,
                                      "%s at PCIe x%d, capable of x%d"
                                      % (name, g["pcie_width"], g["pcie_width_max"]),
                                      "reseat GPU %s or its riser on %s; check the slot's "
                                      "lanes in the BIOS" % (g["index"], host)))
        if g.get("nvlink_inactive"):
            records.append(_gpu_check("gpu.nvlink", host, g["index"], False,
                                      "%s: NVLink %s inactive" % (name, ", ".join(
                                          str(n) for n in g["nvlink_inactive"])),
                                      "reset the GPU or reboot %s; a link that stays down is "
                                      "a hardware fault (nvidia-smi nvlink -e -i %s)"
                                      % (host, g["index"])))
        if g.get("xgmi_error"):
            records.append(_gpu_check("gpu.xgmi", host, g["index"], False,
                                      "%s: XGMI %s" % (name, g["xgmi_error"]),
                                      "amd-smi xgmi -e; reset the GPUs or reboot %s" % host))
        bad = [r for r in g.get("clock_events") or [] if r not in THROTTLE_OK]
        if bad:
            records.append(_gpu_check("gpu.throttle", host, g["index"], False,
                                      "%s: clocks held down by %s" % (name, ", ".join(bad)),
                                      "check cooling and power of %s (HW/thermal slowdown), or "
                                      "the application clocks set on it" % host, WARNING))
        foreign = [p for p in g.get("processes") or [] if (p.get("type") or "C") != "G"]
        if foreign:
            records.append(_gpu_check("gpu.busy", host, g["index"], False,
                                      "%s held by %s" % (name, ", ".join(
                                          "pid %s (%s, user %s, %s MiB)" % (
                                              p["pid"], os.path.basename(p.get("name") or "?"),
                                              p.get("user", "?"), p.get("used_mib"))
                                          for p in foreign[:4])),
                                      "stop those processes on %s (ansible-playbook stop.yml "
                                      "if an earlier run; else kill them) or use other hosts"
                                      % host))
        if g.get("persistence") is False:
            records.append(_gpu_check("gpu.persistence", host, g["index"], False,
                                      "%s: persistence mode off (every start loads the "
                                      "driver's state again)" % name,
                                      "nvidia-smi -pm 1 on %s, or enable nvidia-persistenced"
                                      % host, WARNING))
        if g.get("fabric_state") and (g["fabric_state"], g.get("fabric_status")) not in FABRIC_OK:
            records.append(_gpu_check("gpu.fabric", host, g["index"], False,
                                      "%s: NVSwitch fabric %s / %s (CUDA fails with error 802, "
                                      "system not yet initialized)" % (
                                          name, g["fabric_state"], g.get("fabric_status")),
                                      "start nvidia-fabricmanager on %s (systemctl start "
                                      "nvidia-fabricmanager; its version must match the "
                                      "driver)" % host))
    nvswitch = any(g.get("fabric_state") for g in gpus)
    manager = f.get("fabricmanager")
    if nvswitch and manager not in (None, "unknown", "active"):
        records.append(check("gpu.fabric", host, False,
                             "nvidia-fabricmanager is %s on an NVSwitch system" % manager,
                             "systemctl enable --now nvidia-fabricmanager on %s" % host))
    records.extend(xid_checks(host, f, gpus))
    if f.get("vendor") == "nvidia" and f.get("rdma") and f.get("peermem") is False:
        records.append(check("gpu.peermem", host, False,
                             "RDMA devices and NVIDIA GPUs, but nvidia_peermem is not loaded: "
                             "NCCL cannot use GPUDirect RDMA",
                             "modprobe nvidia_peermem on %s (and add it to /etc/modules-load.d)"
                             % host, WARNING))
    for cid in ("gpu.ecc", "gpu.remap", "gpu.pcie", "gpu.busy"):
        if not any(r["id"] == cid for r in records):
            records.append(check(cid, host, True, "%d GPU(s) fine" % len(gpus)))
    return records


def xid_checks(host, f, gpus):
    window = f.get("xid_window_s")
    if f.get("kernel_log") != "read":
        if f.get("vendor") != "nvidia" or not f.get("kernel_log"):
            return []
        return [check("gpu.xid", host, False,
                      "the kernel log cannot be read by this user (%s): Xids not checked"
                      % f["kernel_log"],
                      "sysctl kernel.dmesg_restrict=0 on %s, or add the run's user to group "
                      "adm / systemd-journal" % host, WARNING)]
    by_bus = {str(g.get("bus_id") or "").lower()[-12:-2]: g["index"] for g in gpus}
    grouped = {}
    for event in f.get("xids") or []:
        key = (event["pci"], event["code"])
        grouped.setdefault(key, dict(event, count=0))["count"] += 1
    records = []
    for (pci, code), event in sorted(grouped.items()):
        index = by_bus.get(pci[-10:])
        where = "GPU %s (PCI %s)" % (index, pci) if index is not None else "PCI %s" % pci
        detail = "Xid %d on %s, %d time(s) in the last %s: %s (%s)" % (
            code, where, event["count"], _span(window), event["meaning"], event["message"][:120])
        if event["kind"] == "drain":
            records.append(_gpu_check("gpu.xid", host, index, False, detail,
                                      "drain %s and reset or replace %s (NVIDIA's Xid catalog "
                                      "names the action for Xid %d)" % (host, where, code)))
        else:
            records.append(_gpu_check("gpu.xid", host, index, False, detail,
                                      "an application-level error: the program that caused it "
                                      "may be at fault, not the GPU" if event["kind"] ==
                                      "application" else "look Xid %d up in NVIDIA's Xid "
                                      "catalog" % code, WARNING))
    if not records:
        records.append(check("gpu.xid", host, True, "no Xid in the last %s" % _span(window)))
    return records


def _span(seconds):
    seconds = int(seconds or 0)
    return "%d h" % (seconds // 3600) if seconds % 3600 == 0 and seconds else "%d s" % seconds


def host_checks(host, f, limits):
    """host.memlock and host.disk of one host's facts."""
    records = []
    memlock = f.get("memlock_kib")
    if f.get("rdma") and memlock is not None and limits.get("rdma_in_use", True):
        records.append(check("host.memlock", host, memlock == -1,
                             "ulimit -l is %s" % ("unlimited" if memlock == -1 else
                                                  "%d KiB" % memlock),
                             "set memlock unlimited for the run's user on %s (limits.conf: "
                             "`* - memlock unlimited`; docker --ulimit memlock=-1): RDMA "
                             "registers GPU and host memory" % host))
    floor = float(limits["health_disk_min_gb"]) * (1 << 30)
    for disk in f.get("disk") or []:
        records.append(check("host.disk", host, disk["free_bytes"] >= floor,
                             "%s: %.1f GiB free on the filesystem of %s (need %g GiB)" % (
                                 disk["path"], disk["free_bytes"] / (1 << 30), disk["mount"],
                                 float(limits["health_disk_min_gb"])),
                             "free space on %s of %s, or point remote_runs_root / "
                             "train_checkpoint_dir elsewhere" % (disk["mount"], host)))
    return records


def checks(host, f, limits):
    """Every health record of one host (the cross-host ones are clock_checks and perf's)."""
    return gpu_checks(host, f, limits) + host_checks(host, f, limits)


def clock_checks(offsets, master, max_s):
    """host.clock: each host's clock against the one most hosts share. `offsets`:
    {host: {offset_s, uncertainty_s}} measured against the master's clock by the port test
    (the master at 0); a host is off only when its distance from the median is larger than
    max_s plus its measurement's uncertainty."""
    known = {h: o for h, o in offsets.items() if o}
    if len(known) < 2:
        return []
    values = sorted(o["offset_s"] for o in known.values())
    median = values[len(values) // 2]
    records = []
    for host, o in known.items():
        off = o["offset_s"] - median
        ok = abs(off) - o["uncertainty_s"] <= max_s
        records.append(check("host.clock", host, ok,
                             "clock %+.2f s from the fleet's (±%.2f s)" % (off, o["uncertainty_s"]),
                             "sync %s's clock (chronyc tracking / timedatectl; enable chrony or "
                             "systemd-timesyncd)" % host))
    return records
