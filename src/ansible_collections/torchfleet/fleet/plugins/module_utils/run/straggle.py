"""Stragglers: the rank or the host every other rank waits for, from the Flight Recorder every
rank already keeps, without touching the training script.

At each collective every rank waits inside it for the last one to arrive:

- with NCCL and TORCH_NCCL_ENABLE_TIMING=1 each entry's duration_ms is measured on the GPU by
  CUDA events: the straggler's is the shortest, and the others waited the difference. No clock
  is shared between hosts. (time_created_ns is when the CPU enqueued the collective, ahead of
  the GPU: not the signal there.)
- with gloo the collective runs in the calling thread: time_created_ns is when the rank called
  it (on its host's wall clock), and the last to call is the straggler. Hosts' times are
  compared on the master's clock only, through offsets the master measured over the control
  channel (the midpoint of a round trip, uncertain by half of it): a difference within the
  two hosts' uncertainties means nothing.

Three parts, one per place they run:

- in every rank, the WATCHER of flight.py (_torchfleet_samples) writes SAMPLE_FILE beside the
  rank's logs: the newest of its collectives whose sequence number the hash below samples
  (the same on every rank: 2^-j of them, nested as j grows, and never in step with periodic
  work, as `seq % k` would be), at most defaults.STRAGGLE_SAMPLE_S apart and within
  defaults.STRAGGLE_BUDGET of its time (a dump holds the GIL);
- in each host's agent, Reader: the rows no beat carried yet, within HOST_BYTES_S a second;
- on the master, Offsets (the round trips) and Judge (what the rows say over
  straggler_window_s), owned by runstate.RunState, the run's one judge.

Collectives are matched by their group's name and sequence number: the group's name
(process_group[0] of the recorder's entry, torch's _process_group_name) is the same on every
rank, while pg_id counts the groups of one process (rank 0's pg 1 may be its tensor-parallel
group and rank 2's another). Each collective is judged among its own group's ranks.

At each collective a rank's lateness is its arrival less the median of the others'; a host's
is the median of its ranks' (the lower one: most of its ranks late) less the median of the
other hosts'. A rank or host is a straggler when the others wait for it on average: the mean
of its latenesses, less the two sides' uncertainties at each (a gloo host's clock offset is
the same error at every collective), is above zero at odds below ALPHA were it no later than
the others (a z test of the paired latenesses, the bound shared among every rank and host
judged; with two hosts either is the later half the time, and the mean is what the run
loses), and the mean lateness is at least straggler_threshold of the interval between
collectives: each lateness a share of its own group's interval (its mean spacing) (a tensor-parallel group
at a collective a millisecond and a data-parallel group at one in 50 ms each weigh it against
their own rate; one interval for all made 0.3 ms at each data-parallel collective "30 % of the
run's time"). The mean, not the median or a share of times late: a host whose CPU is capped
(CFS bandwidth throttling: it runs its quota of each 100 ms, then stops) is late, by tens of
ms, only at the collective that straddles its stop, one in three at tens of collectives a
second, and with the others in between (tests/fixtures/straggle/); the others waited for it
21 % of the time, its median lateness was 0. One long stall is no straggler: k equal stalls
among n give z = sqrt(k), so the effect must be spread over the bound's z squared collectives
or more (about 14 at 4 hosts of one rank), and the z test lowers a rank's largest WINSOR of
latenesses to the next (one stall neither makes the mean nor, by its spread, hides the rest).
Rare, large lateness needs many collectives: a window of 256 sampled ones named the recorded
capped host in every window, 128 in a third, 64 in none; a judgement reads JUDGE_KEYS of each
group, JUDGE_ARRIVALS in all (at 512 hosts of 8 ranks: 32 of one group, where only a host
late at most collectives is named).

Once named (CONFIRM judgements in a row), one stays named while its z passes KEEP_ALPHA and
its mean lateness the threshold: a capped host's recorder dumps and agent are capped too, its
rows come late or thinned, and a window of fewer complete collectives gives the same lateness
a lower z (in the lab at 58 collectives a second, 64 instead of 200: z 3.8 against ALPHA's
3.7, and a named host went unnamed for 25 s). A window with too few of its collectives to
judge it holds it, a window at most; a restart (straggler_action) is only on a window that
judged it.

Periodic work on one rank (logging, a checkpoint every N steps) makes it late at 1 collective
in N, by as much as the work takes: the run waits for it, but the work is the rank's (rank 0
logs wherever it runs), and a spare host would inherit it. So the lateness must hold outside
any period: the collectives whose sequence number is one residue mod N (PERIOD_MIN <= N <=
PERIOD_MAX) that holds PERIODIC_SHARE of its lateness or more (the most beyond an even share)
are set aside, and the rest must pass both bounds alone. Throttling is not periodic in collectives, or not for long (its 100 ms period
against steps whose length varies): in the recording one residue held at most 39 % of the
capped host's lateness (mod 4), and 62 % mod 2, hence PERIOD_MIN (a step's own collectives).
A period of more than PERIOD_MAX collectives leaves too few late ones among a window's samples
to pass the z bound. Periodic work that costs the run its time is still set aside: it is the
training script's to fix, not a host's. A slow host is named with all its ranks.

Point-to-point sends and receives are not judged: gloo's recorder holds none, and NCCL's give a
send and its receive nothing in common to match them by (between_hosts()). A run whose
collectives stay within each host (pipeline stages across hosts, no data-parallel group across
them) has its hosts compared at none: the record says so (`blind`), and status and the verdict
with it, rather than a silence that reads as "no straggler".

Only the standard library, defaults.py and flight.py: it runs inside the agent on every host.
"""
from __future__ import annotations

