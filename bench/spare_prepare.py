"""What a prepared spare saves a restart (issue 59 item 5): the ranks' `import torch` on a host
whose page cache never held the run's packages, against the same import after spare_prepare's
process ran there, alternated, on this machine's disk.

The lab's hosts share one page cache, so a restart in the lab cannot show it: a spare's files
are as warm as the survivors'. Here a spare's cold cache is made by evicting every file of the
interpreter's site-packages (posix_fadvise DONTNEED, what the kernel drops under memory
pressure; the standard library stays, as preflight's probe ran Python there), then `import torch`
is timed in a fresh interpreter; the prepared side evicts the same files, runs spare_prepare's
own process (plugins/modules/spare_prepare.py, as the play starts it) to its end, then times the
same import. A GPU host's torch is several GB of CUDA libraries where this CPU wheel is 0.75 GB,
and its storage may be a network filesystem: the saving there is larger than here.

Alone: python -m bench.spare_prepare [--runs 5].
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from ansible_collections.torchfleet.fleet.plugins.module_utils.host import spare
from bench.harness import stats


def evict(root):
    """Drop every file under root from the page cache; returns how many."""
    n = 0
    for d, _dirs, files in os.walk(root):
        for name in files:
            try:
                fd = os.open(os.path.join(d, name), os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                n += 1
            finally:
                os.close(fd)
    return n


def import_s():
    """Seconds of a fresh interpreter's `import torch, torch.distributed` (a rank's first)."""
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, torch.distributed"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - began


def prepared(tmp):
    """spare_prepare's process run to its end; its record."""
    path = os.path.join(tmp, "spare_prepare.json")
    pid, why = spare.prepare(sys.executable, path, ["torch", "torch.distributed"], 600)
    assert pid is not None, why
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            record = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            record = {}
        if "ok" in record:
            return record
        time.sleep(0.05)
    raise RuntimeError("spare_prepare's process never wrote its record")


def run(args, tmp_root):
    packages = sysconfig.get_paths()["purelib"]
    cold, warm, prep = [], [], []
    for _ in range(args.runs):
        evict(packages)
        cold.append(import_s())
        evict(packages)
        with tempfile.TemporaryDirectory(dir=tmp_root) as tmp:
            record = prepared(tmp)
        prep.append(record["seconds"])
        warm.append(import_s())
    saved = [c - w for c, w in zip(cold, warm, strict=True)]
    return {"packages": packages, "runs": args.runs, "cold_import_s": stats(cold),
            "prepared_import_s": stats(warm), "saved_s": stats(saved),
            "prepare_s": stats(prep), "load": os.getloadavg()[0]}


def main():
    parser = argparse.ArgumentParser(prog="python -m bench.spare_prepare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="torchfleet-bench-") as tmp:
        print(json.dumps(run(args, Path(tmp)), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
