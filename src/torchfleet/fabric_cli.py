"""`torchfleet fabric` and `torchfleet transport`: what torchfleet sees of this host's RDMA
devices, and what NCCL used according to its logs, for people debugging by hand. Both read the
same files the playbooks use (plugins/module_utils/host/rdma.py, nccl_log.py)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ansible_collections.torchfleet.fleet.plugins.module_utils.host import nccl_log, rdma

def fabric_view(sysfs: str, hca: str = "", gid_index: str = "") -> dict[str, Any]:
    """This host's devices and what `network: auto` would choose here, with the preset's
    variables (fabric.choose_network / preset_env decide; this only asks them)."""
    facts = rdma.read_devices(sysfs)
    network, why = rdma.choose_network("auto", {"this host": rdma.host_view(facts, hca)})
    env = rdma.preset_env(network, hca, gid_index)
    return {"sysfs": facts, "auto": {"network": network, "why": why, "nccl_env": env}}


def fabric_text(view: dict[str, Any]) -> str:
    facts = view["sysfs"]
    lines = ["RDMA devices under %s:" % facts["root"]]
    if not facts["present"]:
        lines.append("  none (the directory does not exist: no RDMA driver or device)")
    if facts["error"]:
        lines.append("  unreadable: %s" % facts["error"])
    elif facts["present"] and not facts["devices"]:
        lines.append("  none (no entry there has a ports directory)")
    for d in facts["devices"]:
        lines.append("  %s  netdevs: %s%s" % (d["name"], ", ".join(d["netdevs"]) or "-",
                                              "  (%s)" % d["error"] if d["error"] else ""))
        for p in d["ports"]:
            lines.append("    port %d: %s/%s  %s  %s%s" % (
                p["port"], p["state"], p["phys_state"], p["rate"], p["link_layer"],
                "  (%s)" % p["error"] if p["error"] else ""))
            for g in p["gids"]:
                lines.append("      gid %3d  %-40s %-12s %-15s %s" % (
                    g["index"], g["gid"], g["type"] or "-", g["ipv4"] or "-", g["netdev"] or "-"))
    auto = view["auto"]
    lines.append("network=auto would choose %s here (%s); NCCL variables: %s" % (
        auto["network"], auto["why"], " ".join("%s=%s" % kv for kv in auto["nccl_env"].items())))
    return "\n".join(lines)


def transport_view(paths: list[str]) -> dict[str, Any]:
    """Per process found in the logs, what NCCL used; and the whole as one summary."""
    procs: list[dict] = []
    for path in paths:
        for proc in nccl_log.parse(nccl_log.read_head(path)):
            proc["log"] = str(Path(path))
            procs.append(proc)
    return {"ranks": procs, "summary": nccl_log.summarize(procs)}


def transport_text(view: dict[str, Any]) -> str:
    if not view["ranks"]:
        return "no NCCL INFO lines found: run the ranks with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET"
    lines = []
    for p in view["ranks"]:
        one = nccl_log.summarize([p])
        who = "rank %s" % p["rank"] if p["rank"] is not None else "pid %d" % p["pid"]
        lines.append("%-9s %s:%d  %s" % (who, p["host"] or "?", p["pid"], nccl_log.describe(one)))
    lines.append("all: %s (NCCL %s)" % (nccl_log.describe(view["summary"]),
                                        view["summary"]["version"] or "version not printed"))
    return "\n".join(lines)


def as_json(view: dict[str, Any]) -> str:
    return json.dumps(view, indent=2)
