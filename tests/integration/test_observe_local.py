"""actions=observe through the real playbooks (issue 65): a fatal hardware event on a host in
three runs in a row, past quarantine_score. In observe every judge runs and records, and
torchfleet itself does nothing: each run goes on to its own end, the host stays in every run
(a spare is there to take its place), and train.json lists each would-be action with done
false. The ranks run steps_notorch.py (the control plane is what is tested: the real torchrun
through the real agents, the real kernel_log watch); the Xid 79 is the kernel's own line
(tests/fixtures/kmsg/xid79-aer.gpu-burn.txt) delivered to node1's kernel_log file."""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.conftest import FIXTURES, ROOT, run_processes
from tests.integration.playbook import BIN, local_inventory
from lab.ports import free_port
from torchfleet import ansible_cli

# Three runs of torch-free ranks: about 35 s here, in the fast tier (the judge's own cases are
# tests/unit/test_observe.py).
pytestmark = pytest.mark.integration

XID79 = (FIXTURES / "kmsg" / "xid79-aer.gpu-burn.txt").read_text().splitlines()[-1]


def observed_run(tmp_path, inventory, n):
    """One train.yml run in observe on node0..node2 (nnodes=2, spares=1): once node1's ranks
    step, its kernel log gets the Xid 79; once the master recorded what it would have done,
    the ranks are told to end. Returns train.json."""
    run_id, kmsg, stop = "observe-%d-%d" % (tmp_path.stat().st_ino, n), tmp_path / "kmsg", \
        tmp_path / ("stop%d" % n)
    kmsg.mkdir(exist_ok=True)
    remote = tmp_path / "remote"
    argv = [*ansible_cli.command("ansible-playbook"), "train.yml", "-i", str(inventory),
            "-e", "nnodes=2", "-e", "spares=1", "-e", "actions=observe",
            "-e", "master_port=%d" % free_port(), "-e", "run_id=%s" % run_id,
            "-e", "run_dir=%s" % (tmp_path / "runs" / run_id),
            "-e", "remote_runs_root=%s" % remote,
            "-e", "kernel_log=%s/{{ inventory_hostname }}.log" % kmsg,
            "-e", "script=%s" % (FIXTURES / "scripts" / "steps_notorch.py"),
            "-e", json.dumps({"script_args": [str(stop)]})]
    env = {"PATH": "%s:/usr/bin:/bin" % BIN, "ANSIBLE_NOCOLOR": "1", "HOME": str(tmp_path)}
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 240
        logs = remote / run_id
        while not any("step 3" in p.read_text(errors="replace")
                      for p in logs.glob("node1/logs/**/stdout.log")):
            assert time.monotonic() < end and proc.poll() is None, proc.poll()
            time.sleep(0.1)
        with open(kmsg / "node1.log", "a") as f:
            f.write(XID79 + "\n")
        # The master's record says it would have stopped the run, and the run goes on.
        while not any('"action": "stop"' in p.read_text(errors="replace")
                      for p in logs.glob("*/control.json")):  # (the live record)
            assert time.monotonic() < end and proc.poll() is None, proc.poll()
            time.sleep(0.1)
        stop.touch()
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-4000:]
    assert run_processes(run_id) == []
    return json.loads((tmp_path / "runs" / run_id / "train.json").read_text())


def test_observe_does_nothing_to_a_host_with_a_fatal_xid_in_three_runs_and_lists_it(tmp_path):
    inventory = local_inventory(tmp_path, {"node0": {}, "node1": {}, "node2": {}})
    for n in range(3):
        report = observed_run(tmp_path, inventory, n)
        assert report["ok"] is True and report["phase"] == "succeeded", report["verdict"]
        assert [h["host"] for h in report["hosts"]] == ["node0", "node1"]  # node1 stays
        assert report["drain"] == []
        would = [(a["action"], a["host"], a["check"], a["done"]) for a in report["actions"]]
        assert ("stop", "node1", "run.hardware", False) in would
        assert all(not a["done"] for a in report["actions"])
        assert "actions=observe: would have stopped node1 (run.hardware)" in report["verdict"]
    # 3 Xid 79s (1.5 each) are past quarantine_score 2.5 from the second run on: the ledger
    # would have quarantined node1 (and preflight then left it out); it did neither.
    assert ("quarantine", "node1", "host.quarantined", False) in would
    assert not [c for c in report["checks"] if c["id"] == "host.quarantined"]
