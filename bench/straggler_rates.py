"""How often the straggler judge names somebody in a healthy run (false positives) and names a
slow host (detection), over arrival jitter, at 2, 4, 8 and 64 hosts of 8 ranks: runs simulated
here and judged by the real straggle.window() and straggle.name() (issue 57).

A simulated window: WINDOW collectives of the default group (what a judgement reads:
straggle.JUDGE_KEYS), one every INTERVAL_MS; each rank arrives at its collective with its own
Gaussian jitter (standard deviation `jitter_ms`, drawn anew at every collective); a slow host's
ranks all arrive SLOW_SHARE of the interval later on average, either at every collective
("uniform") or, as a host whose CPU is capped (CFS throttling, tests/fixtures/straggle/), at
one collective in THROTTLED_EVERY, drawn at random, by up to twice the interval ("throttled":
rare and large, the same mean). Both signals the judge reads:

- "durations" (NCCL, TORCH_NCCL_ENABLE_TIMING=1): each rank's GPU-timed duration is the last
  arrival less its own, plus the transfer (KERNEL_MS); its time_created on its own clock;
- "calls" (gloo): each rank's call time on the master's clock through its host's measured
  offset, whose error is drawn once a window within its uncertainty (OFFSET_UNC_MS: half a
  round trip on a LAN), the judge's floor (straggle.CALL_FLOOR_MS) applying.

A window is one judgement (straggle.CONFIRM asks two in a row before anything is said: the
figures here are before that). The judge's threshold is straggler_threshold's default (0.05:
the slow host's 10 % is twice it). No lab, no root: minutes on one core.
"""
from __future__ import annotations

import random
import time

from ansible_collections.torchfleet.fleet.plugins.module_utils.run import straggle

INTERVAL_MS = 20.0
SLOW_SHARE = 0.10
THRESHOLD = 0.05
WINDOW = straggle.JUDGE_KEYS
THROTTLED_EVERY = 10
KERNEL_MS = 0.2
OFFSET_UNC_MS = 0.3
PER_HOST = 8
HOSTS = (2, 4, 8, 64)
JITTER_MS = (0.5, 1.0, 2.0, 3.0, 4.0)


def simulate(hosts_n, jitter_ms, slow, signal, rnd, per_host=PER_HOST, window=WINDOW):
    """One simulated window judged: the stragglers name() gives ([] or [entry, ...]); slow:
    False, True or "uniform" (host n1 SLOW_SHARE of the interval late at every collective) or
    "throttled" (at one in THROTTLED_EVERY, at random, by up to 2 x SLOW_SHARE x
    THROTTLED_EVERY of the interval: the same mean)."""
    hosts = {"n%d" % h: (h * per_host, h * per_host + per_host - 1) for h in range(hosts_n)}
    host_of = {r: h for h, (a, b) in hosts.items() for r in range(a, b + 1)}
    ranks = sorted(host_of)
    late = {r: (SLOW_SHARE * INTERVAL_MS if slow and host_of[r] == "n1" else 0.0) for r in ranks}
    clock = {h: rnd.uniform(-5e3, 5e3) for h in hosts}  # each host's wall clock against the master's
    error = {h: rnd.uniform(-OFFSET_UNC_MS, OFFSET_UNC_MS) for h in hosts}
    unc = max(OFFSET_UNC_MS, straggle.CALL_FLOOR_MS)
    gauss = rnd.gauss
    keys = {}
    for c in range(window):
        base = 1e9 + c * INTERVAL_MS
        if slow == "throttled":
            stop = rnd.random() * 2 * SLOW_SHARE * THROTTLED_EVERY * INTERVAL_MS \
                if rnd.random() < 1.0 / THROTTLED_EVERY else 0.0
            arrive = {r: base + (stop if late[r] else 0.0) + gauss(0.0, jitter_ms) for r in ranks}
        else:
            arrive = {r: base + late[r] + gauss(0.0, jitter_ms) for r in ranks}
        if signal == "durations":
            last = max(arrive.values())
            row = {r: (a + clock[host_of[r]], last - a + KERNEL_MS, None)
                   for r, a in arrive.items()}
        else:
            row = {r: (a + clock[host_of[r]], None, (a + error[host_of[r]], unc))
                   for r, a in arrive.items()}
        keys[("0", c + 1)] = {"seen": 0.0, "r": row}
    figures = straggle.window(keys, {"0": len(ranks)}, host_of)
    return straggle.name(figures, host_of, hosts, THRESHOLD)


def rates(hosts_n, jitter_ms, signal, windows, seed=0):
    """(windows of a healthy run naming anybody, windows of a run with n1 slow naming n1 with
    all its ranks, the same with n1 throttled), each out of `windows`."""
    rnd = random.Random("%d-%g-%s-%d" % (hosts_n, jitter_ms, signal, seed))
    false = sum(bool(simulate(hosts_n, jitter_ms, False, signal, rnd)) for _ in range(windows))
    found = [sum(any(s["host"] == "n1" and len(s["ranks"]) == PER_HOST
                     for s in simulate(hosts_n, jitter_ms, kind, signal, rnd))
                 for _ in range(windows)) for kind in ("uniform", "throttled")]
    return false, found[0], found[1]


def judge_cost(hosts_n=512, per_host=8, repeat=3):
    """Seconds one Judge.judge() takes on the master at hosts_n x per_host ranks with a window
    full of the default group's collectives (every rank's rows of 300 of them): the least of
    `repeat`."""
    hosts = {"n%d" % h: (h * per_host, h * per_host + per_host - 1) for h in range(hosts_n)}
    rnd = random.Random(1)
    took = []
    for _ in range(repeat):
        j = straggle.Judge(hosts, 30.0, THRESHOLD)
        for h, (a, b) in hosts.items():
            j.offsets.measured(h, 0.0, 0.0002)
            j.add(h, 100.0, {r: [["0", s, 10**18 + s * 20_000_000 + int(rnd.random() * 1e6), -1.0]
                                 for s in range(1, 300)] for r in range(a, b + 1)})
        j.first_data = 50.0
        began = time.perf_counter()
        j.judge(100.0)
        took.append(time.perf_counter() - began)
    return round(min(took), 3)


def run(args, tmp):
    """Per signal, hosts and jitter: false positives and detections (uniform, throttled), each
    out of `windows` (100; 40 at 64 hosts); and what a judgement costs the master at 512 hosts
    x 8 ranks."""
    del tmp
    windows = 100 if args.runs >= 3 else 50
    out = {"interval_ms": INTERVAL_MS, "slow_ms": SLOW_SHARE * INTERVAL_MS,
           "threshold": THRESHOLD, "ranks_per_host": PER_HOST, "collectives": WINDOW,
           "throttled_every": THROTTLED_EVERY,
           "windows": windows, "rates": []}
    began = time.perf_counter()
    for signal in ("durations", "calls"):
        for hosts_n in HOSTS:
            n = windows if hosts_n <= 8 else windows * 2 // 5  # 64 x 8: its minutes
            for jitter in JITTER_MS:
                false, found, throttled = rates(hosts_n, jitter, signal, n)
                out["rates"].append({"signal": signal, "hosts": hosts_n, "jitter_ms": jitter,
                                     "windows": n, "false": false, "found": found,
                                     "found_throttled": throttled})
                print("  %s %d hosts, jitter %g ms: %d false, %d found, %d throttled found of "
                      "%d" % (signal, hosts_n, jitter, false, found, throttled, n), flush=True)
    out["seconds"] = round(time.perf_counter() - began, 1)
    out["judge_s_512x8"] = judge_cost()
    return out
