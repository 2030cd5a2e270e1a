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
"""
from __future__ import annotations

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
