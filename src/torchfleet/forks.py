"""Ansible's worker forks that outlive a cancelled ansible-playbook.

ansible-runner cancels by SIGKILLing ansible-playbook's process group, but every Ansible
worker fork calls setsid() (ansible/executor/process/worker.py), so a fork in the middle of a
task, such as torchrun_watch's polling loop, keeps running. The API snapshots ansible-playbook's
descendants when it decides to cancel and ends the ones still alive afterwards.
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


def _cmdline(pid: int) -> bytes:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read()
    except OSError:
        return b""


def snapshot(parent: int, marker: str) -> list[tuple[int, str]]:
    """(pid, start time) of the children of `parent` whose command line holds `marker` (this
    run's ansible-playbook) and of all their descendants; other children are left alone."""
    table = _table()
    children: dict[int, list[int]] = {}
    for pid, fields in table.items():
        children.setdefault(int(fields[1]), []).append(pid)
    found = []
    todo = [pid for pid in children.get(parent, []) if marker.encode() in _cmdline(pid)]
    while todo:
        pid = todo.pop()
        found.append((pid, table[pid][19]))
        todo.extend(children.get(pid, []))
    return found


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
