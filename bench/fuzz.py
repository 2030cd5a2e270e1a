"""The control channel's fuzz campaign (bench/fuzz_control.py)."""
from __future__ import annotations


def run(args, tmp):
    """The control channel's fuzz campaign (bench/fuzz_control.py): inputs on each end, crashes."""
    from bench.fuzz_control import campaign

    return campaign(lines=args.fuzz_lines, connections=max(300, args.fuzz_lines // 100))
