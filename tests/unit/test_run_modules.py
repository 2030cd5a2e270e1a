"""The modules of a launched run, each on its own, with a real torchrun (one rank per node):
torchrun_job (the host's agent) starts it, torchrun_watch looks at it on the master,
torchrun_stop ends it, rank_results packs what it left (stopping it first when asked),
run_summary decides how it ended. Two agents on this machine show the hosts stopping each other
without a controller.

torchrun_job blocks until torchrun exits (Ansible runs it async), so here it runs in a child
process of its own, as under Ansible's async wrapper.

The ranks import no torch: the control plane is under test (tests/fixtures/README.md says
what torch costs a rank). One case keeps real torch ranks, because a broken gloo connection
is its subject: a rank's own exit named though its sibling is slow to stop (slow_sibling.py).
"""
from __future__ import annotations

import base64
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import agent, control, runstate
from ansible_collections.torchfleet.fleet.plugins.modules import rank_results
from ansible_collections.torchfleet.fleet.plugins.modules import run_summary
from ansible_collections.torchfleet.fleet.plugins.modules import torchrun_stop
from ansible_collections.torchfleet.fleet.plugins.modules import torchrun_watch

from tests.unit.modules import run_module
from tests.conftest import FIXTURES
from lab.ports import free_port

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
import importlib, json, sys
from ansible.module_utils.testing import patch_module_args
module = importlib.import_module("ansible_collections.torchfleet.fleet.plugins.modules." + sys.argv[1])
with patch_module_args(json.loads(sys.argv[2])):
    module.main()
"""


def agent_args(tmp_path, run_id, host="node0", node_rank=0, nnodes=1, ports=None, **extra):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    master_port, control_port = ports or (free_port(), free_port())
    args = {"run_dir": str(tmp_path / "runs" / run_id / host), "run_id": run_id, "host": host,
            "node_rank": node_rank, "python": sys.executable, "script": str(script),
            "script_args": [str(tmp_path / ("go-" + run_id))], "nnodes": nnodes,
            "nproc_per_node": 1, "master_addr": "127.0.0.1", "master_port": master_port,
            "control_port": control_port, "local_addr": "127.0.0.1",
            # The master holds the run's secret; every other host only its own key.
            "secret": "unit-secret" if node_rank == 0 else
            control.host_key(b"unit-secret", host).decode(),
            "lost_after_s": 30, "hosts": ["node%d" % i for i in range(nnodes)]}
    args.update(extra)
    return args


def start_agent(args):
    """torchrun_job in a child process, as under Ansible's async wrapper."""
    return subprocess.Popen(
        [sys.executable, "-c", BOOT, "torchrun_job", json.dumps(args)], stdout=subprocess.PIPE, text=True)


class Run:
    """One torchfleet run on this machine: the master's torchrun_job in a child process."""

    def __init__(self, tmp_path, run_id):
        self.run_id = run_id
        args = agent_args(tmp_path, run_id)
        self.dir, self.go = Path(args["run_dir"]), Path(args["script_args"][0])
        self.job = start_agent(args)

    def watch(self, capsys, **extra):
        return run_module(torchrun_watch, {"run_dir": str(self.dir), "run_id": self.run_id,
                                           **extra}, capsys)

    def wait_running(self, capsys):
        """The first look that shows the rank alive and past its first print (a rank can be
        alive for a moment before its interpreter has written anything)."""
        deadline = time.monotonic() + 120
        look = None
        while time.monotonic() < deadline:
            look = self.watch(capsys)
            summary = look["summary"]
            if (look["state"] == "running" and summary["ranks_alive"] == 1
                    and "started" in summary["last_line"]):
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
    name = re.sub(r"[^A-Za-z0-9._-]", "-", request.node.name[-20:]).strip("_-")
    r = Run(tmp_path, "unit-%d-%s" % (os.getpid(), name))
    yield r
    r.close()


