"""How a hang's stacks are taken: whether py-spy can attach (ptrace rules), and the ranks' own
faulthandler where it cannot, on a real process."""
from __future__ import annotations

import os
import struct
import subprocess
import sys
import time

import pytest
from ansible_collections.torchfleet.fleet.plugins.module_utils import stacks

# `setcap cap_sys_ptrace+ep` writes this xattr (VFS_CAP_REVISION_2, bit 19 permitted).
CAP_SYS_PTRACE_EP = struct.pack("<5I", 0x02000001, 1 << 19, 0, 0, 0)


@pytest.fixture
def py_spy(tmp_path):
    path = tmp_path / "py-spy"
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("euid, scope, attach", [
    (0, 1, True), (1000, None, True), (1000, 0, True), (1000, 1, False), (1000, 2, False),
    (0, 3, False), (1000, 3, False)])
def test_who_may_attach_follows_the_kernels_ptrace_rules(py_spy, euid, scope, attach):
    facts = stacks.attach_facts("/usr/bin/python3", euid, scope=scope, py_spy=py_spy)
    assert facts["can_attach"] is attach
    assert (facts["why"] == "") is attach
    if not attach:
        assert "ptrace_scope=%d" % scope in facts["why"]


def test_no_py_spy_says_so(tmp_path):
    facts = stacks.attach_facts(str(tmp_path / "python"), 0, scope=0, py_spy="")
    assert not facts["can_attach"] and "py-spy is not installed" in facts["why"]


def test_the_file_capability_is_read_from_its_xattr():
    assert stacks.permitted_caps(CAP_SYS_PTRACE_EP) >> stacks.CAP_SYS_PTRACE & 1
    assert not stacks.permitted_caps(struct.pack("<5I", 0x02000001, 1 << 12, 0, 0, 0)) >> 19 & 1
    assert stacks.permitted_caps(b"\x01") == 0  # garbled: no capability


SLEEPER = """
import time
print("ready", flush=True)
def wait_here():
    time.sleep(120)
wait_here()
"""


def test_a_rank_dumps_its_own_stack_on_sigusr1_and_a_shadowed_sitecustomize_still_runs(
        tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text(
        "import os\nopen(os.environ['MARK'], 'w').write('ran')\n")
    env = dict(os.environ, PYTHONPATH=str(theirs), MARK=str(tmp_path / "mark"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    stacks.install_hook(str(run_dir), env)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(run_dir / stacks.HOOK_DIR), str(theirs)]
    rank_dir = tmp_path / "rank0"
    rank_dir.mkdir()
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    with open(rank_dir / "stdout.log", "w") as out, open(rank_dir / "stderr.log", "w") as err:
        proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=out, stderr=err)
    try:
        deadline = time.monotonic() + 60
        while "ready" not in (rank_dir / "stdout.log").read_text():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        texts = stacks.faulthandler_dumps({0: (proc.pid, 0)}, {0: str(rank_dir)})
    finally:
        proc.kill()
        proc.wait()
    assert "most recent call first" in texts[0]
    assert 'in wait_here' in texts[0] and "sleeper.py" in texts[0]
    assert (tmp_path / "mark").read_text() == "ran"
