"""RDMA devices as the kernel shows them in sysfs, read without ibstat or libibverbs.

The layout is the kernel's stable ABI (Documentation/ABI/stable/sysfs-class-infiniband):
/sys/class/infiniband/<dev>/ports/<n>/{state, phys_state, rate, link_layer}, the GID table
gids/<i> with gid_attrs/types/<i> ("IB/RoCE v1", "RoCE v2") and gid_attrs/ndevs/<i> (the netdev
of a RoCE GID), and <dev>/device/net/ (the netdevs of the device's PCI function).

A file that cannot be read is kept as an error beside the device or port, never as a value:
the checks built on this (fabric.py) call such a host unknown, not passed. Imports nothing of
Ansible's: the CLI (`torchfleet fabric`) reads the same file.
"""
from __future__ import annotations

import os
import re

SYSFS = "/sys/class/infiniband"
# Bounds: a host is not expected to have more, and a stray tree must not make the probe slow.
MAX_DEVICES, MAX_PORTS, MAX_GIDS, MAX_FILE = 64, 16, 256, 4096
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
# NCCL_IB_HCA: an optional ^ (exclude) or = (exact names), then dev[:port] entries.
HCA_ENTRY = r"[A-Za-z0-9_.-]{1,64}(?::[0-9]{1,3})?"
HCA_SPEC = re.compile(r"^[\^=]?%s(?:,%s)*$" % (HCA_ENTRY, HCA_ENTRY))


class Unreadable(Exception):
    """A sysfs file that exists (or should) and could not be read."""


def is_gid_index(value):
    """An integer 0-255, as NCCL_IB_GID_INDEX takes it (a YAML bool is not one)."""
    text = str(value).strip()
    return not isinstance(value, bool) and text.isdigit() and int(text) <= 255


def _read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read(MAX_FILE).strip()
    except OSError as exc:
        raise Unreadable("cannot read %s: %s" % (path, exc.strerror or exc)) from None


def _read_optional(path):
    """The file's text, or None where the kernel gives none (an unused GID's type reads EINVAL)."""
    try:
        return _read(path)
    except Unreadable:
        return None


def _listdir(path, limit):
    try:
        return sorted(os.listdir(path))[:limit]
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise Unreadable("cannot list %s: %s" % (path, exc.strerror or exc)) from None


def _by_number(names):
    return sorted((n for n in names if n.isdigit()), key=int)


def parse_state(text):
    """"4: ACTIVE" -> "ACTIVE", "5: LinkUp" -> "LinkUp" (the name after the number)."""
    return text.partition(":")[2].strip() if ":" in text else text.strip()


