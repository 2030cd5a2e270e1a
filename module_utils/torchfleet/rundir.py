"""Layout of one run's directory on a host, shared by the launch, watch, stop and results
modules:

    <runs_root>/<run_id>/<inventory_hostname>/
        torchrun.pid    {"pid", "run_id", "argv", "started"}
        exitcode.json   {"rc", "reason", "ended"} once torchrun ended
        control.json    on the master: the run's state record (runstate.py), kept by its agent
        lease           on the master: touched by the controller's watch; stale means the
                        controller is gone
        torchrun.log    torchrun's own output
        logs/<rdzv>/attempt_<n>/<local_rank>/{stdout,stderr}.log   per rank (torchrun --log-dir)
        results/rank-<RANK>.json                                    per rank (the workloads)
"""
from __future__ import annotations

import glob
import json
import os
import random
import re
import time

# A run id names a directory on every host: no separators, no glob characters, no dot first.
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def new_run_id():
    """UTC time to the second and 16 random bits: sortable, and two runs started in the same
    second (two users, two API calls) still get different directories."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-%04x" % random.randrange(65536)


PIDFILE = "torchrun.pid"
EXITCODE = "exitcode.json"
CONTROL = "control.json"
LEASE = "lease"
TORCHRUN_LOG = "torchrun.log"
LOGS = "logs"
RESULTS = "results"
STACK_DUMP = "py-spy-dump.txt"

# The torchrun_stop module's arguments (stop.py does the work).
STOP_SPEC = dict(
    runs_root=dict(type="path", required=True),
    run_id=dict(type="str"),
    host_dir=dict(type="str"),
    grace_s=dict(type="float", default=10),
    async_jid=dict(type="str"),
    async_dir=dict(type="path", default="~/.ansible_async"),
)

# The rank_results module's arguments (dest is its action plugin's), validated by both. With
# stop, the host's run is stopped first: stop and gather cost one module run per host, not two.
RANK_RESULTS_SPEC = dict(
    run_dir=dict(type="path", required=True),
    max_log_bytes=dict(type="int", default=1 << 20),
    dest=dict(type="str"),
    stop=dict(type="dict", options=STOP_SPEC),
)


def write_json(path, data):
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def rank_dirs(run_dir):
    """{local_rank: directory} of the latest torchrun attempt."""
    attempts = glob.glob(os.path.join(run_dir, LOGS, "*", "attempt_*"))
    if not attempts:
        return {}
    latest = max(attempts, key=lambda a: int(a.rsplit("_", 1)[1]))
    dirs = {}
    for entry in os.listdir(latest):
        if entry.isdigit():
            dirs[int(entry)] = os.path.join(latest, entry)
    return dict(sorted(dirs.items()))


def tail_bytes(path, max_bytes):
    """(the last max_bytes bytes of a file, its size); OSError when it cannot be read."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - max_bytes))
        return f.read(), size


def tail(path, lines=20, max_bytes=16384):
    """The last `lines` lines of a text file ('' when missing)."""
    try:
        data = tail_bytes(path, max_bytes)[0].decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


FAILURE_RE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def failed_ranks(torchrun_log_text):
    """[{rank, local_rank, exitcode}] from torchrun's ChildFailedError summary."""
    seen = []
    for rank, local_rank, code in FAILURE_RE.findall(torchrun_log_text):
        item = {"rank": int(rank), "local_rank": int(local_rank), "exitcode": int(code)}
        if item not in seen:
            seen.append(item)
    return seen


def root_cause(torchrun_log_text):
    """{rank, local_rank, exitcode} torchrun names as the root cause (first observed failure),
    else the first failure it lists, else None."""
    marker = torchrun_log_text.rfind("Root Cause")
    found = failed_ranks(torchrun_log_text[marker:] if marker >= 0 else torchrun_log_text)
    return found[0] if found else None
