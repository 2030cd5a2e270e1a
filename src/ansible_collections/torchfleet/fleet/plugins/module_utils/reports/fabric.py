"""The fabric's checks: rdma.* in preflight (from each host's sysfs, rdma.py), the choice of
`network: auto`, and nccl.transport after a run (from the ranks' NCCL INFO lines, nccl_log.py).

A host whose sysfs could not be read is unknown for rdma.* (a warning that says so), never
passed; `auto` then does not choose ib.
"""
from __future__ import annotations

from ansible_collections.torchfleet.fleet.plugins.module_utils.host import nccl_log, rdma
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.records import WARNING, check, fmt_hosts, reference

IB = rdma.IB
NO_RDMA_FIX = ("install the HCA's driver and rdma-core on {host} (ls /sys/class/infiniband "
               "should list it), or run with -e network=ethernet (or auto)")


def rdma_checks(probes, master, settings):
    """(check records, network used, why) for the reachable hosts' probes."""
    hca = settings.get("nccl_ib_hca") or ""
    views = {h: rdma.host_view(p.get("rdma"), hca) for h, p in probes.items()}
    network, why = rdma.choose_network(settings.get("network") or "none", views)
    if network != IB:
        return [], network, why
    records, rates = [], {}
    for host, probe in probes.items():
        chosen, missing, unknown = views[host]
        facts = probe.get("rdma") or {}
        if unknown:
            records.append(check("rdma.down", host, False, "unknown: %s" % unknown,
                                 "make %s readable on %s (sysfs mounted in the container?)"
                                 % (facts.get("root", rdma.SYSFS), host), WARNING))
            continue
        if not facts["devices"]:
            records.append(check("rdma.none", host, False,
                                 "network=ib but no RDMA device under %s" % facts["root"],
                                 NO_RDMA_FIX.format(host=host)))
            continue
        records.append(check("rdma.none", host, True, "%d RDMA device(s)" % len(facts["devices"])))
        down = _down(host, facts, chosen, missing, hca)
        records.append(down)
        active = [(d, p) for d, p in chosen if rdma.is_active(p)]
        if down["ok"]:  # a host named down is not compared again for its speed
            rates[host] = tuple(sorted((p["rate_gbps"] or 0.0 for _d, p in active),
                                       reverse=True))
        records.extend(_gid(host, active, settings.get("nccl_ib_gid_index")))
    records.extend(_rate(rates, views, master))
    return records, network, why


def _down(host, facts, chosen, missing, hca):
    have = ", ".join(d["name"] for d in facts["devices"])
    if missing:
        return check("rdma.down", host, False,
                     "%s named in nccl_ib_hca not here (this host has %s)"
                     % (", ".join(missing), have),
                     "set -e nccl_ib_hca to HCAs every host has, or fix the HCA on %s" % host)
    down = ["%s %s/%s" % (rdma.port_name(d, p), p["state"], p["phys_state"])
            for d, p in chosen if not rdma.is_active(p)]
    named = bool(hca) and not hca.startswith("^")
    if down and (named or len(down) == len(chosen)):
        return check("rdma.down", host, False, "port not active: %s" % ", ".join(down),
                     "bring the link up on %s (cable, switch port, subnet manager: ibstat / "
                     "ibportstate), or leave it out of nccl_ib_hca" % host)
    return check("rdma.down", host, True, "active: %s%s" % (
        ", ".join(rdma.port_name(d, p) for d, p in chosen if rdma.is_active(p)),
        "; not used by NCCL (down): %s" % ", ".join(down) if down else ""))