def test_watch_sees_the_run_start_then_waits_on_the_host_until_it_exits(run, capsys):
    look = run.wait_running(capsys)
    pid = json.loads((run.dir / "torchrun.pid").read_text())["pid"]
    with open("/proc/%d/cmdline" % pid, "rb") as f:  # the recorded PID is torchrun
        assert b"torch.distributed.run" in f.read()
    assert [(h["host"], h["node_rank"], h["ranks"]) for h in
            run.watch(capsys, full=True)["record"]["hosts"]] == [("node0", 0, [0, 0])]
    # Still running: the look waits wait_s on the host, then says so.
    assert run.watch(capsys, wait_s=0.5)["state"] == "running"
    # The run ends 1 s into a 60 s wait: the look answers then, not at the end of the wait.
    threading.Timer(1.0, run.go.touch).start()
    begin = time.monotonic()
    look = run.watch(capsys, wait_s=60)
    assert look["state"] in ("succeeded", "final") and look["summary"]["failure"] is None
    assert time.monotonic() - begin < 30
    job = run.job_result()
    assert job["rc"] == 0 and job["reason"] == "exited"
    argv = job["argv"]
    assert argv[argv.index("--rdzv-backend") + 1] == "static"
    assert argv[argv.index("--node-rank") + 1] == "0" and run.run_id in argv
    # A restart's attempt rendezvouses under its own id.
    assert argv[argv.index("--rdzv-id") + 1] == run.run_id
    assert agent.rdzv_id(run.run_id, 2) == run.run_id + "-attempt2"
    record = run.watch(capsys, full=True)["record"]
    assert record["final"] and record["phase"] == "succeeded"
    # A final record comes with every look: the watcher takes it without another one.
    assert run.watch(capsys)["record"] == record
    assert "unit-secret" not in json.dumps(record) and "unit-secret" not in json.dumps(job)


def test_job_refuses_a_missing_script_and_a_file_name_that_climbs(tmp_path, capsys):
    from ansible_collections.torchfleet.fleet.plugins.modules import torchrun_job

    base = agent_args(tmp_path, "r1")
    missing = run_module(torchrun_job, dict(base, script="/nonexistent/train.py"), capsys)
    assert missing["failed"]
    assert "/nonexistent/train.py does not exist on node0" in missing["msg"]
    climbing = run_module(torchrun_job, dict(base, script="x.py", files={"../x.py": "1"}), capsys)
    assert climbing["failed"] and "must be a plain name" in climbing["msg"]
    assert not (tmp_path / "x.py").exists()


def test_a_control_port_in_use_is_named_before_torchrun_starts(tmp_path, capsys):
    from ansible_collections.torchfleet.fleet.plugins.modules import torchrun_job

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        args = agent_args(tmp_path, "r2", ports=(free_port(), holder.getsockname()[1]))
        result = run_module(torchrun_job, args, capsys)
    assert result["failed"] and "cannot listen on its control port" in result["msg"]
    assert "control_port" in result["msg"] and not Path(args["run_dir"], "torchrun.pid").exists()


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
    assert run.watch(capsys, wait_s=30)["summary"]["hosts_done"] == 1
    again = run_module(torchrun_stop, {"runs_root": str(tmp_path / "runs"),
                                       "run_id": run.run_id}, capsys)
    assert (again["changed"], again["stopped"], again["async_removed"]) == (False, [], None)


@pytest.mark.parametrize("bad, said", [
    ({"run_id": "*"}, "run_id '*' is not a torchfleet run id"),
    ({"run_id": "../runs"}, "is not a torchfleet run id"),
    ({"host_dir": ".."}, "host_dir '..' is not an inventory host's directory name"),
    ({"grace_s": -1}, "grace_s must be 0 or more"),
    ({"async_jid": "../x"}, "not an Ansible async job id"),
], ids=["glob", "path", "host_dir", "grace", "jid"])
def test_stop_checks_every_argument_before_it_signals_anything(run, tmp_path, capsys, bad,
                                                               said):
    run.wait_running(capsys)
    args = {"runs_root": str(tmp_path / "runs"), "run_id": run.run_id, "host_dir": "node0"}
    result = run_module(torchrun_stop, dict(args, **bad), capsys)
    assert result["failed"] and said in result["msg"] and "nothing was stopped" in result["msg"]
    assert "stopped" not in result
    # The run is untouched: it still finishes by itself.
    run.go.touch()
    assert run.job_result()["rc"] == 0


