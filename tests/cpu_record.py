"""Each test's CPU-seconds, for docs/testing.md: `TORCHFLEET_TEST_CPU=<file> bash tests/run`.

Every pytest process (each xdist worker, and the `alone` run) moves itself into a cpuacct
cgroup of its own, `tftests-<worker>`: what it starts inherits the group, also what leaves
its process tree (Ansible's async tasks, torchrun's daemonised agents) and a module's lab
(its sshd, and every session and rank that serves the module's tests). A worker runs one test
at a time, so the group's usage across a test (setup, call and teardown) is that test's CPU,
its lab's making included in the module's first test. What escapes it: a Slurm job's steps
(slurmd puts them in cgroups of its own) and whatever the lab's `limit_cpu` fault caps (its own
group). One JSON line a test is appended to the file. Off unless asked (root, cgroup v1's
cpuacct)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
PREFIX = "tftests-"


def _group(config) -> Path | None:
    out = os.environ.get("TORCHFLEET_TEST_CPU")
    if not out or os.geteuid() != 0 or not (CPUACCT / "cgroup.procs").exists():
        return None
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    group = CPUACCT / (PREFIX + worker)
    group.mkdir(exist_ok=True)
    (group / "tasks").write_text(str(os.getpid()))
    return group


def pytest_configure(config):
    config._tf_cpu_group = _group(config)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    group = getattr(item.config, "_tf_cpu_group", None)
    if group is None:
        yield
        return
    usage = group / "cpuacct.usage"
    before, start = int(usage.read_text()), time.monotonic()
    yield
    record = {"test": item.nodeid, "cpu_s": round((int(usage.read_text()) - before) / 1e9, 2),
              "wall_s": round(time.monotonic() - start, 2),
              "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}
    with open(os.environ["TORCHFLEET_TEST_CPU"], "a") as f:
        f.write(json.dumps(record) + "\n")


def pytest_unconfigure(config):
    """Back to the root group; the group goes once nothing of the worker is left in it."""
    group = getattr(config, "_tf_cpu_group", None)
    if group is None:
        return
    (CPUACCT / "tasks").write_text(str(os.getpid()))
    try:
        group.rmdir()
    except OSError:
        pass  # a process of the worker's still runs: the next run's mkdir reuses the group
