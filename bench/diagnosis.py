"""A firewall drops the master port: how long until preflight names it, against plain torchrun."""
from __future__ import annotations


from bench.harness import (
    lab_down,
    RAW_BOUND_S,
    WORKLOADS,
    lab,
    playbook,
    raw_launch,
    stats)


def run(args, tmp):
    the_lab = lab(2)
    try:
        the_lab.block_port("node0", 29500)
        times = []
        for i in range(args.runs):
            wall, _, rc, out = playbook("preflight.yml", the_lab.inventory, "-e",
                                        "run_dir=%s/dg%d" % (tmp, i))
            assert rc != 0 and "port.blocked" in out, out[-3000:]
            times.append(wall)
        script = WORKLOADS / "collective.py"
        wall, rcs = raw_launch(the_lab, 29500, script, ["--sizes", "1K", "--iters", "1"], tmp)
        return {"preflight_names_port_blocked_s": stats(times),
                "raw_torchrun": ("> %d s (still hanging, stopped by the benchmark)" % RAW_BOUND_S
                                 if rcs is None else "ended after %.1f s with %s" % (wall, rcs))}
    finally:
        lab_down()
