"""Processes of one torchfleet run on a host: find them by recorded PID and run id, end them.

A run is identified by its run id: torchrun's command line carries it (--rdzv-id) and every
process of the run carries TORCHFLEET_RUN_ID (and TORCHFLEET_HOST, the inventory host, since
several inventory hosts may share a machine) in its environment, so a recycled PID, another
user's job, or another inventory host's part of the run is never signalled.
"""
from __future__ import annotations

import ctypes
import os
import select
import signal
import threading
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


def rank_ids(pid):
    """(LOCAL_RANK, RANK) as torchrun sets them in each rank's environment; None for any
    other process (or one gone, or not ours to read)."""
    env = environ(pid)
    try:
        return int(env[b"LOCAL_RANK"]), int(env[b"RANK"])
    except (KeyError, ValueError):
        return None


TORCHRUN_DEPTH = 4   # levels below a runtime's process searched for torchrun
TORCHRUN_LOOKS = 64  # processes looked at per search


def find_torchrun(root, depth=TORCHRUN_DEPTH, looks=TORCHRUN_LOOKS):
    """The PID of the process at or below root whose children are ranks (rank_ids): torchrun,
    where a runtime runs it in the host's own tree at some depth (enroot start exec's into
    it, or forks first with --pid; apptainer's starter forks the container's process; an
    image's entrypoint may fork), searched breadth first, `depth` levels and `looks`
    processes at most; None before its ranks run. A rank's own children (its DataLoader
    workers, with the rank's environment) are deeper than the rank: never taken for it."""
    level, seen = [root], 0
    for _level in range(depth + 1):
        below = []
        for pid in level:
            kids = children(pid)
            seen += 1 + len(kids)
            if any(rank_ids(kid) is not None for kid in kids):
                return pid
            below += kids
            if seen >= looks:
                return None
        level = below
    return None


def tree(pid):
    """Every process below pid, by the children files of each of its threads (a few reads,
    not a scan of every process)."""
    found, todo = [], [pid]
    while todo:
        parent_pid = todo.pop()
        try:
            tasks = os.listdir("/proc/%d/task" % parent_pid)
        except OSError:
            continue
        for tid in tasks:
            for child in _read("/proc/%d/task/%s/children" % (parent_pid, tid)).split():
                if int(child) not in found:
                    found.append(int(child))
                    todo.append(int(child))
    return found


def state(pid):
    """The process state letter from /proc/<pid>/stat ('' when gone)."""
    fields = stat_fields(pid)
    return fields[0] if fields else ""


def alive(pid):
    return state(pid) not in ("", "Z", "X")


def exit_status(pid):
    """How a process that ended but is not reaped yet (a zombie) ended, as
    os.waitstatus_to_exitcode says it (negative: the signal); None for any other (alive,
    reaped, gone). /proc/<pid>/stat's exit_code (field 52, Linux 3.5 and later): a process's
    status is readable here before its parent waits for it."""
    fields = stat_fields(pid)
    if not fields or fields[0] != "Z" or len(fields) < 50 or not fields[49].isdigit():
        return None
    try:
        return os.waitstatus_to_exitcode(int(fields[49]))
    except ValueError:
        return None


