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

from ansible_collections.torchfleet.fleet.plugins.module_utils.run import procs  # the one /proc reader, shared with the hosts' modules




def _with_start(table: dict[int, list[str]], pids) -> list[tuple[int, str]]:
    return [(pid, table[pid][19]) for pid in pids]


def snapshot(parent: int, marker: str) -> list[tuple[int, str]]:
    """(pid, start time) of the children of `parent` whose command line holds `marker` (this
    run's ansible-playbook) and of all their descendants; other children are left alone."""
    table = procs.table()
    return _with_start(table, procs.descendants(table, [
        pid for pid, fields in table.items()
        if int(fields[1]) == parent and marker in procs.cmdline(pid)]))


def stray_forks(marker: str) -> list[tuple[int, str]]:
    """(pid, start time) of every ansible-playbook process whose command line holds `marker`,
    wherever it was reparented, and of their descendants; never this process."""
    table = procs.table()
    return _with_start(table, procs.descendants(table, [
        pid for pid in table if pid != os.getpid()
        and marker in (line := procs.cmdline(pid)) and "ansible-playbook" in line]))


def kill_left(processes: list[tuple[int, str]]) -> int:
    """SIGKILL those still alive with the same start time (never a recycled PID)."""
    killed = 0
    for pid, start in processes:
        fields = procs.stat_fields(pid)
        if fields and fields[19] == start and fields[0] not in ("Z", "X"):
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed
