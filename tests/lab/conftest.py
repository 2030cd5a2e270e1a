"""A lab per test module, made once for its tests and removed after them; every test heals the
faults it injected.

Each module's lab has its own tag (namespaces, links, addresses, users, cgroups carry it), its
own directory and its own runs root on the hosts (the nodes share this machine's filesystem, so
~/.torchfleet/runs would be one directory for every lab and the default inventory): the modules
run beside each other (tests/conftest.py) and a test that finds its run by a glob or a stop.yml
without a run_id sees its own lab only."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import netns_of, processes_matching
from lab import netns as labmod

# Tags: 0 a lab made by hand, 2 molecule's lab scenario, 3 bench/; the tests' own below.
LABS = {  # module: (tag, nodes, with the non-root login)
    "test_preflight_lab": (1, 4, False),
    "test_scale_lab": (4, 40, False),
    "test_isolate_lab": (5, 4, False),
    "test_reliability_lab": (6, 4, False),
    "test_detach_lab": (7, 4, False),
    "test_hang_lab": (8, 3, False),  # (the OOM case: 2 nodes and a spare)
    "test_launch_lab": (9, 4, False),
    "test_guard_lab": (10, 4, False),
    "test_user_lab": (11, 4, True),
    "test_slurm_lab": (12, 4, False),
    "test_straggler_lab": (13, 5, False),
    "test_goodput_lab": (14, 5, False),
    "test_ledger_lab": (15, 5, False),
}
# TORCHFLEET_TEST_LAB_TAG=N gives every lab of this pytest run tag N and a directory of its own,
# so that a second pytest can run a lab module while another runs the same module with its tag.
TAG_OVERRIDE = os.environ.get("TORCHFLEET_TEST_LAB_TAG", "")


def lab_dir(module: str) -> Path:
    suffix = "-t" + TAG_OVERRIDE if TAG_OVERRIDE else ""
    return labmod.DEFAULT_DIR.with_name("torchfleet-lab-" + module[len("test_"):] + suffix)


def runs_root(module: str) -> Path:
    """Where the hosts of `module`'s lab keep their run directories (remote_runs_root)."""
    return lab_dir(module).with_name(lab_dir(module).name + "-runs")


def lab_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the lab needs root (network namespaces, sshd); CI runs these as root"
    missing = [t for t in ("ip", "nft", "unshare", "ssh", "ssh-keygen") if not shutil.which(t)]
    if missing or not os.path.exists(labmod.SSHD):
        return "the lab needs iproute2, nftables and openssh-server (.ci/run installs them)"
    return None


def lab_netns(tag) -> set[int]:
    """The network namespaces of lab `tag` while it is up."""
    return {netns_of("/run/netns/" + ns) for ns in labmod.our_namespaces(tag)}


def leftovers(tag: int, root: Path) -> list[str]:
    """Anything of lab `tag` still on this machine: namespaces, links, users, mounts, processes."""
    found = ["netns " + ns for ns in labmod.our_namespaces(tag)]
    found += ["link " + link for link in labmod.our_links(tag)]
    found += ["user " + u for u in labmod.our_users(tag)]
    found += ["mount " + m for m in labmod.mounts_under(root)]
    return found + processes_matching(str(root))


@pytest.fixture(scope="module")
def lab(request):
    """The module's lab: brought up for its first test; after its last, removed and checked
    that nothing of it is left, no port listener in its namespaces either."""
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    module = request.module.__name__.rsplit(".", 1)[-1]
    tag, nodes, user = LABS[module]
    tag = int(TAG_OVERRIDE) if TAG_OVERRIDE else tag
    root, runs = lab_dir(module), runs_root(module)
    shutil.rmtree(runs, ignore_errors=True)
    the_lab = labmod.Lab.up(nodes, root, tag, user=user, runs_root=runs)
    yield the_lab
    # Looked for in the lab's own namespaces (other labs run beside it), so before down.
    listeners = processes_matching("torchfleet-port-listener", netns=lab_netns(tag))
    labmod.down(root, tag)
    shutil.rmtree(runs, ignore_errors=True)
    assert listeners == [] and leftovers(tag, root) == []


@pytest.fixture
def healthy_lab(lab):
    yield lab
    lab.heal()
