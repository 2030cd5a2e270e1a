"""A run whose control port is flooded by outsiders against the same run not flooded."""
from __future__ import annotations

import json
import statistics

from bench.harness import lab, lab_down, playbook, stats
from lab.ports import free_port


def run(args, tmp):
    """train.yml on n lab hosts with its control port flooded (garbage lines and idle
    connections from this machine, bench/fuzz_control.Flood) against the same run unflooded,
    alternating; the flooder's own CPU is on the same 2 CPUs, so it is rate-limited."""
    from bench.fuzz_control import Flood

    n = args.flood_size
    the_lab = lab(n)
    try:
        clean, flooded, sent, refused = [], [], [], []
        for i in range(args.runs):
            for flood_on in (False, True):
                port = free_port()
                flood = Flood(the_lab.node("node0").address, port, rate_hz=args.flood_rate)
                if flood_on:
                    flood.start()
                run_dir = tmp / ("flood%d-%d-%d" % (n, i, flood_on))
                wall, _, rc, out = playbook(
                    "train.yml", the_lab.inventory, "-e", "nnodes=%d" % n, "-e",
                    "train_steps=%d" % args.flood_steps, "-e", "control_port=%d" % port,
                    "-e", "run_dir=%s" % run_dir)
                flood.done.set()
                if flood_on:
                    flood.join(30)
                    sent.append(flood.sent)
                    state = json.loads((run_dir / "run_state.json").read_text())
                    refused.append(sum(state["channel"]["refused"].values()))
                assert rc == 0, out[-3000:]
                (flooded if flood_on else clean).append(wall)
        return {"hosts": n, "train_steps": args.flood_steps, "rate_hz": args.flood_rate,
                "clean_s": stats(clean), "flooded_s": stats(flooded),
                "ratio": statistics.median(flooded) / statistics.median(clean),
                "ratio_min": min(flooded) / max(clean), "ratio_max": max(flooded) / min(clean),
                "garbage_sent": stats(sent), "refused": stats(refused)}
    finally:
        lab_down()