import json
import math
import os
import statistics

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.flight import rank_key

SAMPLE_FILE = "fr_sample.json"
SAMPLE_MAX = 128         # rows a rank writes at once (a 10 s sample at ~13 rows a second)
FILE_MAX = 16 << 10      # ... 128 rows of the longest group names and numbers: 10 KiB
ROW_BYTES = 48           # a row as a beat carries it, about: what HOST_BYTES_S counts
HOST_BYTES_S = 4096      # a host's straggler rows to the master, bytes a second at most (8
#                          ranks: ~10 rows a second each, ~300 sampled collectives a 30 s window)
HOST_BURST = 48 << 10    # ... saved up at most this much (8 ranks' rows of one sample)
PG_MAX = 16
SEQ_MAX = 1 << 62
DURATION_MAX_MS = 1e7
WINSOR = 1 / 64          # the share of a rank's largest latenesses the z test lowers to the next
ALPHA = 1e-3             # the odds of naming anybody in a healthy window, a judgement at most
MIN_COLLECTIVES = 16     # complete sampled collectives a rank or host was in before it is named
PERIOD_MIN, PERIOD_MAX = 4, 128  # periodic work of a period of so many collectives is set
PERIODIC_SHARE = 0.75    # aside: one residue mod the period holding this share of its lateness
CONFIRM = 2              # judgements in a row that name a straggler before it is said
KEEP_ALPHA = 0.025       # a named one stays named while its z passes this one-sided level
KEYS_MAX = 1 << 16       # sampled collectives the master keeps (what it holds is bounded by
#                          the hosts' byte budget over a window; this bounds the keys alone)
GROUP_KEYS = 512         # ... of one group at most: a group's oldest go first, never another
#                          group's (a tensor-parallel group per host, 512 of them, filled a
#                          run-wide oldest-first bound before a data-parallel collective's rows
#                          from every host came: no host was tallied from 128 hosts up)
JUDGE_KEYS = 256         # the newest complete ones of each group a judgement reads (rare, large
#                          lateness needs them: 40-64 found a capped host in 3-28 % of windows)
JUDGE_ARRIVALS = 1 << 17  # ... and their ranks' arrivals at most (its cost at 4096 ranks: 32
#                          collectives of the default group, ~1.5 s of the master's CPU)
SERIES_RANKS = 4         # ranks of each collective whose clocks give the interval
STRAGGLERS_MAX = 16      # stragglers the record keeps
OFFSETS_KEPT = 6         # round trips per host; the tightest counts
NCCL_UNCERTAINTY_MS = 0.05  # GPU event timing
CALL_FLOOR_MS = 0.25     # gloo: a clock offset is never known better than this
ENV_SAMPLE = "TORCHFLEET_FR_SAMPLE"  # the WATCHER's "period,budget,rows" (unset: no sampling)


def rank_env(entries):
    """The ranks' environment for stragglers with a Flight Recorder of `entries` (0: none):
    each rank samples its recorder, and NCCL times its collectives on the GPU (about 15 us
    more per collective, measured on an H200; the user's TORCH_NCCL_ENABLE_TIMING=0 wins, and
    NCCL's stragglers are then not watched)."""
    if not entries:
        return {}
    return {ENV_SAMPLE: "%g,%g,%d" % (defaults.STRAGGLE_SAMPLE_S, defaults.STRAGGLE_BUDGET,
                                      SAMPLE_MAX), "TORCH_NCCL_ENABLE_TIMING": "1"}


