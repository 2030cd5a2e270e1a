"""Each test's CPU-seconds, for docs/testing.md: `TORCHFLEET_TEST_CPU=<file> bash tests/run`, then
`python -m tests.cpu_record <file>` prints the table.

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
    if worker == "main":  # before any worker starts: the groups an earlier run could not remove
        for old in CPUACCT.glob(PREFIX + "*"):
            try:
                old.rmdir()
            except OSError:
                pass  # (a process still in it)
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
        pass  # a process of the worker's still runs: the next run removes the group


def table(lines: list[str]) -> str:
    """docs/testing.md's table from the records: a row per module and what its tests share (a
    test of its own where one costs 10 CPU-s or more), with its lab."""
    from tests.conftest import scope_of
    from tests.lab.conftest import LABS

    def shares(nodeid: str) -> str:
        path, scope = nodeid.split("::", 1)[0], scope_of(nodeid)
        module = Path(path).stem
        return ("its module's lab" if module in LABS else
                "port 29500, one after another" if scope == "default port" else
                "tests/api's collective_run" if scope == "collective_run" else
                "nothing" if scope == nodeid else "its module's fixtures")

    rows: dict[tuple[str, str], list[float]] = {}
    for line in lines:
        r = json.loads(line)
        path = r["test"].split("::", 1)[0]
        key = r["test"] if r["cpu_s"] >= 10 and not path.startswith("tests/unit/") else path
        row = rows.setdefault((key, shares(r["test"])), [0, 0.0, 0.0])
        row[0] += 1
        row[1] += r["cpu_s"]
        row[2] += r["wall_s"]
    out = ["| tests | CPU-s | wall s (3 workers) | lab | shares |",
           "| --- | --- | --- | --- | --- |"]
    for (key, shared), (n, cpu, wall) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        path = key.split("::", 1)[0]
        module = Path(path).stem
        lab = "tag %d, %d nodes" % LABS[module][:2] if module in LABS else (
            "the default inventory" if path.startswith(("tests/integration", "tests/api"))
            else "-")
        name = key if "::" in key else "%s (%d)" % (key, n)
        out.append("| `%s` | %.0f | %.0f | %s | %s |" % (name, cpu, wall, lab, shared))
    total = sum(r[1] for r in rows.values())
    out.append("| all (%d tests) | %.0f | | | |" % (sum(r[0] for r in rows.values()), total))
    return "\n".join(out)


if __name__ == "__main__":
    import sys

    print(table(Path(sys.argv[1]).read_text().splitlines()))
