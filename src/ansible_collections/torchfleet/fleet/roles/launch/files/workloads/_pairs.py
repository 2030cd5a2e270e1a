"""Pair rounds of the isolation test: which hosts exchange with which, round by round.

Hosts are node ranks 0..n-1 (inventory order). A round is a list of disjoint pairs that run at
the same time; every host is in at most one pair of a round.

- ring (default): the ring of neighbours (i, i+1) in 2 rounds (3 when n is odd), then one chord
  round (i, i + n//2): every host meets 2 neighbours and, from 4 hosts on, a third partner
  across the ring. A host slow with every partner is the host; a pair slow while both hosts
  are fine with the others is the link. 3 rounds for an even n >= 4, 4 for an odd n >= 5;
  n = 2: 1 round, n = 3: 3 rounds. The cost does not grow with n.
- full: every pair once, by the circle method: n-1 rounds of n/2 pairs (n rounds when n is odd,
  one host sitting out each round).

The schedule is the first pass, the screen. Each later pass (next_pass) measures only what is
still in doubt, from every pass's figures so far, and none follows a clean screen:

- a suspect pair (slow in the one pass it ran, both hosts fine with someone) runs again: slow
  again, it is the link; fast, it was a burst of someone else's load;
- a suspect host (slow with every partner, all in one pass) runs against a host already shown
  good (fast with some partner), one it has not met where there is one: slow there too, in
  another pass, it is the host; fast there, its other pairs are suspects of their own;
- a host slow with every partner over two passes, a pair slow in two, a failed pair (its hosts
  sit out the rest): settled, never run again.

This is how NVIDIA's cluster readiness checks narrow a fleet (screen everyone at once, then
test the suspects against a host known good) instead of measuring every pair twice.
"""
from __future__ import annotations

import statistics

SCHEDULES = ("ring", "full")


