"""A rate-limited NIC: collective.yml's pair rounds until node.slow names it; false positives on
the clean lab. Each run's passes (the schedule's rounds, then the suspects' only) and the
machine's load (1-minute average) as it started are kept: others share the CPUs."""
from __future__ import annotations

import json
import os

from bench.harness import lab, lab_down, playbook, stats
from lab.netns import SLOW_RATE


def isolate_run(the_lab, n, tmp, name):
    """(wall seconds, the isolate verdict, the failed node/link checks, rc, the 1-minute load
    average as it started) of one collective.yml with the pair rounds on n lab hosts."""
    load = round(os.getloadavg()[0], 2)
    wall, _, rc, out = playbook("collective.yml", the_lab.inventory, "-e",
                                "run_dir=%s/%s" % (tmp, name), "-e", "nnodes=%d" % n, "-e",
                                "collective_isolate=true", "-e", "collective_sizes=64K", "-e",
                                "collective_iters=3")
    report = json.loads((tmp / name / "collective.json").read_text())
    named = sorted((c["id"], c["host"]) for c in report["checks"]
                   if c["id"] in ("node.slow", "link.slow") and not c["ok"])
    return wall, report["isolate"], named, rc, load


def run(args, tmp):
    """Time to name a rate-limited NIC on n lab hosts, and false positives on the clean lab."""
    n = args.isolate_size
    the_lab = lab(n)
    try:
        clean, clean_named, walls, pair_s, named_ok, passes, loads = [], 0, [], [], 0, {}, []
        for i in range(args.runs):
            wall, iso, named, rc, load = isolate_run(the_lab, n, tmp, "iso-clean%d" % i)
            clean.append(wall)
            clean_named += len(named)
            passes.setdefault("clean", []).append(iso.get("pass_rounds"))
            loads.append(load)
        slow = "node%d" % (n // 2 + 1)
        the_lab.slow_nic(slow)
        for i in range(args.runs):
            wall, iso, named, rc, load = isolate_run(the_lab, n, tmp, "iso-slow%d" % i)
            walls.append(wall)
            pair_s.append(iso["time_s"])
            named_ok += named == [("node.slow", slow)]
            passes.setdefault("slow", []).append(iso.get("pass_rounds"))
            loads.append(load)
        rounds = iso["rounds"]
        return {"hosts": n, "schedule": iso["schedule"], "rounds": rounds,
                "rate": SLOW_RATE, "pair_size_bytes": iso["size_bytes"],
                "clean_collective_yml_s": stats(clean), "false_positives": clean_named,
                "clean_runs": args.runs, "slow_collective_yml_s": stats(walls),
                "pair_rounds_s": stats(pair_s), "named_only_the_slow_host": named_ok,
                "slow_runs": args.runs, "pass_rounds": passes, "load1": loads}
    finally:
        lab_down()
