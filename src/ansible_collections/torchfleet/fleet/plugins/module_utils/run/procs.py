"""Processes of one torchfleet run on a host: find them by recorded PID and run id, end them.

A run is identified by its run id: torchrun's command line carries it (--rdzv-id) and every
process of the run carries TORCHFLEET_RUN_ID (and TORCHFLEET_HOST, the inventory host, since
several inventory hosts may share a machine) in its environment, so a recycled PID, another
user's job, or another inventory host's part of the run is never signalled.
"""
from __future__ import annotations

import ctypes
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


# The one reader of /proc for torchfleet, on the hosts and on the controller (the package
# loads this file by path: it imports nothing of Ansible's).

def stat_fields(pid):
    """Fields of /proc/<pid>/stat after the command name: state [0], ppid [1], start [19];
    None when gone."""
    stat = _read("/proc/%d/stat" % pid)
    return stat.rsplit(")", 1)[1].split() if ")" in stat else None


def cmdline(pid):
    """The command line, arguments joined by spaces ('' when gone)."""
    return _read("/proc/%d/cmdline" % pid, "rb").replace(b"\0", b" ").decode("utf-8", "replace")


def comm(pid):
    return _read("/proc/%d/comm" % pid).strip()


def uid(pid):
    """The real uid of the process (None when gone)."""
    for line in _read("/proc/%d/status" % pid).splitlines():
        fields = line.split()
        if fields[:1] == ["Uid:"] and len(fields) > 1 and fields[1].isascii() and fields[1].isdigit():
            return int(fields[1])
    return None


def environ(pid):
    """The environment as {bytes: bytes} ({} when gone or not ours to read)."""
    raw = _read("/proc/%d/environ" % pid, "rb")
    return dict(kv.split(b"=", 1) for kv in raw.split(b"\0") if b"=" in kv)


def children(pid):
    """PIDs of the direct children of pid's main thread."""
    return [int(c) for c in _read("/proc/%d/task/%d/children" % (pid, pid)).split()]


def state(pid):
    """The process state letter from /proc/<pid>/stat ('' when gone)."""
    fields = stat_fields(pid)
    return fields[0] if fields else ""


def alive(pid):
    return state(pid) not in ("", "Z", "X")


def parent(pid):
    fields = stat_fields(pid)
    return int(fields[1]) if fields else None


def table():
    """{pid: stat fields} of every process now."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = stat_fields(int(name))
            if fields:
                out[int(name)] = fields
    return out


def descendants(procs, roots):
    """The roots present in `procs` (a table()) and every process below them."""
    kids = {}
    for pid, fields in procs.items():
        kids.setdefault(int(fields[1]), []).append(pid)
    found, todo = set(), [r for r in roots if r in procs]
    while todo:
        pid = todo.pop()
        if pid not in found:  # a root may also descend from another root
            found.add(pid)
            todo.extend(kids.get(pid, []))
    return found


def has_run_id(pid, run_id, host=None):
    env = environ(pid)
    return (env.get(RUN_ID_ENV.encode()) == run_id.encode()
            and (host is None or env.get(HOST_ENV.encode()) == host.encode()))


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
    procs = table()
    found = descendants(procs, [root_pid] if root_pid else [])
    if orphans:
        found |= {pid for pid in procs if has_run_id(pid, run_id, host)}
    found = {pid for pid in found if pid != os.getpid() and procs[pid][0] not in ("Z", "X")}
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
    for _attempt in range(3):  # workers may still be appearing from a dying agent
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


_PR_SET_PDEATHSIG = 1


def die_with(parent_pid, sig):
    """In a child before exec: `sig` when its parent (the agent) dies, so a killed agent leaves
    nothing running (torchrun, the kernel log's journalctl). Linux only; elsewhere a no-op."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os.kill(os.getpid(), sig)