def _gid(host, active, gid_index):
    roce = [(d, p) for d, p in active if (p["link_layer"] or "").lower() == "ethernet"]
    if not roce:
        return []
    records = []
    for d, p in roce:
        good = rdma.roce_v2_ipv4(p)
        name = rdma.port_name(d, p)
        if gid_index in (None, ""):
            records.append(check("rdma.gid", host, True, "%s RoCE: NCCL picks the GID%s" % (
                name, " (RoCE v2 IPv4 at index %s)" % ", ".join(map(str, good)) if good else "")))
            continue
        index = int(gid_index)
        entry = next((g for g in p["gids"] if g["index"] == index), None)
        if index in good:
            records.append(check("rdma.gid", host, True, "%s GID %d is RoCE v2 %s"
                                 % (name, index, entry["ipv4"])))
            continue
        what = "empty" if entry is None else "%s %s" % (
            entry["type"] or "of unknown type", entry["ipv4"] or entry["gid"])
        fix = ("set -e nccl_ib_gid_index=%d (RoCE v2, IPv4 %s on %s)"
               % (good[0], next(g["ipv4"] for g in p["gids"] if g["index"] == good[0]), name)
               if good else "give %s's netdev an IPv4 address (no RoCE v2 IPv4 GID on %s)"
               % (name, name))
        records.append(check("rdma.gid", host, False, "%s GID index %d is %s, not RoCE v2 IPv4"
                             % (name, index, what), fix))
    return records


def _rate(rates, views, master):
    if len(rates) < 2:
        return [check("rdma.rate", h, True, "%s Gb/s" % _gbps(r)) for h, r in rates.items()]
    ref = reference(rates, master if master in rates else next(iter(rates)))
    agree = [h for h, r in rates.items() if r == ref]
    records = []
    for host, links in rates.items():
        slower = sum(links) < sum(ref) or (links and ref and links[-1] < ref[-1])
        if not slower:
            records.append(check("rdma.rate", host, True, "%s Gb/s" % _gbps(links)))
            continue
        ports = [("%s %s" % (rdma.port_name(d, p), p["rate"])) for d, p in views[host][0]
                 if rdma.is_active(p)]
        records.append(check("rdma.rate", host, False,
                             "links at %s Gb/s (%s), %s Gb/s on %s"
                             % (_gbps(links), ", ".join(ports) or "none active", _gbps(ref),
                                fmt_hosts(agree)),
                             "check the cables, transceivers and switch ports of %s (ibstat "
                             "shows each port's rate); the run goes at its slowest link's speed"
                             % host, WARNING))
    return records


def _gbps(links):
    return "+".join("%g" % r for r in links) or "0"


def transport_checks(hosts, per_host, network, expect_gdr):
    """nccl.transport per host from what its ranks' NCCL INFO lines say they used."""
    records = []
    for host in hosts:
        seen = per_host.get(host)
        if seen is None:
            records.append(check("nccl.transport", host, False,
                                 "unknown: no NCCL INFO line in the ranks' logs",
                                 "leave NCCL_DEBUG unset in `env` (torchfleet sets INFO for this "
                                 "check), and read the ranks' logs under logs/%s/" % host,
                                 WARNING))
            continue
        if network == IB and seen["socket_ranks"]:
            known = [str(r) for r in seen["socket_ranks"] if r is not None]
            unknown = len(seen["socket_ranks"]) - len(known)
            who = ", ".join(filter(None, ["rank(s) " + ", ".join(known) if known else "",
                                          "%d process(es) whose rank NCCL did not print"
                                          % unknown if unknown else ""]))
            records.append(check("nccl.transport", host, False,
                                 "%s used sockets (NET/Socket), not InfiniBand/RoCE: NCCL fell "
                                 "back to TCP" % who,
                                 "run preflight (rdma.*), check NCCL_IB_HCA and that the ranks "
                                 "see /dev/infiniband on %s; its rank logs show NCCL's reason"
                                 % host))
            continue
        if network == IB and expect_gdr and seen["gdr"] is False:
            records.append(check("nccl.transport", host, False,
                                 "RDMA without GPUDirect%s" % (
                                     ": " + ", ".join(seen["gdr_disabled"][:4])
                                     if seen["gdr_disabled"] else ""),
                                 "load nvidia-peermem (or use a DMA-BUF capable driver and "
                                 "kernel) on %s, or -e nccl_expect_gdr=false where GPUDirect is "
                                 "not wanted" % host, WARNING))
            continue
        records.append(check("nccl.transport", host, True, nccl_log.describe(seen)))
    return records
