"""The modules of a launched run, each on its own, with a real torchrun (one node, one rank):
torchrun_job starts it, torchrun_watch looks at it, torchrun_stop ends it, rank_results packs
what it left, run_summary decides how it ended.

torchrun_job blocks until torchrun exits (Ansible runs it async), so here it runs in a child
process of its own, as under Ansible's async wrapper.
"""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time

import pytest
import rank_results
import run_summary
import torchrun_stop
import torchrun_watch
from ansible.module_utils.torchfleet import watch

from tests.conftest import ROOT
from tests.unit.modules import run_module
from tests.unit.test_listener import free_port

# The rank waits for a file to appear (the test decides when the run ends), reports, exits 0.
RANK = """
import json, os, sys, time
go = sys.argv[1]
print("rank", os.environ["RANK"], "started", flush=True)
deadline = time.monotonic() + 120
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.05)
out = os.environ["TORCHFLEET_OUT_DIR"]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "rank-%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({"rank": int(os.environ["RANK"]), "host": os.environ["TORCHFLEET_HOST"],
               "local_rank": 0, "ok": True}, f)
print("rank", os.environ["RANK"], "done", flush=True)
"""

# Runs a module's main() in this child process, as AnsiballZ would on the host.
BOOT = """
import json, sys
import ansible.module_utils
from ansible.module_utils.testing import patch_module_args
ansible.module_utils.__path__.append(sys.argv[1])
sys.path.insert(0, sys.argv[2])
module = __import__(sys.argv[3])
with patch_module_args(json.loads(sys.argv[4])):
    module.main()
"""


