"""preflight with spares against without, healthy and with the first host down."""
from __future__ import annotations

import statistics

from bench.harness import lab, lab_down, playbook, stats


def run(args, tmp):
    """preflight.yml with nnodes=8 spares=2 (10 hosts checked) against nnodes=8 alone, side by
    side on one 10-host lab; and with the first host unreachable, where the chosen hosts' ports
    are tested again against the new master."""
    the_lab = lab(10)
    times = {"nnodes8": [], "spares2": [], "spares2_master_down": []}
    try:
        for i in range(args.runs):
            for name, extra in (("nnodes8", []), ("spares2", ["-e", "spares=2"])):
                wall, _, rc, out = playbook("preflight.yml", the_lab.inventory, "-e", "nnodes=8",
                                            *extra, "-e", "run_dir=%s/sp-%s-%d" % (tmp, name, i))
                assert rc == 0, out[-3000:]
                times[name].append(wall)
        the_lab.unreachable("node0")
        for i in range(args.runs):
            wall, _, rc, out = playbook("preflight.yml", the_lab.inventory, "-e", "nnodes=8",
                                        "-e", "spares=2", "-e", "run_dir=%s/sp-down-%d" % (tmp, i))
            assert rc == 0 and "not used: node0 (host.unreachable)" in out, out[-3000:]
            times["spares2_master_down"].append(wall)
    finally:
        lab_down()
    base = statistics.median(times["nnodes8"])
    return {name: {"preflight_s": stats(v), "ratio": statistics.median(v) / base,
                   "ratio_min": min(v) / max(times["nnodes8"]),
                   "ratio_max": max(v) / min(times["nnodes8"])} for name, v in times.items()}