def ring(n: int) -> list[list[tuple[int, int]]]:
    if n < 2:
        return []
    if n == 2:
        return [[(0, 1)]]
    edges = [(i, (i + 1) % n) for i in range(n)]
    rounds = [edges[0:n - 1:2], edges[1:n - 1:2]]
    if n % 2:
        rounds.append([edges[n - 1]])  # (n-1, 0): an odd ring needs a third colour
    else:
        rounds[1].append(edges[n - 1])
    if n >= 4:
        rounds.append([(i, i + n // 2) for i in range(n // 2)])
    return [sorted((min(p), max(p)) for p in r) for r in rounds if r]


def full(n: int) -> list[list[tuple[int, int]]]:
    """Circle method: fix one seat, rotate the others; a bye seat when n is odd."""
    if n < 2:
        return []
    bye = -1  # the seat of nobody when n is odd
    seats = list(range(n)) + ([bye] if n % 2 else [])
    m = len(seats)
    rounds = []
    for _round in range(m - 1):
        pairs = [(seats[i], seats[m - 1 - i]) for i in range(m // 2)]
        rounds.append(sorted((min(p), max(p)) for p in pairs if bye not in p))
        seats = [seats[0], seats[-1]] + seats[1:-1]
    return rounds


def schedule(name: str, n: int) -> list[list[tuple[int, int]]]:
    if name not in SCHEDULES:
        raise ValueError("unknown isolate schedule %r; choose %s" % (name, " or ".join(SCHEDULES)))
    return ring(n) if name == "ring" else full(n)


def pass_figures(sides):
    """{(a, b): {round, busbw_gbs, error}} of one pass from its records' sides: (a, b, rail,
    round, busbw_gbs, error) per rank that took part. Both sides time the same exchange and the
    one that started later waited less, so a rail's figure is its higher side; the pair's its
    lowest rail; any side's error is the pair's."""
    rails = {}
    for a, b, rail, k, bw, error in sides:
        rails.setdefault((min(a, b), max(a, b)), {}).setdefault(rail, []).append((k, bw, error))
    figures = {}
    for pair, by_rail in rails.items():
        recs = [r for rail in by_rail.values() for r in rail]
        errors = [e for _k, _bw, e in recs if e]
        bws = [max((bw for _k, bw, e in rail if not e and bw is not None), default=None)
               for rail in by_rail.values()]
        figures[pair] = {"round": recs[0][0], "error": errors[0] if errors else None,
                         "busbw_gbs": None if errors or None in bws else min(bws)}
    return figures


def slow_passes(passes, threshold):
    """{pair: [slow in that pass, ...] over the passes it ran}, and the failed pairs, from the
    figures of every pass so far (a list of pass_figures). The verdict's rule (reports/
    isolate.py): the reference is the median over hosts of each host's best pair; a pass of a
    pair is slow below threshold x reference and, in the first pass, below threshold x its
    round's median when the round had other pairs (what a round's pairs share is the moment's,
    not a fault; a later pass's rounds hold only suspects, whose median says nothing of it)."""
    best, rounds, failed = {}, {}, set()
    for number, figures in enumerate(passes):
        for pair, f in figures.items():
            if f["error"]:
                failed.add(pair)
            elif f["busbw_gbs"] is not None:
                if number == 0:
                    rounds.setdefault(f["round"], []).append(f["busbw_gbs"])
                for host in pair:
                    best[host] = max(best.get(host, 0.0), f["busbw_gbs"])
    reference = statistics.median(best.values()) if best else None
    slow = {}
    for number, figures in enumerate(passes):
        for pair, f in figures.items():
            bw, mates = f["busbw_gbs"], rounds.get(f["round"], []) if number == 0 else []
            if pair in failed or bw is None:
                continue
            slow.setdefault(pair, []).append(
                reference is not None and bw < threshold * reference
                and (len(mates) < 2 or bw < threshold * statistics.median(mates)))
    return slow, failed


def rounds_of(pairs):
    """Disjoint rounds, in order: each pair in the first round where neither host is busy."""
    rounds = []
    for pair in pairs:
        free = next((r for r in rounds if not set(pair) & {h for p in r for h in p}), None)
        if free is None:
            rounds.append([])
            free = rounds[-1]
        free.append(pair)
    return [sorted(r) for r in rounds]


def next_pass(passes, threshold):
    """The rounds of the next pass from every pass's figures so far (pass_figures each): the
    suspect pairs again, each suspect host against a host shown good; [] when nothing is in
    doubt (a clean screen, or everything settled)."""
    slow, failed = slow_passes(passes, threshold)
    out = {h for pair in failed for h in pair}
    ran_in = {}  # pair -> the passes it ran in
    for number, figures in enumerate(passes):
        for pair in figures:
            ran_in.setdefault(pair, []).append(number)
    partners = {}
    for pair in slow:
        a, b = pair
        partners.setdefault(a, []).append(pair)
        partners.setdefault(b, []).append(pair)
    hosts = sorted(h for h in partners if h not in out)
    good = [h for h in hosts if any(not all(slow[p]) for p in partners[h])]
    # A host slow with every partner (two at least: one cannot tell host from link).
    suspect_hosts = [h for h in hosts if h not in good and len(partners[h]) >= 2]
    unsettled = [h for h in suspect_hosts
                 if len({n for p in partners[h] for n in ran_in[p]}) < 2]
    todo, used = [], {}
    for host in unsettled:
        met = {x for p in partners[host] for x in p}
        if not good:  # nobody to test against: its pairs again
            todo += [p for p in partners[host] if len(slow[p]) < 2 and p not in todo]
            continue
        g = min(good, key=lambda x: (x in met, used.get(x, 0), x))
        used[g] = used.get(g, 0) + 1
        todo.append((min(host, g), max(host, g)))
    todo += sorted(p for p, s in slow.items() if all(s) and len(s) < 2 and p not in todo
                   and not set(p) & (set(suspect_hosts) | out))
    return rounds_of(todo)
