"""Ansible's worker forks that outlive a cancelled ansible-playbook.

ansible-runner cancels by SIGKILLing ansible-playbook's process group, but every Ansible
worker fork calls setsid() (ansible/executor/process/worker.py), so a fork in the middle of a
task, such as torchrun_watch's polling loop, keeps running. The API snapshots ansible-playbook's
descendants when it decides to cancel and, once ansible-runner is done, ends the ones still
alive together with any fork of the run's ansible-playbook started after the snapshot (found by
the run's directory on its command line: forks keep their parent's argv).
"""
from __future__ import annotations

import os
import signal


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state is [0], ppid [1], start [19])."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _table() -> dict[int, list[str]]:
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat(int(name))
            if fields:
                table[int(name)] = fields
    return table


def cmdline(pid: int) -> bytes:
    """/proc/<pid>/cmdline, NUL-separated (b"" when gone)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _with_descendants(table: dict[int, list[str]], roots: list[int]) -> list[tuple[int, str]]:
    children: dict[int, list[int]] = {}
    for pid, fields in table.items():
        children.setdefault(int(fields[1]), []).append(pid)
    found, todo = {}, list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:  # a root may also descend from another root
            found[pid] = table[pid][19]
            todo.extend(children.get(pid, []))
    return list(found.items())


def snapshot(parent: int, marker: str) -> list[tuple[int, str]]:
    """(pid, start time) of the children of `parent` whose command line holds `marker` (this
    run's ansible-playbook) and of all their descendants; other children are left alone."""
    table = _table()
    return _with_descendants(table, [pid for pid, fields in table.items()
                                     if int(fields[1]) == parent
                                     and marker.encode() in cmdline(pid)])


def stray_forks(marker: str) -> list[tuple[int, str]]:
    """(pid, start time) of every ansible-playbook process whose command line holds `marker`,
    wherever it was reparented, and of their descendants; never this process."""
    table = _table()
    return _with_descendants(table, [pid for pid in table if pid != os.getpid()
                                     and marker.encode() in (line := cmdline(pid))
                                     and b"ansible-playbook" in line])


def kill_left(processes: list[tuple[int, str]]) -> int:
    """SIGKILL those still alive with the same start time (never a recycled PID)."""
    killed = 0
    for pid, start in processes:
        fields = _stat(pid)
        if fields and fields[19] == start and fields[0] not in ("Z", "X"):
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed
