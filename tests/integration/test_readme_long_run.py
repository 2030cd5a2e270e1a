"""The README's long-run flow on the embedded default inventory, typed as a user types it from
the repository's root with the default runs root (runs/): a detached run, two attaches that
follow it beside the controller's unattended finisher (`torchfleet attach ID` and
`ansible-playbook attach.yml -e run_id=ID`), the finisher killed mid-run (an attach takes its
part over from the record), and `ansible-playbook stop.yml -e run_id=ID`. Every attach ends with
the one report's verdict and its exit status. The ranks run steps_notorch.py (the control plane is
under test: torchrun and the agents are real, the ranks import no torch)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time

import pytest

from ansible_collections.torchfleet.fleet.plugins.module_utils.run import detach

from lab.ports import free_port
from tests.conftest import FIXTURES, ROOT, end_unattended, parent_of, run_processes
from tests.integration.playbook import BIN
from torchfleet import ansible_cli

# slow: docs/testing.md's tiers (bash tests/run --all, or --touching a source it covers)
pytestmark = [pytest.mark.integration, pytest.mark.slow]
ENV = dict(os.environ, PATH="%s:%s" % (BIN, os.environ.get("PATH", "")), ANSIBLE_NOCOLOR="1")


def typed(*argv, background=False):
    """A command as typed in a shell at the repository's root."""
    if background:
        return subprocess.Popen(argv, cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    return subprocess.run(argv, cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)


def wait_until(condition, timeout_s):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.2)
    return False


def lock_holder(run_dir):
    try:
        return json.loads((run_dir / "attach.lock").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


def test_the_readme_long_run_flow_with_attaches_beside_the_finisher(tmp_path):
    go = tmp_path / "go"
    started = typed(*ansible_cli.command("ansible-playbook"), "train.yml", "-e", "nnodes=2", "-e", "detach=true",
                    "-e", "script=%s" % (FIXTURES / "scripts" / "steps_notorch.py"),
                    "-e", json.dumps({"script_args": [str(go)]}),
                    "-e", "master_port=%d" % free_port())
    assert started.returncode == 0, started.stdout[-3000:]
    run_id = re.search(r"run (\S+) is detached", started.stdout).group(1)
    run_dir = ROOT / "runs" / run_id
    followers = []
    try:
        assert wait_until(lambda: lock_holder(run_dir) is not None, 120)
        progress = run_dir / "progress.jsonl"
        followers = [typed(str(BIN / "torchfleet"), "attach", run_id, background=True),
                     typed(*ansible_cli.command("ansible-playbook"), "attach.yml", "-e", "run_id=%s" % run_id,
                           background=True)]
        # Both follow beside the finisher (they wait, and the finisher keeps watching).
        def size():
            return progress.stat().st_size if progress.exists() else 0
        before = size()
        assert wait_until(lambda: size() > before + 200, 60)
        assert all(f.poll() is None for f in followers)
        # The owner killed mid-run: one attach takes over its part from the record.
        end_unattended(run_dir)
        attaches = {f.pid for f in followers}

        def taken_over():  # the lock holds an attach's ansible-playbook (the CLI's child)
            pid = lock_holder(run_dir)
            try:
                return pid in attaches or parent_of(pid) in attaches
            except (OSError, TypeError):
                return False
        assert wait_until(taken_over, 60), lock_holder(run_dir)
        end = typed(*ansible_cli.command("ansible-playbook"), "stop.yml", "-e", "run_id=%s" % run_id)
        assert end.returncode == 0, end.stdout[-3000:]
        outs = [f.communicate(timeout=300)[0] for f in followers]
    finally:
        go.touch()
        for f in followers:
            if f.poll() is None:
                os.killpg(f.pid, 9)
                f.communicate()
    report = json.loads((run_dir / "train.json").read_text())
    assert report["ok"] is False and "stopped by the user" in report["verdict"]
    # Each attach ends with that verdict and the exit status of a run that did not succeed.
    for follower, out in zip(followers, outs, strict=True):
        assert follower.returncode != 0 and report["verdict"] in out, out[-3000:]
    assert detach.attached_by(str(run_dir)) == 0  # (a failed owner's play leaves a stale lock)
    # The attach's report counts the wall time from the launching play's first play (the
    # controller's times kept in run.json), not from the agents' start.
    times = json.loads((run_dir / detach.RECORD).read_text())["times"]
    g = report["goodput"]
    assert g["started"] == pytest.approx(float(times["started"]), abs=0.002)
    assert g["buckets"]["preflight"] > 0 and g["failures"][0]["check"] == "run.stopped_by_user"
    assert run_processes(run_id) == []
    shutil.rmtree(run_dir)
