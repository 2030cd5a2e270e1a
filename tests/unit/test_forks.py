"""Ending the Ansible forks a cancelled ansible-playbook leaves behind: only the descendants
of this run's ansible-playbook, even when they called setsid() as Ansible's workers do."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from torchfleet import forks

# A parent whose child leaves its session (like an Ansible worker fork) and keeps running.
TREE = ("import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "time.sleep(60)\n")


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_snapshot_finds_the_marked_tree_and_kill_left_ends_it():
    marked = subprocess.Popen([sys.executable, "-c", TREE, "run-dir-abc123"])
    other = subprocess.Popen([sys.executable, "-c", TREE, "someone-else"])
    try:
        time.sleep(0.5)
        found = forks.snapshot(os.getpid(), "run-dir-abc123")
        pids = [pid for pid, _ in found]
        assert marked.pid in pids and len(pids) == 2  # the parent and its setsid() child
        assert other.pid not in pids
        assert forks.kill_left(found) == 2
        marked.wait(timeout=5)
        deadline = time.monotonic() + 5
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(p) for p in pids)
        assert alive(other.pid)
        assert forks.kill_left(found) == 0  # gone (or recycled): never signalled again
    finally:
        for proc in (marked, other):
            proc.kill()
            proc.wait()
        for pid, _ in forks.snapshot(os.getpid(), "someone-else"):
            os.kill(pid, 9)


def test_stray_forks_finds_reparented_forks_of_this_runs_ansible_playbook_only():
    # A fork started after the snapshot and reparented: found by the run's quoted directory
    # and "ansible-playbook" on its command line; a longer run dir and other commands are not.
    run = subprocess.Popen([sys.executable, "-c", TREE, "ansible-playbook", '"/runs/abc"'])
    longer = subprocess.Popen([sys.executable, "-c", TREE, "ansible-playbook", '"/runs/abcd"'])
    not_ansible = subprocess.Popen([sys.executable, "-c", TREE, '"/runs/abc"'])
    try:
        time.sleep(0.5)
        pids = [pid for pid, _ in forks.stray_forks('"/runs/abc"')]
        assert run.pid in pids and len(pids) == 2
        assert forks.kill_left(forks.stray_forks('"/runs/abc"')) == 2
        run.wait(timeout=5)
        deadline = time.monotonic() + 5
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(p) for p in pids)
        assert alive(longer.pid) and alive(not_ansible.pid)
    finally:
        for proc in (run, longer, not_ansible):
            proc.kill()
            proc.wait()
        for marker in ('"/runs/abcd"', '"/runs/abc"'):
            for pid, _ in forks.snapshot(os.getpid(), marker) + forks.stray_forks(marker):
                os.kill(pid, 9)
