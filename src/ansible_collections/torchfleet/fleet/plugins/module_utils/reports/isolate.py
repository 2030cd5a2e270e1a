"""The isolation verdict: from the pair rounds' measurements, the slow host or the slow link.

Every rank records, for each round it took part in, its exchange with its partner
(collective.py's isolate): the schedule's rounds in the first pass, and in each later pass only
what the passes before left in doubt (_pairs.next_pass, which judges them by the same rule as
here: a slow pair again, a host slow with every partner against a host shown good). Here, on
the controller:

- a pass's figure of a pair: both sides time the same exchange and the side that started
  later waited less, so the higher of the two; across local ranks (rails) the lowest busbw,
  the highest latency; any side's error makes the pass's error. The pair's figure: its best
  pass, or the error of any pass;
- the reference: each host's best pair, then the median over hosts. A slow host's best pair is
  slow but it is one host of many, and a slow link leaves both its hosts a good partner, so
  the reference holds while fewer than half the hosts are slow, with no hand-set figure;
- a pair is slow when it failed, or its busbw is below floor_gbs (when one is set), or when in
  every pass it ran it was below threshold x reference and, in the first pass, also below
  threshold x the median of its own round (when the round had other pairs): what every pair
  of a round shares (a busy fabric at that moment; on the lab, the machine's CPUs) moves a
  round's figures together and is not a fault, and a fault is there in every pass where a
  burst of load is not. A later pass's rounds hold only suspects: their median says nothing
  of the moment;
- node.slow: a host whose every pair is slow, with at least two partners (with one partner,
  host and link cannot be told apart); link.slow: a slow pair neither of whose hosts is slow.
"""
from __future__ import annotations

import statistics

from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.records import check

NODE_FIX = ("look at %s's NIC: `ethtool %s` (speed, duplex), `ethtool -S %s` (errors), and "
            "which transport NCCL chose in its rank logs (NCCL_DEBUG=INFO: NET/IB or NET/Socket)")
LINK_FIX = ("look at the path between %s and %s: the cables and switch ports of both "
            "(`ethtool -S` errors on each side), and the route each takes to the other")


def _pass_figure(rails):
    """One pass of a pair: across local ranks (rails) the lowest busbw, the highest latency
    (each rail's higher side); any side's error makes the pass's error."""
    rail_figures = []
    for recs in rails.values():
        errors = [r["error"] for r in recs if r.get("error")]
        ok = [r for r in recs if not r.get("error") and r.get("busbw_gbs") is not None]
        rail_figures.append({
            "busbw_gbs": max((r["busbw_gbs"] for r in ok), default=None),
            "latency_us": min((r["latency_us"] for r in ok), default=None),
            "error": errors[0] if errors else None})
    errors = [f["error"] for f in rail_figures if f["error"]]
    bw = [f["busbw_gbs"] for f in rail_figures if f["busbw_gbs"] is not None]
    lat = [f["latency_us"] for f in rail_figures if f["latency_us"] is not None]
    return {"busbw_gbs": min(bw) if bw and not errors else None,
            "latency_us": max(lat) if lat and not errors else None,
            "error": errors[0] if errors else None,
            "round": next(iter(rails.values()))[0]["round"]}


def pair_figures(results):
    """{(node_a, node_b): {busbw_gbs, latency_us, error, round, passes}} from every rank's
    records: each pass's figure (passes), and the pair's: its best pass (the round it ran in),
    or the error of any pass."""
    sides = {}
    for result in results:
        for rec in (result.get("isolate") or {}).get("pairs", []):
            a, b = sorted((rec["node"], rec["peer_node"]))
            sides.setdefault((a, b), {}).setdefault(rec.get("pass", 0), {}).setdefault(
                result.get("local_rank", 0), []).append(rec)
    figures = {}
    for key, passes in sorted(sides.items()):
        measured = [dict(_pass_figure(rails), **{"pass": number})
                    for number, rails in sorted(passes.items())]
        errors = [m["error"] for m in measured if m["error"]]
        ok = [m for m in measured if m["busbw_gbs"] is not None]
        best = max(ok, key=lambda m: m["busbw_gbs"], default=measured[0])
        figures[key] = {"busbw_gbs": None if errors else best["busbw_gbs"],
                        "latency_us": None if errors else min(
                            (m["latency_us"] for m in ok), default=None),
                        "error": errors[0] if errors else None,
                        "round": best["round"], "passes": measured}
    return figures


def verdict(results, hosts, threshold=0.5, floor_gbs=0.0, nics=None):
    """{pairs, reference_gbs, threshold, slow_nodes, slow_links, schedule, rounds, checks}
    or None when no rank ran the pair rounds. hosts: the run's hosts by node rank."""
    runs = [r["isolate"] for r in results if r.get("isolate")]
    if not runs:
        return None
    nics = nics or {}
    figures = pair_figures(results)

    def name(node):
        return hosts[node] if 0 <= node < len(hosts) else "node %d" % node

    partners = {}
    for (a, b), f in figures.items():
        partners.setdefault(a, []).append((b, f))
        partners.setdefault(b, []).append((a, f))
    bests = [max(f["busbw_gbs"] for _partner, f in ps if f["busbw_gbs"] is not None)
             for ps in partners.values() if any(f["busbw_gbs"] is not None for _partner, f in ps)]
    reference = statistics.median(bests) if bests else None
    rounds = {}
    for f in figures.values():
        for m in f["passes"]:
            if m["busbw_gbs"] is not None and m["pass"] == 0:
                rounds.setdefault(m["round"], []).append(m["busbw_gbs"])

    def below_reference(m):
        bw, mates = m["busbw_gbs"], rounds.get(m["round"], []) if m["pass"] == 0 else []
        return (bw is not None and reference is not None and bw < threshold * reference
                and (len(mates) < 2 or bw < threshold * statistics.median(mates)))

    # A host fast in a later pass (against a host shown good) was slow in the screen for a
    # moment of its own: its screen pairs that no later pass ran again (collective_pair_passes
    # ran out) are unsettled, not slow links.
    cleared = {node for pair, f in figures.items() for m in f["passes"] for node in pair
               if m["pass"] > 0 and m["busbw_gbs"] is not None and not below_reference(m)}
    for (a, b), f in figures.items():
        below_floor = f["busbw_gbs"] is not None and f["busbw_gbs"] < floor_gbs
        f["slow"] = (bool(f["error"]) or below_floor
                     or all(below_reference(m) for m in f["passes"]))
        only_screen = all(m["pass"] == 0 for m in f["passes"])
        f["unsettled"] = bool(f["slow"] and not f["error"] and not below_floor
                              and {a, b} & cleared and only_screen)
        f["slow"] = f["slow"] and not f["unsettled"]
    slow_nodes = sorted(n for n, ps in partners.items()
                        if len(ps) >= 2 and all(f["slow"] for _partner, f in ps))
    slow_links = [(a, b) for (a, b), f in figures.items()
                  if f["slow"] and a not in slow_nodes and b not in slow_nodes]

    def figure(f):
        return f["error"] or "%.3g GB/s" % f["busbw_gbs"]

    checks = []
    against = ("the median of each host's best pair %.3g GB/s, threshold %.2g x" % (
        reference, threshold)) if reference is not None else "no pair completed"
    for node in sorted(partners):
        host = name(node)
        mine = ", ".join("%s with %s" % (figure(f), name(p)) for p, f in sorted(
            partners[node], key=lambda pf: pf[0]))
        if node in slow_nodes:
            nic = nics.get(host) or "<its NIC>"
            checks.append(check("node.slow", host, False,
                                "slow with every partner: %s; %s" % (mine, against),
                                NODE_FIX % (host, nic, nic)))
        else:
            alone = "" if len(partners[node]) >= 2 else (
                " (one partner: host and link cannot be told apart; 3 or more hosts can)")
            checks.append(check("node.slow", host, True, "%s; %s%s" % (mine, against, alone),
                                ""))
    for a, b in slow_links:
        checks.append(check("link.slow", name(a), False,
                            "link %s <-> %s: %s while both are fine with other partners; %s"
                            % (name(a), name(b), figure(figures[(a, b)]), against),
                            LINK_FIX % (name(a), name(b))))
    if not slow_links:
        checks.append(check("link.slow", "controller", True,
                            "no slow link among %d pairs; %s" % (len(figures), against), ""))
    return {
        "schedule": runs[0]["schedule"], "rounds": runs[0]["rounds"],
        "passes": runs[0].get("passes", 1),
        "pass_rounds": runs[0].get("pass_rounds") or [runs[0]["rounds"]] * runs[0].get(
            "passes", 1),
        "size_bytes": runs[0]["size_bytes"], "small_bytes": runs[0]["small_bytes"],
        "time_s": max(r["time_s"] for r in runs), "threshold": threshold,
        "floor_gbs": floor_gbs, "reference_gbs": reference,
        "pairs": [dict(f, a=name(a), b=name(b)) for (a, b), f in figures.items()],
        "slow_nodes": [name(n) for n in slow_nodes],
        "slow_links": [[name(a), name(b)] for a, b in slow_links],
        "checks": checks,
    }


def text(v):
    """The verdict for the end-of-play summary: slow pairs first, then the slowest few."""
    pairs = sorted(v["pairs"], key=lambda p: (not p["slow"], p["busbw_gbs"] or 0.0))
    later = v["pass_rounds"][1:]
    passes = "no second pass"
    if later:
        plural = "s" if sum(later) > 1 else ""
        passes = "then %s round%s for the suspects" % (" + ".join(map(str, later)), plural)
    lines = ["pair rounds (%s, %d rounds, %s, %.1f s): reference %s GB/s, slow below %.2g x" % (
        v["schedule"], v["rounds"], passes, v["time_s"],
        "-" if v["reference_gbs"] is None else "%.3g" % v["reference_gbs"], v["threshold"])]
    for p in pairs[:8]:
        lines.append("  %-24s %s%s" % (
            "%s <-> %s" % (p["a"], p["b"]),
            p["error"] or "busbw %.3g GB/s  latency %.0f us" % (p["busbw_gbs"], p["latency_us"]),
            "  SLOW" if p["slow"] else ""))
    if v["slow_nodes"]:
        lines.append("node.slow: " + ", ".join(v["slow_nodes"]))
    if v["slow_links"]:
        lines.append("link.slow: " + ", ".join("%s <-> %s" % tuple(p) for p in v["slow_links"]))
    return "\n".join(lines)
