"""What every test shares: the repository's root, the fixtures, /proc readers, and the split of
the tests between the pytest-xdist workers.

Tests import the collection's code by its one route, ansible_collections.torchfleet.fleet...
(the editable install puts src/ on the path), as the modules, plugins and package do."""
from __future__ import annotations

import os
from pathlib import Path

from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
COLLECTION = ROOT / "src" / "ansible_collections" / "torchfleet" / "fleet"
WORKLOADS = COLLECTION / "roles" / "launch" / "files" / "workloads"

# Hypothesis's budget by tier (docs/testing.md): `bash tests/run` (the fast tier) sets
# HYPOTHESIS_PROFILE=fast, a quarter of every budget; `--all` and a plain pytest the full one.
settings.register_profile("all", max_examples=100)
settings.register_profile("fast", max_examples=25)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "all"))


def examples(full: int) -> int:
    """A property test's number of examples: `full` under the full budget, the profile's share
    of it in the fast tier (at least 10)."""
    share = settings.default.max_examples / 100
    return full if share >= 1 else max(10, int(full * share))

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


def run_processes(run_id):
    """'PID command line' of every live process of run `run_id` on this machine, whichever lab
    or test started it: its id on the command line (torchrun's --rdzv-id, a play's -e) or in
    its environment (procs.run_processes: TORCHFLEET_RUN_ID, which every rank carries): tests
    running beside each other run the same scripts, so a script's name says nothing of whose
    it is."""
    from ansible_collections.torchfleet.fleet.plugins.module_utils.run import procs

    found = {int(p.split(" ", 1)[0]): p for p in processes_matching(run_id)}
    for pid in procs.run_processes(run_id):
        line = procs.cmdline(pid).strip()
        if line:
            found.setdefault(pid, "%d %s" % (pid, line))
    return [found[pid] for pid in sorted(found)]


def until_stopped(script=None):
    """train.yml's -e arguments for a run that lasts until it is stopped: its ranks all-reduce a
    step every 0.2 s (steps_until_file.py, for a file never made; `script`: a copy of it where
    another login can read it), waiting in their collectives as a real loop does, without the
    built-in workload's busy loop, which would take the CPUs from the tests running beside."""
    import json

    return ("-e", "script=%s" % (script or FIXTURES / "scripts" / "steps_until_file.py"),
            "-e", json.dumps({"script_args": ["/nonexistent/torchfleet-never"]}))


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


# `bash tests/run` runs pytest in several workers (pytest-xdist): most tests wait (for ranks
# to start, a lease, a cut) far more than they compute, so they run beside each other. What
# they share is kept apart: each lab module has a lab of its own (tests/lab/conftest.py), each
# run its own id, free master port and, where it stops "everything", its own runs root; a check
# for leftovers looks for its own run id, lab or port, never a script's name.
#
# The unit of work given to a worker (xdist's scope): a module whose tests share a lab or a
# run made once for them; one test where nothing is shared.
ONE_BY_ONE = ("tests/unit/", "tests/integration/test_launch_local.py",
              "tests/api/test_api_local.py")
# On the default inventory with the default master port (29500 on this machine): one after
# another. (A lab's 29500 is in its own namespaces.)
DEFAULT_PORT = ("tests/integration/test_preflight_local.py",
                "tests/integration/test_check_mode.py", "tests/integration/test_bad_input.py")
# The longest units first, so that no long one starts last (seconds on this 2-CPU VM).
LONGEST = ("tests/lab/test_scale_lab.py", "tests/lab/test_reliability_lab.py",
           "tests/lab/test_detach_lab.py", "tests/lab/test_goodput_lab.py",
           "tests/api/test_collection.py", "tests/lab/test_preflight_lab.py",
           "tests/lab/test_ledger_lab.py", "tests/lab/test_slurm_lab.py",
           "tests/lab/test_isolate_lab.py", "tests/lab/test_hang_lab.py",
           "tests/integration/test_preflight_local.py")


# The tests that read tests/api's collective_run (a session fixture: one run a worker that
# needs it, about 25 CPU-s): one unit, so one worker makes it once.
COLLECTIVE_RUN = ("tests/api/test_cli.py", "tests/api/test_report_browser.py",
                  "tests/api/test_report_scale.py",
                  "tests/api/test_api_local.py::test_collective_returns_a_busbw_table_for_every_op")


def scope_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    if path.startswith(DEFAULT_PORT):
        return "default port"
    if nodeid.startswith(COLLECTIVE_RUN):
        return "collective_run"
    return nodeid if path.startswith(ONE_BY_ONE) else path


def pytest_collection_modifyitems(items):
    import pytest

    for item in items:  # a test that must run alone costs a CPU's whole time: the slow tier
        if item.get_closest_marker("alone") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)

    def rank(item):
        path = item.nodeid.split("::", 1)[0]
        return (LONGEST.index(path) if path in LONGEST else len(LONGEST),
                path.startswith("tests/unit/"))
    items.sort(key=rank)  # stable: each module's own order is kept


def pytest_xdist_make_scheduler(config, log):
    # xdist's own loadgroup mode renames nodeids in a way this pytest no longer reads, so the
    # grouping is a scheduler of ours.
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # LONGEST's order, not the units' test counts

    class Scoped(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return scope_of(nodeid)

    return Scoped(config, log)
