"""Processes of one torchfleet run on a host: find them by recorded PID and run id, end them.

A run is identified by its run id: torchrun's command line carries it (--rdzv-id) and every
process of the run carries TORCHFLEET_RUN_ID (and TORCHFLEET_HOST, the inventory host, since
several inventory hosts may share a machine) in its environment, so a recycled PID, another
user's job, or another inventory host's part of the run is never signalled.
"""
from __future__ import annotations

import os
import signal
import time

RUN_ID_ENV = "TORCHFLEET_RUN_ID"
HOST_ENV = "TORCHFLEET_HOST"


def _read(path, mode="r"):
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:
        return b"" if "b" in mode else ""


def cmdline(pid):
    return _read("/proc/%d/cmdline" % pid, "rb").replace(b"\0", b" ").decode("utf-8", "replace")


def state(pid):
    """The process state letter from /proc/<pid>/stat ('' when gone)."""
    stat = _read("/proc/%d/stat" % pid)
    return stat.rsplit(")", 1)[1].split()[0] if ")" in stat else ""


def alive(pid):
    return state(pid) not in ("", "Z", "X")


def parent(pid):
    stat = _read("/proc/%d/stat" % pid)
    return int(stat.rsplit(")", 1)[1].split()[1]) if ")" in stat else None


def has_run_id(pid, run_id, host=None):
    environ = _read("/proc/%d/environ" % pid, "rb").split(b"\0")
    return (("%s=%s" % (RUN_ID_ENV, run_id)).encode() in environ
            and (host is None or ("%s=%s" % (HOST_ENV, host)).encode() in environ))


def is_run_torchrun(pid, run_id):
    """True when pid is alive and is this run's torchrun (never a recycled PID)."""
    line = cmdline(pid)
    return alive(pid) and "torch.distributed.run" in line and run_id in line


def run_processes(run_id, root_pid=None, host=None, orphans=True):
    """PIDs of every live process of the run: descendants of root_pid and, with orphans, any
    process whose environment carries the run id and host (workers orphaned by a killed
    torchrun)."""
    if root_pid is not None and not is_run_torchrun(root_pid, run_id):
        root_pid = None  # the recorded PID is gone or now belongs to another process
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    parents = {pid: parent(pid) for pid in pids}
    found = set()
    for pid in pids:
        if not alive(pid) or pid == os.getpid():
            continue
        cursor, depth = pid, 0
        while cursor and depth < 64:
            if cursor == root_pid:
                found.add(pid)
                break
            cursor, depth = parents.get(cursor), depth + 1
        if orphans and pid not in found and has_run_id(pid, run_id, host):
            found.add(pid)
    return sorted(found)


def stop_run(run_id, root_pid, grace_s, host=None, all_at_once=False):
    """SIGTERM torchrun (it forwards to its workers), wait grace_s, SIGKILL what is left.

    all_at_once: SIGTERM every process of the run together (an abort: the ranks need not wait
    for torchrun to forward the signal, which takes a while on a busy host).

    Returns {"signalled": [pids], "killed": [pids]}; nothing of the run is alive after it.
    """
    targets = run_processes(run_id, root_pid, host)
    result = {"signalled": [], "killed": []}
    if not targets:
        return result
    first = [root_pid] if root_pid in targets and not all_at_once else targets
    for pid in first:
        try:
            os.kill(pid, signal.SIGTERM)
            result["signalled"].append(pid)
        except OSError:
            pass
    end = time.monotonic() + grace_s
    while time.monotonic() < end and any(alive(p) for p in targets):
        time.sleep(0.1)
    for _ in range(3):  # workers may still be appearing from a dying agent
        left = [p for p in run_processes(run_id, root_pid, host) if alive(p)]
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                result["killed"].append(pid)
            except OSError:
                pass
        time.sleep(0.1)
    return result
