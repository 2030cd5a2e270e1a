"""The lab as a non-root login (tflab<N>-user on every node), as real clusters log in: the
collective test, a hang with its stacks, and stop, through that user's SSH and venv. The stop's
ranks import no torch (steps_notorch.py: only the control plane is under test; a stop of real
torch ranks is test_launch_local's); the collective and the hang run real torch."""
from __future__ import annotations

import json
import pwd
import shutil
import stat
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from tests.integration.playbook import playbook
from tests.lab.test_reliability_lab import processes_of, start_long_train, wait_until
from lab import netns as labmod
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import stacks

# slow: docs/testing.md's tiers (bash tests/run --all, or --touching a source it covers)
pytestmark = [pytest.mark.lab, pytest.mark.slow]


def user_runs(lab):
    return lab.user_dir / "home" / ".torchfleet" / "runs"


def user_script(lab, name):
    """A test script where the user can read it (the clone may be in root's home)."""
    folder = lab.user_dir / "scripts"
    folder.mkdir(mode=0o755, exist_ok=True)
    path = folder / name
    shutil.copy(FIXTURES / "scripts" / name, path)
    path.chmod(0o644)
    return path


def test_collective_as_a_non_root_user_in_private_run_directories(healthy_lab, tmp_path):
    run = playbook("collective.yml", tmp_path, "-e", "nnodes=2", "-e", "collective_sizes=4K",
                   "-e", "collective_iters=3", inventory=healthy_lab.user_inventory)
    assert run.rc == 0, run.out[-3000:]
    report = run.report("collective.json")
    assert report["ok"] and {h["outcome"] for h in report["hosts"]} == {"succeeded"}
    uid = pwd.getpwnam(labmod.user_name(healthy_lab.tag)).pw_uid
    host_dir = user_runs(healthy_lab) / report["run_id"] / "node0"
    for path in (host_dir, host_dir.parent):  # this host's part and the run's directory
        assert path.stat().st_uid == uid and stat.S_IMODE(path.stat().st_mode) == 0o700
    # What preflight says of py-spy here follows the kernel's rules for this user.
    facts = stacks.attach_facts(str(healthy_lab.user_python), cap_eff=False)  # (uid: not root)
    verdicts = {c["host"]: c["ok"] for c in run.report()["checks"] if c["id"] == "hang.stacks"}
    assert verdicts == {"node0": facts["can_attach"], "node1": facts["can_attach"]}
    # And of the kernel log a run's agent follows for hardware events: kernel.dmesg_restrict.
    restricted = Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() == "1"
    kmsg = {c["host"]: c for c in run.report()["checks"] if c["id"] == "host.kmsg"}
    assert set(kmsg) == ({"node0", "node1"} if restricted else set()), kmsg
    assert all(c["severity"] == "warning" and "dmesg_restrict" in c["hint"]
               for c in kmsg.values())


def test_a_hang_as_a_non_root_user_is_diagnosed_with_stacks(healthy_lab, tmp_path):
    script = user_script(healthy_lab, "hang_rank1.py")
    run = playbook("train.yml", tmp_path, "-e", "nnodes=2", "-e", "script=%s" % script,
                   "-e", "hang_timeout_s=6", inventory=healthy_lab.user_inventory)
    assert run.rc != 0
    report = run.report("train.json")
    assert {h["outcome"] for h in report["hosts"]} == {"hung"}, report["hosts"]
    dumps = sorted(run.run_dir.glob("logs/*/attempt_0/*/py-spy-dump.txt"))
    assert len(dumps) == 2
    texts = [d.read_text() for d in dumps]
    assert any("hang_rank1.py:9" in t or 'hang_rank1.py", line 9' in t for t in texts), texts
    assert wait_until(lambda: not processes_of(report["run_id"]), 60)


def test_stop_as_a_non_root_user(healthy_lab, tmp_path):
    proc, run_id = start_long_train(healthy_lab, tmp_path, inventory=healthy_lab.user_inventory,
                                    runs=user_runs(healthy_lab),
                                    script=user_script(healthy_lab, "steps_notorch.py"))
    try:
        stop = playbook("stop.yml", tmp_path / "stop", "-e", "run_id=%s" % run_id,
                        inventory=healthy_lab.user_inventory)
        assert stop.rc == 0, stop.out[-3000:]
        assert "stopped run(s) %s" % run_id in stop.out
        assert wait_until(lambda: not processes_of(run_id), 60), processes_of(run_id)
    finally:
        proc.kill()
        proc.communicate(timeout=120)
    assert json.loads((user_runs(healthy_lab) / run_id / "node0" / "torchrun.pid")
                      .read_text())["run_id"] == run_id