def sampled(seq, j):
    """Whether collective `seq` is one of the 2^-j sampled (Fibonacci hashing: its top j bits;
    the rank's WATCHER has its own copy of this line)."""
    return j <= 0 or ((seq * 2654435761) & 0xFFFFFFFF) >> (32 - j) == 0


# -- the agent ---------------------------------------------------------------------------------

def _row(value):
    """A row [group, seq, time_created_ns, duration_ms or -1] checked, or None."""
    if not (isinstance(value, list) and len(value) == 4):
        return None
    pg, seq, t_ns, dur = value
    if not (isinstance(pg, str) and 0 < len(pg) <= PG_MAX) or not _int(seq, SEQ_MAX) \
            or not _int(t_ns, 1 << 63):
        return None
    # (NaN fails the range's comparisons.)
    if isinstance(dur, bool) or not isinstance(dur, (int, float)) \
            or not -1 <= dur < DURATION_MAX_MS:
        return None
    return [pg, seq, t_ns, float(dur) if dur >= 0 else -1.0]


def _int(value, limit):
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < limit


class Reader:
    """This host's ranks' sampled rows not sent yet, from each rank's SAMPLE_FILE, within the
    host's byte budget, shared among its ranks (the newest rows count: older ones the budget
    cannot carry now are dropped)."""

    def __init__(self):
        self.sent = {}      # (rank, group) -> newest seq sent
        self.budget = float(HOST_BURST)
        self.at = None
        self.untimed = False  # a rank's NCCL collectives completed without a duration

    def take(self, dirs, now_m):
        """{rank (str): [row, ...]} for a beat (dirs: {local rank: log directory})."""
        if self.at is not None:
            self.budget = min(HOST_BURST, self.budget + (now_m - self.at) * HOST_BYTES_S)
        self.at = now_m
        fresh = {}
        for rdir in dirs.values():
            data = _read(os.path.join(rdir, SAMPLE_FILE))
            rank = data.get("rank") if isinstance(data, dict) else None
            if not _int(rank, 1 << 20) or not isinstance(data.get("rows"), list):
                continue
            self.untimed = self.untimed or data.get("untimed") is True
            rows = [r for r in (_row(v) for v in data["rows"][:SAMPLE_MAX]) if r is not None
                    and r[1] > self.sent.get((rank, r[0]), -1)]
            if rows:
                fresh[rank] = rows
        out = {}
        share = int(self.budget // ROW_BYTES) // max(1, len(fresh))
        for rank, rows in sorted(fresh.items()):
            rows = rows[-share:] if share else []
            for r in rows:
                self.sent[(rank, r[0])] = max(self.sent.get((rank, r[0]), -1), r[1])
            if rows:
                out[str(rank)] = rows
                self.budget -= ROW_BYTES * len(rows)
        return out


def _read(path):
    try:
        with open(path, "rb") as f:
            raw = f.read(FILE_MAX + 1)
        return json.loads(raw) if len(raw) <= FILE_MAX else None
    except (OSError, ValueError, RecursionError):
        return None


# -- the master --------------------------------------------------------------------------------

def clean(rows, ranks):
    """A beat's rows {rank: [row, ...]} for the host's own `ranks` only, each row checked;
    anything else (another host's ranks, garbage) dropped."""
    if not isinstance(rows, dict):
        return {}
    out = {}
    for key, value in list(rows.items())[:len(ranks)]:
        rank = rank_key(key, ranks)
        if rank is None or not isinstance(value, list):
            continue
        kept = [r for r in (_row(v) for v in value[:SAMPLE_MAX]) if r is not None]
        if kept:
            out[rank] = kept
    return out


class Offsets:
    """Each host's wall clock against the master's, from round trips over the control channel:
    the master sends its time (ping), the host answers at once with its own (pong). offset =
    host − master at the trip's midpoint, uncertain by half the trip; the tightest of the last
    OFFSETS_KEPT counts (a host's clock that steps is followed within as many pings)."""

    def __init__(self):
        self.pending = {}   # host -> the ping sent, awaiting its pong
        self.last = {}      # host -> when the last ping went
        self.kept = {}      # host -> [(uncertainty_s, offset_s), ...]

    def ping(self, host, now):
        """The value to send `host` now, or None when one went less than PING_S ago."""
        if now - self.last.get(host, float("-inf")) < defaults.PING_S:
            return None
        self.last[host] = self.pending[host] = now
        return now

    def pong(self, host, echo, at, now):
        """A host's answer: echo must be the ping it was sent (once), at its clock then."""
        # (echo None: a ping's value that was no number, never one this master sent)
        if echo is None or self.pending.get(host) != echo or not isinstance(at, float) \
                or not math.isfinite(at):
            return
        del self.pending[host]
        if now >= echo:
            self.measured(host, at - (echo + now) / 2.0, (now - echo) / 2.0)

    def measured(self, host, offset_s, uncertainty_s):
        kept = self.kept.setdefault(host, [])
        kept.append((uncertainty_s, offset_s))
        del kept[:-OFFSETS_KEPT]

    def best(self, host):
        """(offset_s, uncertainty_s) or None before the first round trip."""
        kept = self.kept.get(host)
        if not kept:
            return None
        unc, off = min(kept)
        return off, unc


class Judge:
    """The stragglers of a run, from the rows its hosts sent, over window_s."""

    def __init__(self, hosts, window_s, threshold, watched=True):
        self.hosts = hosts            # {host: (first rank, last rank)}
        self.host_of = {}
        for host, (first, last) in hosts.items():
            for r in range(first, last + 1):
                self.host_of[r] = host
        self.window_s, self.threshold = float(window_s), float(threshold)
        self.watched = watched
        self.offsets = Offsets()
        # (group, seq) -> {"seen": t, "r": {rank: (its own clock's ms, duration_ms or None,
        # (call ms on the master's clock, uncertainty ms) or None before a round trip)}}
        self.keys = {}
        self.order = {}               # group -> {seq: None}, its keys oldest first
        self.size = {}                # group -> most ranks seen at one of its collectives
        self.found = {}               # (host, ranks) -> straggler, as record() shows it
        self.signal = ""              # "durations" (NCCL) or "calls" (gloo), once seen
        self.untimed = []             # hosts whose NCCL collectives are not timed
        self.blind = ""               # why hosts cannot be compared (between_hosts()), or ""
        self.complete = 0             # complete collectives in the window at the last judge
        self.next_judge = 0.0
        self.first_data = None        # when the first sampled collective came
        self.streak = {}              # (host, ranks) -> (first judgement, judgements in a row)

    def add(self, host, now, rows):
        """A host's checked rows (clean()): each kept on the master's clock."""
        offset = self.offsets.best(host)
        for rank, found in rows.items():
            for pg, seq, t_ns, dur in found:
                key = self.keys.get((pg, seq))
                if key is None:
                    mine = self.order.setdefault(pg, {})
                    if len(mine) >= GROUP_KEYS:  # this group's oldest
                        self._forget((pg, next(iter(mine))))
                    if len(self.keys) >= KEYS_MAX:  # the first kept, about the oldest
                        self._forget(next(iter(self.keys)))
                    key = self.keys[(pg, seq)] = {"seen": now, "r": {}}
                    self.order.setdefault(pg, {})[seq] = None
                local_ms = t_ns / 1e6
                call = None if offset is None else (local_ms - offset[0] * 1e3,
                                                    max(offset[1] * 1e3, CALL_FLOOR_MS))
                key["r"][rank] = (local_ms, dur if dur >= 0 else None, call)
                self.size[pg] = max(self.size.get(pg, 0), len(key["r"]))

    def _forget(self, key):
        self.keys.pop(key, None)
        mine = self.order.get(key[0])
        if mine is not None:
            mine.pop(key[1], None)
            if not mine:
                del self.order[key[0]]

    def due(self, now):
        if now < self.next_judge:
            return False
        self.next_judge = now + defaults.STRAGGLE_EVAL_S
        return True

    def judge(self, now):
        """Judge the window ending now; returns the stragglers named (their record entries)."""
        for k in [k for k, v in self.keys.items() if now - v["seen"] > self.window_s]:
            self._forget(k)
        live = {pg for pg, _seq in self.keys}
        self.size = {pg: n for pg, n in self.size.items() if pg in live}
        figures = window(self.keys, self.size, self.host_of)
        self.complete, self.signal = figures["complete"], figures["signal"] or self.signal
        if self.first_data is None and self.keys:
            self.first_data = now
        # Nobody is named before a whole window was sampled (a run's first seconds: ranks
        # still warming up), nor on one judgement alone (a passing stall of one host).
        full = self.first_data is not None and now - self.first_data >= self.window_s
        if full and figures["complete"] >= MIN_COLLECTIVES:  # (a thin window says nothing)
            self.blind = between_hosts(figures, len(self.hosts))
        held = {k: s for k, s in self.found.items() if s["active"]}
        named = name(figures, self.host_of, self.hosts, self.threshold, held) if full else []
        # A named one the window has too few collectives of to judge (rows of its ranks
        # late or thinned out: a capped host's agent is capped too) stays named, up to a
        # window after it was last judged one: an absence of evidence clears nothing.
        said = {(s["host"], tuple(s["ranks"])) for s in named}
        named += [{k: s[k] for k in (*ENTRY, "last_seen")} for k, s in held.items()
                  if k not in said
                  and now - s["last_seen"] <= self.window_s and not judgeable(figures, k)]
        streak = {}
        for s in named:
            key = (s["host"], tuple(s["ranks"]))
            since, count = self.streak.get(key, (now, 0))
            streak[key] = (since, count + 1)
        self.streak = streak
        for s in self.found.values():
            s["active"] = False
        for s in named:
            key = (s["host"], tuple(s["ranks"]))
            since, count = streak[key]
            old = self.found.get(key)
            if count < CONFIRM or old is None and len(self.found) >= STRAGGLERS_MAX:
                continue
            if old is None:
                old = self.found[key] = dict(s, first_seen=since, since=since)
            elif not old["was_active"]:
                old["since"] = since
            old.update({"last_seen": now, **s}, active=True)  # (a hold keeps its own)
        for s in self.found.values():
            s["was_active"] = s["active"]
        return [s for s in self.found.values() if s["active"]]

    def stayed(self, now):
        """The first straggler named without a break for window_s and judged one at `now`
        (not held for want of collectives: a restart is never on a window without them), or
        None."""
        return next((s for s in self.found.values() if s["active"] and s["last_seen"] >= now
                     and now - s["since"] >= self.window_s), None)

    def record(self):
        """(stragglers, straggle) as the record keeps them."""
        out = [{k: s[k] for k in ("host", "ranks", "share_last", "late_ms_median",
                                  "late_ms_mean", "interval_ms", "first_seen", "last_seen",
                                  "active")}
               for s in self.found.values()]
        return out, {"watched": self.watched, "signal": self.signal,
                     "collectives": self.complete, "window_s": self.window_s,
                     "untimed": self.untimed, "blind": self.blind}

    def not_timed(self, host):
        """A host said its ranks' NCCL collectives complete without a duration (the user's
        TORCH_NCCL_ENABLE_TIMING=0): they cannot be judged."""
        if host in self.hosts and host not in self.untimed and len(self.untimed) < 64:
            self.untimed.append(host)


def window(keys, size, host_of):
    """What a window's complete collectives say (the newest of each group, JUDGE_ARRIVALS
    arrivals at most: a busy group does not crowd out the others): per rank and per host, its
    lateness against the others (their median) at each, and beyond the uncertainties, with
    the interval of that collective's own group (the mean spacing of its collectives over the window,
    each rank's on its own clock): a tensor-parallel group at a collective a millisecond and
    a data-parallel one at one in 50 ms each weigh a lateness against their own rate (one
    interval for all, the busiest group's, made 0.3 ms at each data-parallel collective
    "30 % of the run's time"). A group without two of its collectives in the window has no
    interval, and its lateness is not tallied. `across`: the collectives that spanned two
    hosts or more (hosts are compared at those only)."""
    groups = {}
    for (pg, seq), v in keys.items():
        if len(v["r"]) >= max(2, size.get(pg, 0)):
            groups.setdefault(pg, []).append((seq, v["r"]))
    per_rank, per_host = {}, {}
    complete, across, signal = 0, 0, ""
    series = {}
    for pg, seq, ranks in _newest(groups):
        for rank in sorted(ranks)[:SERIES_RANKS]:
            series.setdefault((rank, pg), []).append((seq, ranks[rank][0]))
        if all(d is not None for _t, d, _c in ranks.values()):
            arrive = {r: (-d, NCCL_UNCERTAINTY_MS) for r, (_t, d, _c) in ranks.items()}
            signal = "durations"
        elif all(c is not None for _t, _d, c in ranks.values()):
            arrive = {r: c for r, (_t, _d, c) in ranks.items()}
            signal = signal or "calls"
        else:
            continue
        complete += 1
        across += _lateness((pg, seq), arrive, host_of, per_rank, per_host)
    # Each group's interval: its ranks' mean spacing over the window (first to last sampled
    # collective), the median over its ranks. Not the median gap between two collectives:
    # data-parallel all-reduces come in bursts (gradient buckets a millisecond apart once a
    # step), where that median is the spacing inside a burst and a host 0.3 ms late at each
    # bucket of a 500 ms step was named as costing 30 % of the run (the review's repro).
    spans = {}
    for (_rank, pg), points in series.items():
        points.sort()
        (s1, t1), (s2, t2) = points[0], points[-1]
        if s2 > s1 and t2 >= t1:
            spans.setdefault(pg, []).append((t2 - t1) / (s2 - s1))
    intervals = {pg: statistics.median(g) for pg, g in spans.items() if g}
    intervals = {pg: ms for pg, ms in intervals.items() if ms > 0}
    for tallies in (per_rank, per_host):
        for who, t in list(tallies.items()):
            t = [(late, beyond, seq, intervals[pg]) for late, beyond, (pg, seq) in t
                 if pg in intervals]
            if t:
                tallies[who] = t
            else:
                del tallies[who]
    return {"complete": complete, "across": across, "signal": signal, "rank": per_rank,
            "host": per_host, "intervals": intervals}


def _newest(groups):
    """(group, seq, ranks) of each group's newest complete collectives, JUDGE_KEYS a group at
    most, taken in rounds (every group's newest, then every group's second newest, ...) until
    JUDGE_ARRIVALS arrivals."""
    for found in groups.values():
        found.sort(key=lambda kv: kv[0], reverse=True)
    out, arrivals = [], 0
    for i in range(JUDGE_KEYS):
        more = False
        for pg in sorted(groups):
            found = groups[pg]
            if i < len(found):
                more = True
                if arrivals + len(found[i][1]) > JUDGE_ARRIVALS:
                    return out
                arrivals += len(found[i][1])
                out.append((pg, found[i][0], found[i][1]))
        if not more:
            break
    return out


def _lateness(key, arrive, host_of, per_rank, per_host):
    """Tally one collective (key: (group, seq)): each rank's arrival against the median of
    the others'; each host's (the lower median of its ranks': a host is late when most of its
    ranks are) against the median of the other hosts'. Late when by more than the
    uncertainties of the two sides (a gloo host's clock offset is uncertain by half a round
    trip, the same error at every collective: as if it were all lateness). Tallies:
    [(lateness, lateness less the uncertainties, key), ...]. Returns whether it spanned two
    hosts or more."""
    items = sorted([(t, u, r) for r, (t, u) in arrive.items()])
    mid = sorted([x[1] for x in items])[len(items) // 2]
    _against_others(key, items, mid, per_rank)
    at = {}
    for i, (_t, _u, r) in enumerate(items):
        at.setdefault(host_of.get(r), []).append(i)
    if len(at) < 2:
        return False  # one host's group: its ranks are compared, the host with nobody
    _against_others(key, sorted(items[pos[(len(pos) - 1) // 2]][:2] + (host,)
                                for host, pos in at.items()), mid, per_host)
    return True


def _against_others(key, values, mid, tallies):
    """Each of values ([(time, uncertainty, who)], sorted by time) against the median of the
    others' times, tallied for who: (lateness, lateness less its and the others' (mid)
    uncertainties, key)."""
    ts = [v[0] for v in values]
    n = len(ts)
    lo, hi = (n - 2) // 2, (n - 1) // 2  # the median of the others: ts[lo], ts[hi] without i
    for i, (t, u, who) in enumerate(values):
        late = t - ((ts[lo] if lo < i else ts[lo + 1]) + (ts[hi] if hi < i else ts[hi + 1])) / 2.0
        tally = tallies.get(who)
        if tally is None:
            tally = tallies[who] = []
        tally.append((late, late - u - mid, key))


def z_score(values):
    """The mean of `values` over its standard error (0 for fewer than 2 or none above 0), its
    largest WINSOR share (one at least) lowered to the next: one long stall neither makes the
    mean nor, by its spread, hides the rest."""
    n = len(values)
    if n < 2:
        return 0.0
    top = max(1, int(n * WINSOR))
    values = sorted(values)
    values[n - top:] = [values[n - top - 1]] * top
    mean = math.fsum(values) / n
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    if var <= 0.0:
        return math.inf if mean > 0 else 0.0
    return mean / math.sqrt(var / n)


def aperiodic(values, seqs):
    """The indices of `values` outside the residue mod N (PERIOD_MIN <= N <= PERIOD_MAX) of the seqs
    that holds the most of their positive part beyond its even share (1/N), when it holds
    PERIODIC_SHARE of it or more: periodic work set aside (else all of them)."""
    total = math.fsum(v for v in values if v > 0)
    best, where = 0.0, None
    if total > 0:
        for period in range(PERIOD_MIN, PERIOD_MAX + 1):
            sums = {}
            for v, seq in zip(values, seqs, strict=True):
                if v > 0:
                    sums[seq % period] = sums.get(seq % period, 0.0) + v
            residue, most = max(sums.items(), key=lambda kv: kv[1])
            if most - total / period > best and most >= PERIODIC_SHARE * total:
                best, where = most - total / period, (period, residue)
    return [i for i, seq in enumerate(seqs) if where is None or seq % where[0] != where[1]]


def judgeable(figures, key):
    """Whether a window's figures hold enough collectives of `key` ((host, ranks): a host
    with all its ranks, or one rank) to judge it."""
    host, ranks = key
    t = figures["rank"].get(ranks[0]) if len(ranks) == 1 else figures["host"].get(host)
    return figures["complete"] >= MIN_COLLECTIVES and t is not None \
        and len(t) >= MIN_COLLECTIVES


def name(figures, host_of, hosts, threshold, held=()):
    """The stragglers of a window's figures: a slow host with all its ranks, else ranks.

    Each lateness counts as a share of its own group's interval (window()): one is named when
    its mean share beyond the uncertainties is above zero at odds below ALPHA (shared among
    every rank and host judged: a z test of the paired latenesses), its mean share at least
    straggler_threshold, and both hold outside its periodic work (aperiodic()). One named already (`held`: (host, ranks) keys) stays
    named at odds below KEEP_ALPHA: its lateness is known, and a window thinner than the one
    that named it (fewer sampled collectives, a lower z for the same lateness) does not
    clear it, while a host back in step (its mean lateness under the threshold) is cleared."""
    if figures["complete"] < MIN_COLLECTIVES:
        return []
    judged = max(1, len(figures["rank"]) + len(figures["host"]))
    z_new = statistics.NormalDist().inv_cdf(1.0 - ALPHA / judged)
    z_kept = statistics.NormalDist().inv_cdf(1.0 - KEEP_ALPHA)

    def straggles(t, key):
        n = len(t)
        if n < MIN_COLLECTIVES:
            return False
        shares = [late / ms for late, _b, _s, ms in t]
        if math.fsum(shares) < threshold * n:
            return False
        z_min = min(z_new, z_kept) if key in held else z_new
        beyond, seqs = [b / ms for _l, b, _s, ms in t], [seq for _l, _b, seq, _ms in t]
        if z_score(beyond) < z_min:
            return False
        keep = aperiodic(beyond, seqs)
        return len(keep) >= MIN_COLLECTIVES and z_score([beyond[i] for i in keep]) >= z_min \
            and math.fsum(shares[i] for i in keep) >= threshold * len(keep)

    out, said = [], set()
    for host, t in sorted(figures["host"].items(), key=lambda kv: str(kv[0])):
        first, last = hosts.get(host, (0, -1))
        if host in hosts and straggles(t, (host, tuple(range(first, last + 1)))):
            out.append(_entry(host, list(range(first, last + 1)), t))
            said.add(host)
    for rank, t in sorted(figures["rank"].items()):
        if host_of.get(rank) in hosts and host_of[rank] not in said \
                and straggles(t, (host_of[rank], (rank,))):
            out.append(_entry(host_of[rank], [rank], t))
    return out


ENTRY = ("host", "ranks", "share_last", "late_ms_median", "late_ms_mean", "interval_ms")


def _entry(host, ranks, t):
    """A straggler's record entry. interval_ms: the interval its mean lateness is a share of,
    that share being the mean of each lateness over its own group's interval (one group's:
    that group's mean interval; a rank late in a tensor-parallel group and in a
    data-parallel one weighs each by its own), so that late_ms_mean / interval_ms is what
    words() says it costs."""
    waits = [x[0] for x in t]
    mean, share = math.fsum(waits) / len(t), math.fsum(x[0] / x[3] for x in t) / len(t)
    interval = mean / share if mean > 0 and share > 0 else statistics.median(x[3] for x in t)
    return {"host": host, "ranks": ranks,
            "share_last": round(sum(x[1] > 0 for x in t) / len(t), 3),
            "late_ms_median": round(statistics.median(waits), 3),
            "late_ms_mean": round(mean, 3), "interval_ms": round(interval, 3)}


def span(ranks):
    return "rank %d" % ranks[0] if len(ranks) == 1 else "ranks %d-%d" % (ranks[0], ranks[-1])


def words(s):
    """A straggler in one sentence: who, how long the others wait for it on average and what
    share of the run's time that is (a record without the mean, from before: how often it was
    late and the median wait)."""
    mean, interval = _num(s.get("late_ms_mean")), _num(s.get("interval_ms"))
    if mean is not None:
        return "%s (%s): the others wait %.1f ms for it on average%s" % (
            s["host"], span(s["ranks"]), mean,
            ", about %.0f %% of the run's time" % (100 * min(1.0, max(0.0, mean / interval)))
            if interval else "")
    cost = s["share_last"] * s["late_ms_median"] / interval if interval else None
    return "%s (%s): later than the others at %.0f %% of collectives, the others wait %.0f ms " \
        "(median) for it%s" % (
            s["host"], span(s["ranks"]), 100 * s["share_last"], s["late_ms_median"],
            ": about %.0f %% of the run's time" % (100 * min(1.0, cost)) if cost is not None
            else "")


def _num(value):
    # (NaN fails the comparison.)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and abs(value) < 1e15 else None


BLIND = "blind between hosts: %d of the window's %d sampled collectives spanned two hosts " \
    "(%d needed): only point-to-point sends and receives cross them (pipeline stages), which " \
    "are not judged; a slow host or stage is not named"


def between_hosts(figures, hosts_n):
    """Why a window's figures cannot compare hosts (BLIND), or '' when they can: a run of two
    hosts or more whose collectives stay within a host (tensor-parallel groups per host,
    pipeline stages across them, no data-parallel group across them). What crosses the hosts
    then is point-to-point, and is not judged: gloo's recorder holds no send or receive
    (torch 2.13, tests/fixtures/flight/README.md), and NCCL's entries give a send and its
    receive nothing in common (p2p_seq_id counts one process's sends and receives in the
    group; torch's analyzer matches them by their order over whole recordings, which a sampled
    ring that wraps between samples does not keep)."""
    across, complete = figures["across"], figures["complete"]
    if hosts_n < 2 or across >= MIN_COLLECTIVES:
        return ""
    return BLIND % (across, complete, MIN_COLLECTIVES)


def blind(watch):
    """Why hosts are not compared, from a record's `straggle`, in words ([] when they are)."""
    said = watch.get("blind")
    return [said[:300]] if isinstance(said, str) and said else []


def unwatched(watch):
    """Why stragglers are not watched, from a record's `straggle`, in words ([] when they are)."""
    if watch.get("watched") is False:
        return ["not watched: the Flight Recorder is off (flight_recorder=0)"]
    untimed = [h for h in watch.get("untimed") or [] if isinstance(h, str)][:8]
    if untimed and watch.get("signal") != "durations":
        return ["not watched on %s: its NCCL collectives are not timed "
                "(TORCH_NCCL_ENABLE_TIMING=0 in env; leave it unset)" % ", ".join(untimed)]
    return []


def read(value):
    """A record's `stragglers` as read from another host: only well-formed entries, bounded
    (what status, the progress and the report show)."""
    out = []
    for s in value[:STRAGGLERS_MAX] if isinstance(value, list) else []:
        if not isinstance(s, dict) or not isinstance(s.get("host"), str):
            continue
        ranks = s.get("ranks")
        keys = ("share_last", "late_ms_median", "late_ms_mean", "interval_ms", "first_seen",
                "last_seen")
        nums = {k: _num(s.get(k)) for k in keys}
        if not (isinstance(ranks, list) and 0 < len(ranks) <= 4096 and all(
                isinstance(r, int) and not isinstance(r, bool) for r in ranks)) \
                or None in (nums["share_last"], nums["late_ms_median"]):
            continue
        out.append(dict(nums, host=s["host"][:255], ranks=ranks, active=s.get("active") is True))
    return out
