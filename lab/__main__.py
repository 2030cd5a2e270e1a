"""python -m lab: bring the test lab up, inject faults, heal, take it down (lab/netns.py)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from lab import netns
from lab.slurm import SlurmLab


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab", description=netns.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=netns.DEFAULT_DIR, help="lab directory")
    sub = parser.add_subparsers(dest="command", required=True)
    up_p = sub.add_parser("up", help="create the lab and print its inventory path")
    up_p.add_argument("--nodes", type=int, default=2)
    up_p.add_argument("--tag", type=int, default=0,
                      help="lab number 0-%d: names tflab<N>-*, addresses 10.77.<16N>.0/20"
                      % (netns.MAX_LABS - 1))
    up_p.add_argument("--user", action="store_true",
                      help="also a non-root login on every node (tflab<N>-user)")
    up_p.add_argument("--slurm", action="store_true",
                      help="also a Slurm cluster of the nodes (slurmctld, a slurmd per node)")
    down_p = sub.add_parser("down", help="remove the lab (found by its name prefix, also "
                                         "after a crash) and its directory")
    down_p.add_argument("--tag", type=int, default=None,
                        help="the lab's number, for a lab whose directory is gone (else read "
                             "from the directory)")
    down_p.add_argument("--all", action="store_true", help="remove every lab's leftovers")
    sub.add_parser("heal", help="undo every fault")
    fault = sub.add_parser("fault", help="inject a fault on one node")
    fault.add_argument("kind", choices=["block_port", "occupy_port", "rename_nic", "desync_code",
                                        "remove_data", "hostname_loopback", "unreachable",
                                        "cut_network", "set_env", "slow_nic", "slow_link",
                                        "cut_link", "limit_cpu", "limit_memory"])
    fault.add_argument("node")
    fault.add_argument("--port", type=int, default=29500)
    fault.add_argument("--env", default="NCCL_IB_DISABLE=1", help="NAME=VALUE for set_env")
    fault.add_argument("--peer", help="the other node of slow_link / cut_link")
    fault.add_argument("--rate", default=netns.SLOW_RATE, help="tc rate of slow_nic / slow_link")
    fault.add_argument("--pct", type=int, default=netns.SLOW_CPU_PCT,
                       help="limit_cpu: percent of one CPU the node may use")
    fault.add_argument("--mib", type=int, default=512,
                       help="limit_memory: MiB the node's processes may use together")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            start = time.monotonic()
            lab = netns.Lab.up(args.nodes, args.dir, args.tag, args.user)
            if args.slurm:
                try:
                    SlurmLab(lab).start()
                except BaseException:
                    netns.down(args.dir, args.tag)
                    raise
            print("lab up: %d node(s) in %.1f s; inventory: %s"
                  % (len(lab.nodes), time.monotonic() - start, lab.inventory))
        elif args.command == "down":
            netns.require_root()
            start = time.monotonic()
            state = args.dir / "state.json"
            if args.all:
                tag = None
            elif state.exists():
                tag = json.loads(state.read_text()).get("tag", 0)
            elif args.tag is not None:
                tag = args.tag
            else:  # other labs may be up on this machine: remove none of theirs
                print("lab down: no lab at %s (its --tag N, or --all for every lab's leftovers)"
                      % args.dir)
                return 0
            removed = netns.down(args.dir, tag)
            print("lab down: removed %d item(s) in %.1f s" % (len(removed),
                                                                time.monotonic() - start))
        else:
            lab = netns.Lab.load(args.dir)
            if args.command == "heal":
                lab.heal()
            elif args.kind in ("block_port", "occupy_port"):
                getattr(lab, args.kind)(args.node, args.port)
            elif args.kind == "set_env":
                lab.set_env(args.node, args.env)
            elif args.kind == "limit_cpu":
                lab.limit_cpu(args.node, args.pct)
            elif args.kind == "limit_memory":
                lab.limit_memory(args.node, args.mib)
            elif args.kind == "slow_nic":
                lab.slow_nic(args.node, args.rate)
            elif args.kind in ("slow_link", "cut_link"):
                if not args.peer:
                    raise netns.LabError("%s needs the other node: --peer NODE" % args.kind)
                if args.kind == "slow_link":
                    lab.slow_link(args.node, args.peer, args.rate)
                else:
                    lab.cut_link(args.node, args.peer)
            else:
                getattr(lab, args.kind)(args.node)
    except netns.LabError as exc:
        print("torchfleet lab: %s" % exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