def parse_rate(text):
    """"100 Gb/sec (4X EDR)" -> 100.0 (Gb/s); None when the kernel wrote no number."""
    m = re.match(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec", text)
    return float(m.group(1)) if m else None


def ipv4_of_gid(gid):
    """The IPv4 address of an IPv4-mapped GID (::ffff:a.b.c.d, as RoCE v2 IPv4 GIDs are), or
    None."""
    parts = gid.lower().split(":")
    if len(parts) != 8 or parts[:5] != ["0000"] * 5 or parts[5] != "ffff":
        return None
    try:
        hi, lo = int(parts[6], 16), int(parts[7], 16)
    except ValueError:
        return None
    return "%d.%d.%d.%d" % (hi >> 8, hi & 255, lo >> 8, lo & 255)


def read_port(path, number):
    port = {"port": int(number), "state": None, "phys_state": None, "rate": None,
            "rate_gbps": None, "link_layer": None, "gids": [], "error": None}
    try:
        port["state"] = parse_state(_read(os.path.join(path, "state")))
        port["phys_state"] = parse_state(_read(os.path.join(path, "phys_state")))
        port["rate"] = _read(os.path.join(path, "rate"))
        port["rate_gbps"] = parse_rate(port["rate"])
        # Absent on very old kernels, where every port is InfiniBand.
        port["link_layer"] = _read_optional(os.path.join(path, "link_layer")) or "InfiniBand"
        for index in _by_number(_listdir(os.path.join(path, "gids"), 100000))[:MAX_GIDS]:
            gid = _read_optional(os.path.join(path, "gids", index))
            if not gid or gid == ZERO_GID:
                continue
            port["gids"].append({
                "index": int(index), "gid": gid, "ipv4": ipv4_of_gid(gid),
                "type": _read_optional(os.path.join(path, "gid_attrs", "types", index)),
                "netdev": _read_optional(os.path.join(path, "gid_attrs", "ndevs", index))})
    except Unreadable as exc:
        port["error"] = str(exc)
    return port


def read_devices(root=SYSFS):
    """{"root", "present", "error", "devices": [{name, netdevs, ports, error}]}; present is
    False where the class directory does not exist (no RDMA stack or device). Only entries
    with a ports directory are devices: a directory of something else (a device's own
    directory, /sys/class) lists none, and says so."""
    out = {"root": root, "present": os.path.isdir(root), "error": None, "devices": []}
    if not out["present"]:
        return out
    if os.path.isdir(os.path.join(root, "ports")):
        out["error"] = ("%s is one RDMA device's directory; give the class directory above it "
                        "(%s)" % (root, SYSFS))
        return out
    try:
        names = _listdir(root, MAX_DEVICES)
    except Unreadable as exc:
        out["error"] = str(exc)
        return out
    for name in names:
        base = os.path.join(root, name)
        if not os.path.isdir(os.path.join(base, "ports")):
            continue  # not an RDMA device
        device = {"name": name, "netdevs": [], "ports": [], "error": None}
        try:
            device["netdevs"] = _listdir(os.path.join(base, "device", "net"), 64)
            for number in _by_number(_listdir(os.path.join(base, "ports"), 1000))[:MAX_PORTS]:
                device["ports"].append(read_port(os.path.join(base, "ports", number), number))
        except Unreadable as exc:
            device["error"] = str(exc)
        out["devices"].append(device)
    return out


def is_active(port):
    return port.get("state") == "ACTIVE" and port.get("phys_state") == "LinkUp"


def parse_hca_spec(text):
    """NCCL_IB_HCA as NCCL reads it: (exclude, exact, [(name, port or None)]); raises
    ValueError for anything but plain names with optional :port."""
    text = (text or "").strip()
    if not text:
        return False, False, []
    if not HCA_SPEC.match(text):
        raise ValueError(text)
    exclude, exact = text.startswith("^"), text.startswith("=")
    entries = []
    for item in text.lstrip("^=").split(","):
        name, _sep, port = item.partition(":")
        entries.append((name, int(port) if port else None))
    return exclude, exact, entries


def _matches(name, entry, exact):
    return name == entry if exact else name.startswith(entry)


def selected_ports(devices, hca=""):
    """What NCCL would consider under NCCL_IB_HCA=hca: [(device, port)], plus the entries of
    an include list that match no device or port here (named missing by rdma.down)."""
    exclude, exact, entries = parse_hca_spec(hca)
    every = [(d, p) for d in devices for p in d["ports"]]
    if not entries:
        return every, []

    def hit(d, p, entry):
        return _matches(d["name"], entry[0], exact) and entry[1] in (None, p["port"])
    if exclude:
        return [(d, p) for d, p in every if not any(hit(d, p, e) for e in entries)], []
    chosen, missing = [], []
    for entry in entries:
        found = [(d, p) for d, p in every if hit(d, p, entry)]
        if not found:
            missing.append("%s%s" % (entry[0], "" if entry[1] is None else ":%d" % entry[1]))
        chosen.extend(x for x in found if x not in chosen)
    return chosen, missing


def roce_v2_ipv4(port):
    """The indexes of a port's RoCE v2 GIDs with an IPv4 address (what NCCL_IB_GID_INDEX should
    name on a routed RoCE fabric)."""
    return [g["index"] for g in port["gids"]
            if g["ipv4"] and (g["type"] or "").strip().lower() == "roce v2"]


IB = "ib"


def port_name(device, port):
    return "%s:%d" % (device["name"], port["port"])


def host_view(facts, hca=""):
    """(ports NCCL would use, entries of nccl_ib_hca missing here, why the host is unknown or
    None) for one host's read_devices() answer (None: it was not read)."""
    if facts is None:
        return [], [], "the probe did not read RDMA devices"
    errors = [facts["error"]] if facts.get("error") else []
    errors += [d["error"] for d in facts["devices"] if d["error"]]
    errors += [p["error"] for d in facts["devices"] for p in d["ports"] if p["error"]]
    chosen, missing = selected_ports(facts["devices"], hca)
    return chosen, missing, (errors[0] if errors else None)


def choose_network(asked, views):
    """(network used, why) over {host: host_view}: `auto` is ib when every host has an active
    port NCCL would use (none unknown, no named HCA missing), else ethernet."""
    if asked != "auto":
        return asked, "asked for"
    without = [h for h, (chosen, missing, unknown) in views.items()
               if unknown or missing or not any(is_active(p) for _d, p in chosen)]
    if not views or without:
        shown = ", ".join(without[:4]) + (" and %d more" % (len(without) - 4)
                                          if len(without) > 4 else "")
        return "ethernet", "no active RDMA port NCCL would use on %s" % (shown or "any host")
    hcas = sorted({port_name(d, p) for chosen, _m, _u in views.values() for d, p in chosen
                   if is_active(p)})
    return IB, "every host has an active RDMA port (%s)" % ", ".join(hcas[:8])


def preset_env(network, hca="", gid_index="", nsocks_perthread=4, socket_nthreads=2):
    """The NCCL variables of a network preset (the launch sets them before the user's `env`)."""
    if network == IB:
        env = {"NCCL_IB_DISABLE": "0"}
        if hca:
            env["NCCL_IB_HCA"] = str(hca)
        if str(gid_index or ""):
            env["NCCL_IB_GID_INDEX"] = str(gid_index)
        return env
    if network == "ethernet":
        return {"NCCL_IB_DISABLE": "1", "NCCL_NSOCKS_PERTHREAD": str(nsocks_perthread),
                "NCCL_SOCKET_NTHREADS": str(socket_nthreads)}
    return {}