def test_stop_refuses_a_job_id_that_is_a_path(tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    result = run_module(torchrun_stop, {"runs_root": str(tmp_path / "runs"),
                                        "async_jid": "../victim",
                                        "async_dir": str(tmp_path / "async")}, capsys)
    assert result["failed"] and "not an Ansible async job id" in result["msg"]
    assert victim.read_text() == "keep me"


def test_rank_results_with_stop_stops_the_run_first_then_packs_what_it_left(run, tmp_path,
                                                                          capsys):
    run.wait_running(capsys)
    stop = {"runs_root": str(tmp_path / "runs"), "run_id": run.run_id, "host_dir": "node0",
            "grace_s": 5}
    refused = run_module(rank_results, {"run_dir": str(run.dir), "stop": dict(stop, run_id="*")},
                         capsys)
    assert refused["failed"] and "nothing was stopped" in refused["msg"]
    assert run.watch(capsys)["summary"]["ranks_alive"] == 1
    packed = run_module(rank_results, {"run_dir": str(run.dir), "stop": stop}, capsys)
    assert packed["changed"] and [s["run_id"] for s in packed["stopped"]] == [run.run_id]
    assert run.job_result()["rc"] != 0  # torchrun was signalled
    # The rank was stopped before it wrote a result: none is invented; its log came back.
    assert packed["results"] == []
    stdout = {f["path"]: f for f in packed["files"]}["attempt_0/0/stdout.log"]
    assert "rank 0 started" in base64.b64decode(stdout["content"]).decode()


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
    from ansible_collections.torchfleet.fleet.plugins.module_utils.run.runstate import RunState

    state = RunState("r1", ["node0", "node1"], 1, now=100.0)
    state.beat("node0", 101.0)
    state.beat("node1", 101.0)
    state.exited("node1", 102.5, 1)
    state.exited("node0", 103.0, -15, stopped=True)
    (tmp_path / "run_state.json").write_text(json.dumps(state.record()))
    ranks = {"node0": {"results": [{"rank": 0, "host": "node0", "local_rank": 0, "ok": True}]},
             "node1": {"results": []}}
    summary = run_module(run_summary, {
        "kind": "train", "run_id": "r1", "hosts": ["node0", "node1"],
        "ranks": ranks, "world_size": 2, "settings": {"nproc_per_node": 1},
        "run_dir": str(tmp_path)}, capsys)
    assert summary["ok"] is False
    failed = {(c["id"], c["host"]) for c in summary["failures"]}
    assert failed == {("run.exit", "node0"), ("run.exit", "node1"), ("rank.missing", "controller")}
    assert {c["id"]: c["detail"] for c in summary["failures"]}["rank.missing"] == \
        "no result from rank(s) 1"
    assert summary["first_failure"]["host"] == "node1"
    report = json.loads((tmp_path / "train.json").read_text())
    assert [(h["host"], h["node_rank"], h["ranks"], h["outcome"]) for h in report["hosts"]] == [
        ("node0", 0, [0], "aborted"), ("node1", 1, [1], "failed")]
    assert [(r["rank"], r["state"]) for r in report["ranks"]] == [(0, "stopped"),
                                                                  (1, "stopped")]
    assert "NODE_RANK" in summary["table"]


def test_the_failed_ranks_code_comes_from_the_judge_when_torchrun_was_stopped_before_saying_it(
        tmp_path, capsys):
    # The abort stopped node1's torchrun (-9) before it printed its failure summary: the rank's
    # own exit code 3 is the record's, read as the rank died (test_api_local's flake, loaded).
    from ansible_collections.torchfleet.fleet.plugins.module_utils.run.runstate import RunState

    state = RunState("r1", ["node0", "node1"], 1, now=100.0)
    state.beat("node0", 101.0)
    state.beat("node1", 101.0)
    state.exited("node1", 102.5, -9, root_cause={"rank": 1, "local_rank": 0, "exitcode": 3,
                                                 "script_code": 3, "at_exit": True})
    state.exited("node0", 103.0, -9, stopped=True)
    (tmp_path / "run_state.json").write_text(json.dumps(state.record()))
    summary = run_module(run_summary, {
        "kind": "train", "run_id": "r1", "hosts": ["node0", "node1"],
        "ranks": {"node0": {"results": []}, "node1": {"results": []}}, "world_size": 2,
        "settings": {"nproc_per_node": 1}, "run_dir": str(tmp_path)}, capsys)
    report = json.loads((tmp_path / "train.json").read_text())
    assert [(r["rank"], r["exit_code"], r["state"]) for r in report["ranks"]] == [
        (0, None, "stopped"), (1, 3, "failed")]
    assert summary["first_failure"]["exit_code"] == 3


def test_a_report_that_cannot_be_written_is_one_sentence_naming_its_directory(tmp_path,
                                                                             capsys):
    (tmp_path / "a-file").write_text("")
    run_dir = tmp_path / "a-file" / "run"  # under a file: not a directory anyone can make
    summary = run_module(run_summary, {
        "kind": "train", "run_id": "r1", "hosts": ["node0"], "ranks": {}, "world_size": 1,
        "settings": {"nproc_per_node": 1}, "run_dir": str(run_dir)}, capsys)
    assert summary["failed"] and "Traceback" not in summary["msg"]
    assert summary["msg"].startswith("cannot write train.json in %s (Not a directory); pass "
                                     "-e run_dir= a directory you can write" % run_dir)


def test_the_watchers_plain_script_look_answers_what_the_module_answers(run, capsys):
    """The action plugin pipes look_script() to the host's Python for each look."""
    from ansible_collections.torchfleet.fleet.plugins.action.torchrun_watch import look_script

    module_look = run.wait_running(capsys)
    args = {"run_dir": str(run.dir), "run_id": run.run_id, "wait_s": 0.0}
    proc = subprocess.run([sys.executable, "-"], input=look_script(args), capture_output=True,
                          text=True, check=True, timeout=60)
    script_look = json.loads(proc.stdout)
    assert script_look["state"] == module_look["state"] == "running"
    assert script_look["summary"]["ranks_alive"] == 1
    assert set(script_look["summary"]) == set(module_look["summary"])
    # A run id with quotes and a newline reaches the look as data, never as code.
    odd = dict(args, run_id="x'\"\n); import os; os._exit(7) #", run_dir=str(run.dir) + "-x")
    proc = subprocess.run([sys.executable, "-"], input=look_script(odd), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and json.loads(proc.stdout)["state"] == "pending"


def _pid_of(args):
    path = Path(args["run_dir"]) / "torchrun.pid"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if path.exists():
            return json.loads(path.read_text())["pid"]
        time.sleep(0.1)
    pytest.fail("no torchrun.pid in %s" % path)


def _record(args):
    try:
        return json.loads((Path(args["run_dir"]) / "control.json").read_text())
    except (OSError, ValueError):
        return None


def _gone_within(pid, timeout_s):
    from ansible_collections.torchfleet.fleet.plugins.module_utils.run.procs import alive

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.05)
    return not alive(pid)


# Rank 1 exits 3 once the file exists; rank 0 would sleep on: the agents stop it. No torch (the
# control plane is under test): torchrun's RANK says which.
FAIL_RANK1 = """
import os, sys, time
rank = int(os.environ["RANK"])
print("rank", rank, "started", flush=True)
if rank == 1:
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
    sys.exit(3)
time.sleep(300)
"""


def test_two_agents_stop_each_other_without_a_controller(tmp_path):
    """node1's rank exits 3; the master's agent hears it and node0's torchrun is stopped."""
    script = tmp_path / "fail1.py"
    script.write_text(FAIL_RANK1)
    ports = (free_port(), free_port())
    run_id = "unit-pair-%d" % os.getpid()
    node0 = agent_args(tmp_path, run_id, "node0", 0, 2, ports, script=str(script))
    node1 = agent_args(tmp_path, run_id, "node1", 1, 2, ports, script=str(script))
    jobs = [start_agent(node0), start_agent(node1)]
    try:
        pids = [_pid_of(node0), _pid_of(node1)]
        logs = Path(node0["run_dir"])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "started" not in "".join(
                p.read_text() for p in logs.glob("logs/*/attempt_0/0/stdout.log")):
            time.sleep(0.2)
        Path(node1["script_args"][0]).touch()  # rank 1 exits 3 now
        assert _gone_within(pids[1], 60)
        failed_at = time.monotonic()
        assert _gone_within(pids[0], 30)
        stopped_s = time.monotonic() - failed_at
        results = [json.loads(j.communicate(timeout=60)[0]) for j in jobs]
    finally:
        for j in jobs:
            j.kill()
    assert [r["reason"] for r in results] == ["aborted", "exited"]
    record = json.loads((logs / "control.json").read_text())
    assert record["final"] and record["failure"]["host"] == "node1"
    assert record["failure"]["root_cause"]["rank"] == 1
    assert [(h["host"], h["state"]) for h in record["hosts"]] == [("node0", "stopped"),
                                                                  ("node1", "exited")]
    # Recorded for the bench's fail-fast figures; the bound here only catches a lost abort.
    assert stopped_s < 20


def test_an_agent_that_loses_the_master_stops_its_torchrun_by_itself(tmp_path):
    """The master's agent is killed (its host frozen, say); node1 stops within lost_after_s."""
    ports = (free_port(), free_port())
    run_id = "unit-lost-%d" % os.getpid()
    node0 = agent_args(tmp_path, run_id, "node0", 0, 2, ports, lost_after_s=3)
    node1 = agent_args(tmp_path, run_id, "node1", 1, 2, ports, lost_after_s=3)
    jobs = [start_agent(node0), start_agent(node1)]
    pid0 = None
    try:
        pid0, pid1 = _pid_of(node0), _pid_of(node1)
        deadline = time.monotonic() + 120
        # node1 has heard the master (a worker that never did waits join_timeout_s instead).
        while time.monotonic() < deadline and (_record(node0) or {}).get("hosts", [{}, {}])[1] \
                .get("state") != "running":
            time.sleep(0.1)
        jobs[0].kill()  # the master's agent; its torchrun dies with it (PR_SET_PDEATHSIG)
        assert _gone_within(pid1, 60)
        result = json.loads(jobs[1].communicate(timeout=60)[0])
        assert result["reason"] == "master_lost"
        assert _gone_within(pid0, 30), "the killed agent's torchrun is still running"
    finally:
        for j in jobs:
            j.kill()
        if pid0:
            from ansible_collections.torchfleet.fleet.plugins.module_utils.run.procs import stop_run

            stop_run(run_id, pid0, grace_s=1, host="node0")




def test_a_ranks_own_exit_is_named_though_its_sibling_is_slow_to_stop(tmp_path):
    """node1's rank 3 exits 3; node0's ranks die of it and their torchrun reports first, while
    node1's torchrun still waits for rank 2. node1's agent saw rank 3 die before the abort,
    and rank 3 noted its own exit code: the verdict names node1, rank 3, exited with 3."""
    script = FIXTURES / "scripts" / "slow_sibling.py"
    ports = (free_port(), free_port())
    run_id = "unit-sibling-%d" % os.getpid()
    node0 = agent_args(tmp_path, run_id, "node0", 0, 2, ports, script=str(script),
                       nproc_per_node=2)
    node1 = agent_args(tmp_path, run_id, "node1", 1, 2, ports, script=str(script),
                       nproc_per_node=2)
    jobs = [start_agent(node0), start_agent(node1)]
    try:
        pids = [_pid_of(node0), _pid_of(node1)]
        logs = Path(node1["run_dir"])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "started" not in "".join(
                p.read_text() for p in logs.glob("logs/*/attempt_0/1/stdout.log")):
            time.sleep(0.2)
        Path(node1["script_args"][0]).touch()
        assert _gone_within(pids[0], 60) and _gone_within(pids[1], 60)
        for j in jobs:
            j.communicate(timeout=60)
    finally:
        for j in jobs:
            j.kill()
    record = _record(node0)
    assert record["final"]
    failure = record["failure"]
    assert (failure["host"], failure["rank"]) == ("node1", 3), record["failures"]
    assert runstate.failure_text(failure).startswith("node1, rank 3 exited with 3"), failure
    assert not failure["consequence"]


# A rank that did its work, then dies of SIGABRT while its interpreter shuts down (a global's
# finalizer aborts, after the exit handlers, as a process group never destroyed does); with an
# argument, its script ended with sys.exit(3) first.
ABORT_AT_EXIT = """
import os, sys
class ProcessGroup:
    def __del__(self):
        os.abort()
pg = ProcessGroup()
print("result written", flush=True)
if sys.argv[2:] == ["3"]:
    sys.exit(3)
"""


@pytest.mark.parametrize("code, words", [
    (None, "node0, rank 0 ended its script, then died of SIGABRT at interpreter exit (-6): "
           "its process group was never destroyed"),
    ("3", "node0, rank 0 exited with 3 (then SIGABRT at interpreter exit)")])
def test_an_abort_at_interpreter_exit_says_so_and_keeps_the_scripts_own_code(tmp_path, code,
                                                                            words):
    script = tmp_path / "abort_at_exit.py"
    script.write_text(ABORT_AT_EXIT)
    args = agent_args(tmp_path, "unit-abort-%s-%d" % (code, os.getpid()), script=str(script))
    args["script_args"] = ["-", code] if code else []
    job = start_agent(args)
    try:
        job.communicate(timeout=120)
    finally:
        job.kill()
    failure = _record(args)["failure"]
    assert failure["exitcode"] == -6 and runstate.failure_text(failure).startswith(words), \
        failure
