"""What every test shares: the repository's root, the fixtures, /proc readers, and the split of
the tests between two pytest-xdist workers.

Tests import the collection's code by its one route, ansible_collections.torchfleet.fleet...
(the editable install puts src/ on the path), as the modules, plugins and package do."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
COLLECTION = ROOT / "src" / "ansible_collections" / "torchfleet" / "fleet"
WORKLOADS = COLLECTION / "roles" / "launch" / "files" / "workloads"

def netns_of(path):
    """The network namespace (its inode) of /proc/<pid>/ns/net or /run/netns/<name>."""
    return os.stat(path).st_ino


def this_netns():
    """This machine's own network: where the default inventory's hosts run (not a lab's)."""
    return {netns_of("/proc/self/ns/net")}


def processes_matching(marker, netns=None):
    """'PID command line' of every live process whose command line contains marker; with
    netns (a set of namespace inodes), only those running in one of them.

    Read from /proc, not ps, whose output is cut to the terminal width in some environments.
    """
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                line = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
            if not line or marker not in line or int(pid) == os.getpid():
                continue
            # Only for the processes that match: a stat per process on the machine otherwise.
            if netns is not None and netns_of("/proc/%s/ns/net" % pid) not in netns:
                continue
        except OSError:
            continue
        found.append("%s %s" % (pid, line))
    return found


# `bash tests/run` runs pytest in two workers (pytest-xdist). Tests that start what other
# tests look for on the whole machine (the lab, ansible-playbook runs of the default inventory,
# torchrun, the port listener) run one after another in one worker, in order; the tests that
# only read, parse or start processes nobody else looks for run beside them, and so does a lab
# of its own whose hosts keep their runs apart (own namespaces, own remote_runs_root) and whose
# processes the others' checks do not count (they look in their own network namespaces).
BESIDE_LABS = ("tests/lab/test_scale_lab.py", "tests/lab/test_isolate_lab.py")  # a lab each
BESIDE = ("tests/unit/",) + BESIDE_LABS
SERIAL_UNITS = ("tests/unit/test_listener.py", "tests/unit/test_probe_modules.py")  # listeners
BESIDE_TESTS = ("::test_ansible_test_sanity_passes_on_the_built_collection",)  # CPU only


def parent_of(pid: int) -> int:
    """The PID of a process's parent (/proc/<pid>/stat's fourth field)."""
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def end_unattended(run_dir, timeout_s=120):
    """Kill (SIGKILL) the controller's unattended finisher of a detached run, as a controller
    shut down would: the ansible-playbook holding runs/<id>/attach.lock once it took it, and
    the async job around it. Returns its PID."""
    import json
    import signal
    import time

    lock = Path(run_dir) / "attach.lock"
    end = time.monotonic() + timeout_s
    while not lock.exists() and time.monotonic() < end:
        time.sleep(0.2)
    pid = json.loads(lock.read_text())["pid"]
    for victim in (pid, parent_of(pid)):
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
    marker = '"run_id": "%s"' % Path(run_dir).name  # its -e (the launch's to_json)
    while processes_matching(marker) and time.monotonic() < end:
        time.sleep(0.2)
    return pid


def runs_beside(nodeid: str) -> bool:
    return (nodeid.startswith(BESIDE) and not nodeid.startswith(SERIAL_UNITS)) \
        or nodeid.endswith(BESIDE_TESTS)


def pytest_xdist_make_scheduler(config, log):
    # xdist's own loadgroup mode renames nodeids in a way this pytest no longer reads, so the
    # grouping is a scheduler of ours: one work unit for every test that touches hosts.
    from xdist.scheduler import LoadScopeScheduling

    class HostsInOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            if nodeid.startswith(BESIDE_LABS):  # a lab of its own is made once, in one worker
                return nodeid.split("::", 1)[0]
            return nodeid if runs_beside(nodeid) else "hosts"

    return HostsInOneWorker(config, log)
