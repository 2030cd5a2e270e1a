"""preflight with spares against without, healthy and with the first host down."""
from __future__ import annotations

import statistics

from bench.harness import lab, lab_down, playbook, stats

CASES = (("nnodes8", []), ("spares2", ["-e", "spares=2"]),
         ("spares2_master_down", ["-e", "spares=2"]))


def run(args, tmp):
    """preflight.yml with nnodes=8 spares=2 (10 hosts checked) against nnodes=8 alone, on one
    10-host lab, healthy and with the first host unreachable (found before any probe: the one
    port round is against the second); the three side by side in every run, each from the
    same start (no SSH connection kept open by the one before: heal closes them)."""
    the_lab = lab(10)
    times = {name: [] for name, _ in CASES}
    cpus = {name: [] for name, _ in CASES}
    try:
        for i in range(args.runs):
            for name, extra in CASES:
                down = name.endswith("_master_down")
                the_lab.heal()
                if down:
                    the_lab.unreachable("node0")
                wall, cpu, rc, out = playbook("preflight.yml", the_lab.inventory, "-e", "nnodes=8",
                                            *extra, "-e", "run_dir=%s/sp-%s-%d" % (tmp, name, i))
                assert rc == 0 and (not down or "not used: node0 (host.unreachable)" in out), \
                    out[-3000:]
                times[name].append(wall)
                cpus[name].append(cpu)
    finally:
        lab_down()
    base = statistics.median(times["nnodes8"])
    return {name: {"preflight_s": stats(v), "controller_cpu_s": stats(cpus[name]),
                   "ratio": statistics.median(v) / base,
                   "ratio_min": min(v) / max(times["nnodes8"]),
                   "ratio_max": max(v) / min(times["nnodes8"])} for name, v in times.items()}
