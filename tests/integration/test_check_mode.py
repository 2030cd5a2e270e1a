"""--check is honest: preflight decides and writes its report on the controller and nothing on
any host; train.yml and collective.yml start nothing and say so in one sentence."""
from __future__ import annotations

import pytest

from tests.conftest import run_processes
from tests.integration.playbook import playbook

pytestmark = pytest.mark.integration


def host_dirs(tmp_path):
    """Where a run would write on the default inventory's hosts (this machine), each moved
    under tmp_path so that nothing else running here blurs the picture: run directories,
    Ansible's async job records and its remote temporary files."""
    dirs = {"remote_runs_root": tmp_path / "remote", "ansible_async_dir": tmp_path / "async",
            "ansible_remote_tmp": tmp_path / "rtmp"}
    extra = [a for name, d in dirs.items() for a in ("-e", "%s=%s" % (name, d))]
    return extra, lambda: sorted(str(p) for d in dirs.values() if d.exists()
                                 for p in d.rglob("*"))


def test_preflight_check_writes_nothing_on_any_host(tmp_path):
    extra, host_files = host_dirs(tmp_path)
    run = playbook("preflight.yml", tmp_path, "--check", *extra)
    assert run.rc == 0, run.out[-3000:]
    assert run.report()["ok"] is True  # the verdict is what a --check run is for
    assert run.recap() and all(row["changed"] == 0 for row in run.recap().values())
    assert host_files() == []


def test_a_check_run_starts_nothing_and_says_so(tmp_path):
    # train.yml here; collective.yml runs the same launch role, and the same first task of it.
    name = "train.yml"
    extra, host_files = host_dirs(tmp_path)
    run = playbook(name, tmp_path, "--check", *extra)
    assert run.rc == 0, run.out[-3000:]
    assert "--check: preflight checked every host above; nothing was started on any host" in run.out
    run_id = run.report()["run_id"]
    assert run_processes(run_id) == []
    assert not (run.run_dir / "train.json").exists()
    assert not (run.run_dir / "collective.json").exists()
    assert host_files() == []