class Run:
    """One torchfleet run on this machine: torchrun_job in a child process."""

    def __init__(self, tmp_path, run_id):
        self.run_id, self.dir = run_id, tmp_path / "runs" / run_id / "node0"
        self.go = tmp_path / ("go-" + run_id)
        script = tmp_path / "rank.py"
        script.write_text(RANK)
        args = {"run_dir": str(self.dir), "run_id": run_id, "python": sys.executable,
                "script": str(script), "script_args": [str(self.go)], "nnodes": 1,
                "nproc_per_node": 1, "master_addr": "127.0.0.1", "master_port": free_port(),
                "local_addr": "127.0.0.1", "env": {"TORCHFLEET_HOST": "node0"}}
        self.job = subprocess.Popen(
            [sys.executable, "-c", BOOT, str(ROOT / "module_utils"), str(ROOT / "library"),
             "torchrun_job", json.dumps(args)], stdout=subprocess.PIPE, text=True)

    def watch(self, capsys, **extra):
        return run_module(torchrun_watch, {"run_dir": str(self.dir), "run_id": self.run_id,
                                           **extra}, capsys)

    def wait_running(self, capsys):
        """The first look that shows the rank alive and past its first print (a rank can be
        alive for a moment before its interpreter has written anything)."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            look = self.watch(capsys)
            if look["state"] == "running" and any(
                    r["alive"] and "started" in r["last_line"] for r in look["ranks"]):
                return look
            assert look["state"] in ("pending", "running"), look
            time.sleep(0.2)
        pytest.fail("torchrun never ran, or its rank never printed: %s" % look)

    def job_result(self):
        out, _ = self.job.communicate(timeout=60)
        return json.loads(out)

    def close(self):
        self.go.touch()
        if self.job.poll() is None:
            self.job.kill()
            self.job.wait()


@pytest.fixture
def run(tmp_path, request):
    r = Run(tmp_path, "unit-%d-%s" % (os.getpid(), request.node.name[-20:].strip("_")))
    yield r
    r.close()


def test_watch_sees_the_run_start_then_waits_on_the_host_until_it_exits(run, capsys):
    look = run.wait_running(capsys)
    with open("/proc/%d/cmdline" % look["pid"], "rb") as f:  # the recorded PID is torchrun
        assert b"torch.distributed.run" in f.read()
    assert [(r["local_rank"], r["rank"]) for r in look["ranks"]] == [(0, 0)]
    # Still running: the look waits wait_s on the host, then says so.
    assert run.watch(capsys, wait_s=0.5)["state"] == "running"
    # The run ends 1 s into a 60 s wait: the look answers then, not at the end of the wait.
    threading.Timer(1.0, run.go.touch).start()
    begin = time.monotonic()
    look = run.watch(capsys, wait_s=60)
    assert look["state"] == "exited" and look["rc"] == 0
    assert time.monotonic() - begin < 30
    assert look["root_cause"] is None
    job = run.job_result()
    assert job["rc"] == 0 and job["reason"] == "exited"
    assert "--rdzv-id" in job["argv"] and run.run_id in job["argv"]


def test_job_refuses_a_missing_script_and_a_file_name_that_climbs(tmp_path, capsys):
    import torchrun_job

    base = {"run_dir": str(tmp_path / "r"), "run_id": "r1", "python": sys.executable,
            "nnodes": 1, "nproc_per_node": 1, "master_addr": "127.0.0.1", "master_port": 1,
            "local_addr": "127.0.0.1"}
    missing = run_module(torchrun_job, dict(base, script="/nonexistent/train.py"), capsys)
    assert missing["failed"] and "/nonexistent/train.py does not exist" in missing["msg"]
    climbing = run_module(torchrun_job, dict(base, script="x.py", files={"../x.py": "1"}), capsys)
    assert climbing["failed"] and "must be a plain name" in climbing["msg"]
    assert not (tmp_path / "x.py").exists()


def test_stop_ends_the_run_and_removes_its_async_record_once_final(run, tmp_path, capsys):
    run.wait_running(capsys)
    async_dir = tmp_path / "async"
    async_dir.mkdir()
    record = async_dir / "j1234.5678"
    # What the async wrapper wrote when the job started; it writes the final result later.
    record.write_text(json.dumps({"started": True, "finished": False}))
    threading.Timer(1.0, record.write_text, (json.dumps({"rc": -15, "changed": True}),)).start()
    result = run_module(torchrun_stop, {"runs_root": str(tmp_path / "runs"),
                                        "run_id": run.run_id, "host_dir": "node0",
                                        "grace_s": 5, "async_jid": "j1234.5678",
                                        "async_dir": str(async_dir)}, capsys)
    assert result["changed"] and [s["run_id"] for s in result["stopped"]] == [run.run_id]
    assert result["async_removed"] == str(record) and not record.exists()
    assert run.job_result()["rc"] != 0  # torchrun was signalled
    assert run.watch(capsys)["state"] == "exited"
    again = run_module(torchrun_stop, {"runs_root": str(tmp_path / "runs"),
                                       "run_id": run.run_id}, capsys)
    assert (again["changed"], again["stopped"], again["async_removed"]) == (False, [], None)


def test_stop_refuses_a_job_id_that_is_a_path(tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    result = run_module(torchrun_stop, {"runs_root": str(tmp_path / "runs"),
                                        "async_jid": "../victim",
                                        "async_dir": str(tmp_path / "async")}, capsys)
    assert result["failed"] and "not an Ansible async job id" in result["msg"]
    assert victim.read_text() == "keep me"


def test_rank_results_packs_results_and_logs_and_truncates_long_logs(run, capsys):
    run.wait_running(capsys)
    run.go.touch()
    assert run.job_result()["rc"] == 0
    packed = run_module(rank_results, {"run_dir": str(run.dir), "max_log_bytes": 64}, capsys)
    assert packed["results"] == [{"rank": 0, "host": "node0", "local_rank": 0, "ok": True}]
    files = {f["path"]: f for f in packed["files"]}
    assert {"torchrun.log", "exitcode.json", "attempt_0/0/stdout.log"} <= set(files)
    stdout = files["attempt_0/0/stdout.log"]
    assert base64.b64decode(stdout["content"]).decode().endswith("rank 0 done\n")
    log = files["torchrun.log"]
    assert log["truncated"] and len(base64.b64decode(log["content"])) == 64 < log["size"]


def test_run_summary_names_the_failed_host_and_the_missing_rank(tmp_path, capsys):
    watches = {"node0": {"outcome": "succeeded", "watch": {"rc": 0, "elapsed_s": 3.0}},
               "node1": {"outcome": "failed", "watch": {"rc": 1, "elapsed_s": 2.5},
                         "abort": {"host": "node1", "reason": "failed", "rc": 1}}}
    ranks = {"node0": {"results": [{"rank": 0, "host": "node0", "local_rank": 0, "ok": True}]},
             "node1": {"results": []}}
    summary = run_module(run_summary, {
        "kind": "train", "run_id": "r1", "hosts": ["node0", "node1"], "watches": watches,
        "ranks": ranks, "world_size": 2, "settings": {"nproc_per_node": 1},
        "run_dir": str(tmp_path)}, capsys)
    assert summary["ok"] is False
    failed = {(c["id"], c["host"]) for c in summary["failures"]}
    assert failed == {("run.exit", "node1"), ("rank.missing", "controller")}
    assert {c["id"]: c["detail"] for c in summary["failures"]}["rank.missing"] == \
        "no result from rank(s) 1"
    report = json.loads((tmp_path / "train.json").read_text())
    assert [h["outcome"] for h in report["hosts"]] == ["succeeded", "failed"]
    assert [(r["rank"], r["state"]) for r in report["ranks"]] == [(0, "succeeded"),
                                                                  (None, "stopped")]


def test_a_torchrun_that_is_exiting_is_exited_not_pending(tmp_path, monkeypatch):
    """Between releasing its memory and becoming a zombie, an exiting process is alive with an
    empty command line (a kernel window too short to hit on demand, so the two /proc reads are
    substituted here; CI once caught the look calling it 'pending')."""
    run_dir = tmp_path / "node0"
    run_dir.mkdir()
    (run_dir / "torchrun.pid").write_text(json.dumps({"pid": 4242, "run_id": "r1",
                                                      "started": time.time()}))
    monkeypatch.setattr(watch, "is_run_torchrun", lambda pid, run_id: False)
    monkeypatch.setattr(watch, "alive", lambda pid: True)
    monkeypatch.setattr(watch, "cmdline", lambda pid: "")
    threading.Timer(0.3, (run_dir / "exitcode.json").write_text,
                    (json.dumps({"rc": 0, "reason": "exited", "ended": time.time()}),)).start()
    params = {"run_dir": str(run_dir), "run_id": "r1", "async_jid": None}
    pidfile = json.loads((run_dir / "torchrun.pid").read_text())
    state, _, exit_info = watch.run_state(params, pidfile)
    assert (state, exit_info["rc"]) == ("exited", 0)
    # A live PID that still shows another command line has not become torchrun yet.
    monkeypatch.setattr(watch, "cmdline", lambda pid: "/usr/bin/python3 job.py")
    (run_dir / "exitcode.json").unlink()
    assert watch.run_state(params, pidfile)[0] == "pending"


def test_the_watchers_plain_script_look_answers_what_the_module_answers(run, capsys):
    """The action plugin pipes look_script() to the host's Python for each look."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "torchrun_watch_action", ROOT / "action_plugins" / "torchrun_watch.py")
    action = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(action)
    look_script = action.look_script
    module_look = run.wait_running(capsys)
    args = {"run_dir": str(run.dir), "run_id": run.run_id, "wait_s": 0.0}
    proc = subprocess.run([sys.executable, "-"], input=look_script(args), capture_output=True,
                          text=True, check=True, timeout=60)
    script_look = json.loads(proc.stdout)
    assert script_look["state"] == module_look["state"] == "running"
    assert script_look["pid"] == module_look["pid"]
    assert [(r["rank"], r["alive"]) for r in script_look["ranks"]] == [(0, True)]
    # A run id with quotes and a newline reaches the look as data, never as code.
    odd = dict(args, run_id="x'\"\n); import os; os._exit(7) #")
    proc = subprocess.run([sys.executable, "-"], input=look_script(odd), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and json.loads(proc.stdout)["state"] == "pending"