class ExitWatch(threading.Thread):
    """How each watched process ended, read the moment it ends: a pidfd (Linux 5.3) turns
    readable when its process exits, and its status stays readable in /proc (exit_status)
    until its parent reaps it: torchrun, a monitor interval (0.1 s) later at most, so read at
    once it is nearly always there. ended: pid -> (monotonic time seen ended, its exit code,
    or None where its parent reaped it first). Processes that end together come in one
    round, with one time: which of them was first is not known. Where pidfds are not (an
    older kernel) nothing is watched (`works` False)."""

    def __init__(self):
        super().__init__(daemon=True, name="exit-watch")
        self.ended = {}
        self.added = []    # (fd, pid) to watch, taken in at once (a byte on the pipe wakes it)
        self.closing = False
        self.works = hasattr(os, "pidfd_open") and hasattr(select, "poll")
        self.wake = None

    def watch(self, pid, parent_pid):
        """Watch pid, a child of parent_pid (checked once its pidfd is open, so it is that
        process and not a later one with its PID); False when it cannot be."""
        if not self.works or self.closing:
            return False
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return False
        if parent(pid) != parent_pid:
            os.close(fd)
            return False
        if self.wake is None:
            self.wake = os.pipe()
            self.start()
        self.added.append((fd, pid))
        os.write(self.wake[1], b".")
        return True

    def run(self):
        poller, fds = select.poll(), {}
        poller.register(self.wake[0], select.POLLIN)
        while not self.closing:
            ready = poller.poll()
            now_m = time.monotonic()  # (one time a round: their order is not known)
            round_ = {}
            for fd, _event in ready:
                if fd == self.wake[0]:
                    os.read(fd, 512)
                    while self.added:
                        new, pid = self.added.pop()
                        fds[new] = pid
                        poller.register(new, select.POLLIN)
                    continue
                pid = fds.pop(fd)
                round_[pid] = (now_m, exit_status(pid))
                poller.unregister(fd)
                os.close(fd)
            self.ended.update(round_)  # (a round at once: a reader sees all of it or none)
        for fd in list(fds) + list(self.wake):
            os.close(fd)

    def wait_for(self, pid, timeout_s):
        """ended[pid] once the watch has read it, waiting up to timeout_s; else None."""
        end = time.monotonic() + timeout_s
        while pid not in self.ended and time.monotonic() < end and self.is_alive():
            time.sleep(0.002)
        return self.ended.get(pid)

    def close(self):
        if self.wake is not None and not self.closing:
            self.closing = True
            os.write(self.wake[1], b".")
        self.closing = True


def start_time(pid):
    """When pid started (clock ticks after boot): with the PID, the process itself (a PID may
    be reused); None when gone."""
    fields = stat_fields(pid)
    return fields[19] if fields and len(fields) > 19 else None


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


def stop_run(run_id, root_pid, grace_s, host=None, all_at_once=False, known=None):
    """SIGTERM torchrun (it forwards to its workers), wait grace_s, SIGKILL what is left.

    all_at_once: an abort. SIGTERM every rank (and what they started) together, without
    waiting for torchrun to forward the signal, which takes a while on a busy host; SIGKILL
    torchrun itself at once: its own shutdown on SIGTERM (stopping workers already stopped,
    its rendezvous, a traceback, an interpreter holding torch) outlasts the grace on a busy
    host and says nothing the abort needs.

    known: {pid: start time} of processes of the run its caller found (and signalled)
    already, torchrun's tree before it was killed, each start time read before any signal:
    they are targets too.

    Returns {"signalled": [pids], "killed": [pids]}; nothing of the run is alive after it.
    """
    started = dict(known or {})
    targets = sorted(set(run_processes(run_id, root_pid, host)) | {
        pid for pid, at in started.items()
        if at is not None and start_time(pid) == at and alive(pid)})
    result = {"signalled": [], "killed": []}
    if not targets:
        return result
    # The sweep below finds the run again by torchrun's descendants and the run id in each
    # environment; a rank orphaned by torchrun's kill whose environment cannot be read (or
    # that cleared it) is neither, so the first targets still alive go too (the same
    # processes: their start time unchanged).
    started.update({pid: start_time(pid) for pid in targets if pid not in started})
    first = [root_pid] if root_pid in targets and not all_at_once else targets
    for pid in first:
        kill = all_at_once and pid == root_pid
        try:
            os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
            result["killed" if kill else "signalled"].append(pid)
        except OSError:
            pass
    end = time.monotonic() + grace_s
    while time.monotonic() < end and any(alive(p) for p in targets):
        time.sleep(0.02)  # a few /proc reads: the ranks' end is seen when it comes
    for _attempt in range(3):  # workers may still be appearing from a dying agent
        left = set(run_processes(run_id, root_pid, host)) | {
            p for p, at in started.items() if at is not None and start_time(p) == at}
        left = sorted(p for p in left if alive(p))
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
