"""`molecule test` for both scenarios, as a user of the roles would run it."""
from __future__ import annotations

import os
import subprocess

import pytest

from tests.integration.playbook import BIN, ROOT
from tests.lab.conftest import lab_unavailable


def molecule(scenario):
    env = dict(os.environ, PATH="%s:%s" % (BIN, os.environ.get("PATH", "")), ANSIBLE_NOCOLOR="1",
               PY_COLORS="0", NO_COLOR="1")
    proc = subprocess.run([str(BIN / "molecule"), "test", "-s", scenario], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.integration
@pytest.mark.slow
def test_molecule_default_scenario():
    if lab_unavailable() is None:
        pytest.skip("as root the lab scenario runs the same converge and verify over real SSH; "
                    "the default scenario (loopback) is for machines where the lab cannot run")
    rc, out = molecule("default")
    assert rc == 0, out[-4000:]
    assert "All assertions passed" in out


@pytest.mark.lab
@pytest.mark.slow
def test_molecule_lab_scenario():
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    rc, out = molecule("lab")
    assert rc == 0, out[-4000:]
    assert "All assertions passed" in out
    assert not [ns for ns in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                             text=True).stdout.split() if ns.startswith("tflab2-")]
