"""One 4-node lab for the whole session; every test heals the faults it injected."""
from __future__ import annotations

import os
import shutil

import pytest

from tests.conftest import netns_of, processes_matching
from lab import netns as labmod

LAB_DIR = labmod.DEFAULT_DIR.with_name("torchfleet-lab-tests")
LAB_TAG = 1  # molecule's lab scenario uses 2, a lab made by hand 0


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


def leftovers() -> list[str]:
    """Anything of the test lab's still on this machine: namespaces, links, sshd."""
    found = ["netns " + ns for ns in labmod.our_namespaces(LAB_TAG)]
    found += ["link " + link for link in labmod.our_links(LAB_TAG)]
    found += ["user " + u for u in labmod.our_users(LAB_TAG)]
    found += ["mount " + m for m in labmod.mounts_under(LAB_DIR)]
    return found + processes_matching(str(LAB_DIR))


@pytest.fixture(scope="session")
def lab():
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    the_lab = labmod.Lab.up(4, LAB_DIR, LAB_TAG, user=True)
    yield the_lab
    # Looked for in the lab's own namespaces (another lab may run beside it), so before down.
    listeners = processes_matching("torchfleet-port-listener", netns=lab_netns(LAB_TAG))
    labmod.down(LAB_DIR, LAB_TAG)
    assert listeners == [] and leftovers() == []


@pytest.fixture
def healthy_lab(lab):
    yield lab
    lab.heal()
