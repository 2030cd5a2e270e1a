"""The fleet's ledger at fleet scale (issue 60: <= 50 ms for the write at a run's end, <= 200 ms
for `torchfleet hosts`), on both engines: SQLite in a file, and a real PostgreSQL server on
loopback (lab/pg.py, fsync on).

The ledger is filled through record_run itself: 512 hosts, 1,000 runs each of all 512 (the
worst case for the runs count: 512,000 participations), a third of them failed by one host
(culprit, lost, now and then a fatal Xid), a hardware warning in every tenth, an hour apart.
Then, per engine, each of `runs` times: record_run of a new failed 512-host run (a fresh run id:
the write a run's end pays), health() of its 512 hosts (what preflight asks), and hosts() with
its table (what `torchfleet hosts` computes; the process's own start is not the ledger's).

Alone: python -m bench.ledger [--runs 5] [--hosts 512] [--fill 1000].
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import ledger
from bench.harness import stats
from lab import pg
from torchfleet import hosts_cli

T0 = 1_800_000_000.0
GOALS_MS = {"record_run_ms": 50.0, "hosts_ms": 200.0}


def report(i, hosts, rng):
    """A train.json of run i: every host; one in three failed by one host."""
    culprit = rng.choice(hosts) if i % 3 == 0 else None
    out = {"run_id": "bench-%06d" % i, "kind": "train", "ok": culprit is None,
           "hosts": [{"host": h, "outcome": "lost" if h == culprit else
                      "stopped" if culprit else "succeeded"} for h in hosts],
           "checks": [], "hardware": []}
    if culprit:
        out["first_failure"] = {"host": culprit, "failure": "lost", "consequence": False}
        if i % 9 == 0:
            out["hardware"].append({"host": culprit, "kind": "xid", "code": 79, "fatal": True})
    if i % 10 == 0:
        out["hardware"].append({"host": rng.choice(hosts), "kind": "aer", "code": "corrected",
                                "fatal": False})
    return out


def listing(fleet, at):
    """What `torchfleet hosts` computes: the hosts and their table."""
    listed = fleet.hosts(now=at)
    hosts_cli.hosts_text(listed, fleet.where, None)
    return listed


def measure(fleet_db, nhosts, nfill, runs):
    rng = random.Random(60)
    hosts = ["gpu%04d" % i for i in range(nhosts)]
    fleet = ledger.Fleet(fleet_db, "")
    began = time.perf_counter()
    for i in range(nfill):
        fleet.record_run(report(i, hosts, rng), now=T0 + i * 3600.0)
    fill_s = time.perf_counter() - began
    assert not fleet.warnings, fleet.warnings
    at = T0 + nfill * 3600.0
    wall = {"record_run_ms": [], "health_ms": [], "hosts_ms": []}
    cpu = {name: [] for name in wall}

    def timed(name, call, *args):
        t, c = time.perf_counter(), time.process_time()
        out = call(*args)
        wall[name].append((time.perf_counter() - t) * 1000)
        cpu[name].append((time.process_time() - c) * 1000)
        return out

    for k in range(runs):
        one = report(3 * (nfill + k), hosts, rng)  # a failed one
        timed("record_run_ms", fleet.record_run, one, at + k)
        timed("health_ms", fleet.health, hosts, at + k)
        listed = timed("hosts_ms", listing, fleet, at + k)
    assert not fleet.warnings and len(listed) == nhosts, fleet.warnings
    assert sum(h["runs"] for h in listed) == nhosts * (nfill + runs)
    fleet.close()
    # What the file grows by (docs/ledger.md "What it costs"): SQLite's file, its WAL
    # checkpointed by the close, per 1,000 runs of the fill.
    size = os.path.getsize(fleet_db) if not fleet_db.startswith("postgresql") else None
    # cpu: this process's (SQLite's work is in it; PostgreSQL's server's is not).
    return {**{name: stats(v) for name, v in wall.items()},
            **{name.replace("_ms", "_cpu_ms"): stats(v) for name, v in cpu.items()},
            "fill_s": fill_s, "fill_record_run_ms": fill_s * 1000 / nfill,
            "hosts": nhosts, "filled_runs": nfill,
            "file_mb_per_1000_runs": None if size is None else round(
                size / 1e6 * 1000 / (nfill + runs), 2),
            "goals_met": all(statistics.median(wall[name]) <= goal
                             for name, goal in GOALS_MS.items())}


def run(args, tmp):
    nhosts = getattr(args, "ledger_hosts", 512)
    nfill = getattr(args, "ledger_fill", 1000)
    out = {"sqlite": measure(str(Path(tmp) / "bench-fleet.db"), nhosts, nfill, args.runs)}
    with pg.server(fsync=True) as server:
        out["postgresql"] = measure(server.create_database("bench"), nhosts, nfill, args.runs)
    return out


def main():
    parser = argparse.ArgumentParser(prog="python -m bench.ledger", description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--hosts", dest="ledger_hosts", type=int, default=512)
    parser.add_argument("--fill", dest="ledger_fill", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="torchfleet-bench-") as tmp:
        print(json.dumps(run(args, tmp), indent=2))


if __name__ == "__main__":
    main()
