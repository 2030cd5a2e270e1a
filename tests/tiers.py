"""The test tiers' map: which sources each module with slow tests covers.

`bash tests/run` (the fast tier) runs every test not marked `slow`; `bash tests/run --all` (CI)
runs them all; `bash tests/run --touching PATH...` runs the fast tier and the slow tests of the
modules below whose sources match a PATH (docs/testing.md). `python -m tests.tiers PATH...`
prints those modules, one a line.

The patterns are fnmatch globs on paths from the repository's root (`*` crosses folders).
A module that gains a slow test is added here: tests/unit/test_tiers.py checks that every one
is.
"""
from __future__ import annotations

import fnmatch
import sys

F = "src/ansible_collections/torchfleet/fleet"
M = F + "/plugins/module_utils"
PLAYS = ("*.yml", "playbooks/*", F + "/playbooks/*")
LAUNCH = (F + "/roles/launch/*", F + "/plugins/modules/torchrun_*", M + "/run/agent.py",
          M + "/run/control.py", M + "/run/runstate.py", M + "/run/procs.py",
          M + "/run/stop.py", M + "/run/watch.py", M + "/run/exits.py", M + "/defaults.py")
KERNEL = (M + "/host/hwwatch.py", M + "/host/gpuwatch.py", M + "/host/kmsg.py",
          M + "/host/xid.py", M + "/host/ibwatch.py")

SLOW_COVERS: dict[str, tuple[str, ...]] = {
    "tests/lab/test_scale_lab.py": (
        *PLAYS, *LAUNCH, F + "/roles/*", M + "/reports/*", M + "/run/restart.py",
        "src/torchfleet/forks.py", "src/torchfleet/progress.py", "lab/netns.py", "lab/__main__.py"),
    "tests/lab/test_scale_harness.py": (
        *LAUNCH, *KERNEL, M + "/run/flight.py", "lab/scale.py", "lab/standin_torchrun.py"),
    "tests/lab/test_detach_lab.py": (
        *PLAYS, *LAUNCH, M + "/run/detach.py", M + "/run/restart.py", M + "/run/rundir.py",
        M + "/run/guard.py", "src/torchfleet/rundirs.py", "src/torchfleet/cli.py"),
    "tests/lab/test_goodput_lab.py": (
        *LAUNCH, M + "/run/ckptwatch.py", M + "/host/mounts.py", M + "/reports/goodput.py",
        M + "/reports/summary.py", M + "/run/restart.py", "tests/fixtures/scripts/ckpt_train.py",
        F + "/roles/launch/files/workloads/*"),
    "tests/lab/test_straggler_lab.py": (
        *LAUNCH, M + "/run/straggle.py", M + "/run/flight.py", M + "/host/perf.py",
        M + "/run/restart.py", F + "/roles/preflight/*"),
    "tests/lab/test_slurm_lab.py": (
        *PLAYS, *KERNEL, F + "/plugins/inventory/*", F + "/roles/results/*", "lab/slurm.py",
        "examples/slurm/*", "inventory/slurm.yml", M + "/run/restart.py"),
    "tests/lab/test_isolate_lab.py": (
        "collective.yml", F + "/playbooks/collective.yml", M + "/reports/isolate.py",
        F + "/roles/launch/files/workloads/*", "lab/netns.py"),
    "tests/lab/test_user_lab.py": (
        *LAUNCH, M + "/run/rundir.py", M + "/run/stacks.py", M + "/host/pystack.py",
        "lab/netns.py", M + "/run/container.py", M + "/host/image.py", "lab/podman.py",
        F + "/plugins/modules/node_probe.py", M + "/reports/preflight.py"),
    "tests/lab/test_guard_lab.py": (M + "/run/guard.py", F + "/plugins/modules/port_guard.py"),
    "tests/lab/test_ledger_lab.py": (
        M + "/reports/ledger*", M + "/reports/memory.py", "src/torchfleet/hosts_cli.py",
        F + "/roles/results/*", F + "/roles/preflight/*", "lab/pg.py", M + "/run/restart.py",
        M + "/run/agent.py", M + "/reports/slurm_drain.py", "tests/fixtures/scripts/steps_notorch.py"),
    "tests/lab/test_hang_lab.py": (
        *LAUNCH, *KERNEL, M + "/run/flight.py", M + "/run/stacks.py", M + "/host/pystack.py"),
    "tests/lab/test_reliability_lab.py": (*PLAYS, *LAUNCH, M + "/run/detach.py", "lab/netns.py"),
    "tests/lab/test_preflight_lab.py": (
        F + "/roles/preflight/*", M + "/host/*", M + "/reports/preflight.py",
        M + "/reports/checks.py", M + "/reports/health_checks.py", M + "/reports/spares.py",
        F + "/plugins/modules/node_probe.py", F + "/plugins/modules/port_probe.py",
        F + "/plugins/modules/preflight_checks.py", F + "/plugins/modules/health_perf.py"),
    "tests/scenarios/test_molecule.py": ("molecule/*", F + "/roles/*", *PLAYS),
    "tests/api/test_wheel.py": ("pyproject.toml", "src/torchfleet/*", "ansible.cfg", "inventory/*"),
    "tests/api/test_collection.py": (
        "pyproject.toml", F + "/*", "tests/sanity*", "ansible.cfg"),
    "tests/integration/test_readme_long_run.py": (
        "README.md", "src/torchfleet/cli.py", "src/torchfleet/rundirs.py", M + "/run/detach.py",
        *PLAYS),
    "tests/integration/test_ddp_checkpoint.py": (
        F + "/roles/launch/files/workloads/*", M + "/run/ckptwatch.py", M + "/run/restart.py"),
    "tests/integration/test_launch_local.py": (*LAUNCH, M + "/run/stacks.py"),
}


def touching(paths: list[str]) -> list[str]:
    """The modules with slow tests that cover any of `paths`, in the map's order."""
    clean = [p.removeprefix("./") for p in paths]
    return [module for module, globs in SLOW_COVERS.items()
            if any(p == module or fnmatch.fnmatch(p, g) for p in clean for g in globs)]


if __name__ == "__main__":
    print("\n".join(touching(sys.argv[1:])))
