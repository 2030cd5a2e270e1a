"""train.yml, collective.yml and stop.yml on the embedded default (two nodes, this machine).

Where only the control plane is under test (a kill, the controller's lease, a rank's exit, a
rerun), the ranks run steps_notorch.py: the real torchrun starts it through the real agents, but
it imports no torch (tests/fixtures/README.md). Real torch ranks stay where torch is the
subject (the built-in workload, collectives, a cascade of broken connections, a hang's stacks
and Flight Recorder) and in one test of each control-plane behaviour: a stop from outside
(test_stop_during_a_run_..., ranks in a gloo all_reduce; also Ctrl-C's, whose test in
tests/api/test_api_local.py runs steps_notorch.py), a rank's exit and fail-fast (the
cascade), a rerun in fork batches and its rank order (the rerun's second run, the built-in
workload); a kill and the lease keep theirs in tests/lab (test_reliability_lab's killed agent,
test_detach_lab's first test)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import procs

from tests.conftest import FIXTURES, run_processes, until_stopped
from tests.integration.playbook import BIN, ROOT, playbook
from lab.ports import free_port
from torchfleet import ansible_cli

pytestmark = pytest.mark.integration
SCRIPTS = FIXTURES / "scripts"
NOTORCH = SCRIPTS / "steps_notorch.py"



def launch(name, tmp_path, *args):
    return playbook(name, tmp_path, "-e", "nnodes=2", "-e", "master_port=%d" % free_port(), *args)


def test_train_builtin_workload_synchronises_gradients(tmp_path):
    run = launch("train.yml", tmp_path, "-e", "train_steps=60")
    assert run.rc == 0, run.out
    report = run.report("train.json")
    assert report["ok"] and report["world_size"] == 2
    assert [h["outcome"] for h in report["hosts"]] == ["succeeded", "succeeded"]
    assert sorted(r["rank"] for r in report["ranks"]) == [0, 1]
    assert ("train.checksum", "controller") in {(c["id"], c["host"]) for c in report["checks"]
                                                if c["ok"]}
    for host in ("node0", "node1"):
        logs = run.run_dir / "logs" / host
        assert (logs / "torchrun.log").exists()
        assert "done: parameter checksum" in (logs / "attempt_0" / "0" / "stdout.log").read_text()
    assert "HOST" in run.out and "succeeded" in run.out
    # Goodput (issue 59), from the first play to the end: nothing failed, nothing was lost.
    g = report["goodput"]
    # (A rank's watcher looks each second: in a run of 60 steps a rank can destroy its process
    # group before a look saw its first collective; init is then unknown and said so.)
    assert 0 < g["ratio"] < 1 and g["failures"] == [] and all(
        "first collective was seen" in u for u in g["unknown"])
    assert sum(g["buckets"].values()) == pytest.approx(g["wall_s"], rel=0.01)
    assert min(g["buckets"][b] for b in ("preflight", "launch", "kept_training")) > 0
    assert g["buckets"]["init"] > 0 or g["unknown"]  # (init unknown: counted as training)
    assert "goodput %d %%; no failure" % round(g["ratio"] * 100) in run.out
    assert run_processes(report["run_id"]) == []


def test_collective_reports_every_op_and_size_exact_with_busbw(tmp_path):
    run = launch("collective.yml", tmp_path, "-e", "collective_sizes=4K,256K",
                 "-e", "collective_iters=5")
    assert run.rc == 0, run.out
    report = run.report("collective.json")
    rows = {(r["op"], r["size_bytes"]): r for r in report["busbw"]}
    ops = {op for op, _ in rows}
    assert ops == {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "gather", "barrier"}
    for (op, size), row in rows.items():
        assert row["wrong"] == 0 and row["ranks"] == 2 and row["missing_ranks"] == 0
        if op != "barrier":
            assert size in (4096, 262144)
            assert 0 < row["busbw_gbs_min"] <= row["busbw_gbs_median"] <= row["busbw_gbs_max"]
            assert row["slowest_host"] in ("node0", "node1")
    assert "busbw(GB/s) min/med/max" in run.out and "reduce_scatter" in run.out


def test_a_cascade_names_the_rank_that_failed_in_every_output(tmp_path):
    """Every rank all-reduces in a loop; rank 3 (node1's second) exits 3; the other ranks die
    of the broken connection, and node0's report reaches the master first. The master's record
    is the one judge: every output names node1, rank 3, exit 3."""
    run = launch("train.yml", tmp_path, "-e", "nproc_per_node=2",
                 "-e", "script=%s" % (SCRIPTS / "cascade_last_rank.py"))
    assert run.rc != 0
    report = run.report("train.json")
    record = json.loads((run.run_dir / "run_state.json").read_text())
    failure = report["first_failure"]
    assert (failure["host"], failure["rank"], failure["exit_code"]) == ("node1", 3, 3), failure
    assert (record["failure"]["host"], record["failure"]["rank"]) == ("node1", 3)
    assert "giving up with exit code 3" in failure["tail"]
    sentence = "train failed: first failure on node1, rank 3: rank 3 exited with 3"
    assert report["verdict"] == sentence and sentence in run.out
    assert {h["host"]: h["outcome"] for h in report["hosts"]} == {"node0": "aborted",
                                                                  "node1": "failed"}
    # Without checkpoint_dir the work the failure cost is unknown, and said so (issue 59).
    g = report["goodput"]
    assert g["buckets"]["lost_work"] is None and "no checkpoint_dir" in g["unknown"][0]
    assert [(f["check"], f["host"]) for f in g["failures"]] == [("run.exit", "node1")]
    assert "lost work unknown (no checkpoint_dir)" in run.out
    assert run_processes(report["run_id"]) == []


@pytest.mark.parametrize("method", ["auto", pytest.param("faulthandler", marks=pytest.mark.slow)])
def test_a_hang_is_diagnosed_with_stacks_then_stopped(tmp_path, method):
    """auto is py-spy here (root); faulthandler is what a user py-spy cannot serve gets: each
    rank dumps its own stack on SIGUSR1."""
    run = launch("train.yml", tmp_path, "-e", "script=%s" % (SCRIPTS / "hang_rank1.py"),
                 "-e", "hang_timeout_s=6", "-e", "stack_dump=%s" % method)
    assert run.rc != 0
    report = run.report("train.json")
    assert {h["outcome"] for h in report["hosts"]} == {"hung"}
    assert ("run.hang", "node0") in {(c["id"], c["host"]) for c in report["checks"]}
    dumps = sorted(run.run_dir.glob("logs/*/attempt_0/*/py-spy-dump.txt"))
    assert len(dumps) == 2
    texts = [d.read_text() for d in dumps]
    line9 = "hang_rank1.py:9" if method == "auto" else 'hang_rank1.py", line 9'
    assert any(line9 in t for t in texts), texts  # the time.sleep line
    assert all(("faulthandler" in t) is (method == "faulthandler") for t in texts), texts
    assert "<module> (hang_rank1.py:9)" in report["first_failure"]["tail"] or method == "auto"
    assert "rank 1 (local rank 0" in report["first_failure"]["tail"]
    # The Flight Recorder's positions name the rank the barrier waits for; its stack says where.
    assert report["verdict"].startswith(
        "train failed: hang at collective #1 (barrier, 0 B, group 0): node1 rank 1 never "
        "joined; it is in <module> (hang_rank1.py:9)"), report["verdict"]
    assert report["first_failure"]["collective"]["missing"] == [
        {"rank": 1, "host": "node1", "seq": -1}]
    assert sorted(p.name for p in run.run_dir.glob("logs/*/attempt_0/*/fr_trace_rank_*")) == [
        "fr_trace_rank_0", "fr_trace_rank_1"]  # torch's own format, beside the stacks
    assert "None" not in report["verdict"] and "?" not in report["verdict"]
    assert run_processes(report["run_id"]) == []


def test_hostile_arguments_and_env_reach_the_script_verbatim(tmp_path):
    canary = tmp_path / "canary"
    hostile = ["; touch %s" % canary, "$(touch %s)" % canary, "`touch %s`" % canary,
               "it's \"quoted\"", "two words", "--looks-like-a-flag", "line\nbreak"]
    extra = {"script": str(SCRIPTS / "echo_args.py"), "script_args": hostile,
             "env": {"TF_HOSTILE": "$(touch %s); `id` | cat" % canary},
             "network": "ethernet"}
    run = launch("train.yml", tmp_path, "-e", json.dumps(extra))
    assert run.rc == 0, run.out
    report = run.report("train.json")
    # The hosts are this machine: read what each rank wrote in its host's run directory.
    remote = Path.home() / ".torchfleet" / "runs" / report["run_id"]
    files = sorted(remote.glob("*/results/echo-*.json"))
    assert len(files) == 2
    for f in files:
        got = json.loads(f.read_text())
        assert got["argv"] == hostile
        assert got["env"]["TF_HOSTILE"] == extra["env"]["TF_HOSTILE"]
        assert got["env"]["NCCL_IB_DISABLE"] == "1" and got["env"]["NCCL_SOCKET_IFNAME"] == "lo"
        assert got["env"]["NCCL_NSOCKS_PERTHREAD"] == "4"  # the preset preflight decided
    assert not canary.exists()
    assert report["settings"]["network"] == "ethernet"


def test_single_node(tmp_path):
    """nnodes=1 trains the built-in workload with real torch (one host, world size 1: the only
    test that trains with torch on a single node)."""
    run = playbook("train.yml", tmp_path, "-e", "nnodes=1", "-e", "train_steps=30",
                   "-e", "master_port=%d" % free_port())
    assert run.rc == 0, run.out
    report = run.report("train.json")
    assert report["world_size"] == 1 and [h["host"] for h in report["hosts"]] == ["node0"]


def ranks(run_id):
    """The run's rank processes: its script's, with the run's id in their environment (the
    ansible-playbook that started the run names both on its command line)."""
    return [pid for pid in procs.run_processes(run_id)
            if "/steps_until_file.py" in procs.cmdline(pid)]


def test_stop_during_a_run_stops_everything_and_never_signals_a_foreign_pid(tmp_path):
    """stop.yml with no run_id stops whatever runs under the hosts' runs root: a root of this
    test's own (the default one's runs are other tests')."""
    env_path = "%s:%s" % (BIN, os.environ.get("PATH", ""))
    log = tmp_path / "train.log"
    run_dir, run_id = tmp_path / "run", "stop-test-%d" % os.getpid()
    remote = ("-e", "remote_runs_root=%s" % (tmp_path / "hosts" / "runs"))
    with open(log, "w") as out:  # a file, not a pipe nobody reads while the play runs
        train = subprocess.Popen(
            [*ansible_cli.command("ansible-playbook"), "train.yml", "-e", "nnodes=2",
             *until_stopped(), "-e", "master_port=%d" % free_port(), "-e",
             "run_dir=%s" % run_dir, "-e", "run_id=%s" % run_id, *remote], cwd=ROOT,
            env=dict(os.environ, PATH=env_path), stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while (time.monotonic() < deadline and train.poll() is None
               and len(ranks(run_id)) < 2):
            time.sleep(1)
        assert len(ranks(run_id)) >= 2, log.read_text()[-3000:]
        # The run's files on a host are its user's alone.
        host_dir = tmp_path / "hosts" / "runs" / run_id / "node0"
        assert host_dir.stat().st_mode & 0o777 == 0o700
        assert host_dir.parent.stat().st_mode & 0o777 == 0o700
        assert (host_dir / "torchrun.pid").stat().st_mode & 0o777 == 0o600
        stop = playbook("stop.yml", tmp_path / "stop", *remote)
        assert stop.rc == 0, stop.out
        assert "stopped run(s)" in stop.out
        train.wait(timeout=120)
    finally:
        train.kill()
    assert train.returncode != 0
    assert run_processes(run_id) == []
    assert (run_dir / "train.json").stat().st_mode & 0o777 == 0o640
    assert run_dir.stat().st_mode & 0o777 == 0o750
    # Stopping again finds nothing, and a run record whose PID now belongs to another process
    # (a recycled PID) is never signalled.
    bystander = subprocess.Popen(["sleep", "120"])
    fake = tmp_path / "hosts" / "runs" / "recycled-pid-test" / "node0"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "torchrun.pid").write_text(json.dumps({
        "pid": bystander.pid, "run_id": "recycled-pid-test", "host": "node0", "argv": [],
        "started": 0}))
    try:
        again = playbook("stop.yml", tmp_path / "again", *remote)
        assert again.rc == 0 and "nothing of torchfleet was running here" in again.out, again.out
        assert bystander.poll() is None
    finally:
        bystander.kill()


def test_a_failing_rank_stops_every_host_then_a_rerun_in_fork_batches_keeps_rank_order(
        tmp_path):
    """Rank 1 exits 3 at its first step, while rank 0 would step on forever: the failure is
    named with its log, and every host is stopped. Then the next run starts clean (the suite
    itself runs back to back), with forks=1: every launch, stop and gather task runs host after
    host; the watch is one task on the master. Rank order is inventory order (c10d's
    rendezvous would sort by address)."""
    failed = launch("train.yml", tmp_path / "a", "-e", "script=%s" % NOTORCH,
                    "-e", json.dumps({"script_args": ["/", "1"]}))  # (/ exists: at once)
    assert failed.rc != 0
    report = failed.report("train.json")
    failure = report["first_failure"]
    assert failure["rank"] == 1 and failure["reason"] == "rank 1 exited with 3"
    assert "giving up with exit code 3" in failure["tail"]
    assert "first failure on %s, rank 1" % failure["host"] in failed.out
    # Rank 0 never ends by itself: the play's end is its stop.
    assert {h["host"]: h["outcome"] for h in report["hosts"]} == {"node0": "aborted",
                                                                  "node1": "failed"}
    assert run_processes(report["run_id"]) == []
    run = launch("train.yml", tmp_path, "-f", "1", "-e", "train_steps=20")
    assert run.rc == 0, run.out
    report = run.report("train.json")
    assert [(h["host"], h["node_rank"], h["ranks"]) for h in report["hosts"]] == [
        ("node0", 0, [0]), ("node1", 1, [1])]
    assert [(r["rank"], r["host"]) for r in report["ranks"]] == [(0, "node0"), (1, "node1")]
    # What each rank saw itself (its RANK and GROUP_RANK under torchrun), in its host's run
    # directory (the hosts are this machine).
    remote = Path.home() / ".torchfleet" / "runs" / report["run_id"]
    results = {json.loads(p.read_text())["host"]: json.loads(p.read_text())
               for p in remote.glob("*/results/rank-*.json")}
    assert {h: (r["rank"], r["node_rank"]) for h, r in results.items()} == {
        "node0": (0, 0), "node1": (1, 1)}
    state = json.loads((run.run_dir / "run_state.json").read_text())
    assert state["phase"] == "succeeded" and state["final"]
    assert "NODE_RANK" in run.out


def test_a_killed_master_agent_is_the_master_lost_and_nothing_is_left(tmp_path):
    """SIGKILL of the master's agent mid-run (as an OOM kill would): the verdict is the master
    lost, not a traceback; node1's agent stops by itself after lost_after_s."""
    run_id = "killmaster-%d" % os.getpid()
    pidfile = Path.home() / ".torchfleet" / "runs" / run_id / "node0" / "torchrun.pid"
    argv = [*ansible_cli.command("ansible-playbook"), "train.yml", "-e", "nnodes=2",
            "-e", "master_port=%d" % free_port(), *until_stopped(NOTORCH),
            "-e", "lost_after_s=10", "-e", "run_id=%s" % run_id,
            "-e", "run_dir=%s" % (tmp_path / "run")]
    proc = subprocess.Popen(argv, cwd=ROOT, env=dict(os.environ, PATH="%s:%s" % (
        BIN, os.environ["PATH"])), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not (pidfile.exists() and any(
                "step " in p.read_text(errors="replace")
                for p in pidfile.parent.glob("logs/**/stdout.log"))):
            time.sleep(0.2)
        agent_pid = procs.parent(json.loads(pidfile.read_text())["pid"])  # torchrun's parent
        os.kill(agent_pid, 9)
        out, _ = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode != 0
    report = json.loads((tmp_path / "run" / "train.json").read_text())
    assert report["verdict"].startswith(
        "train failed: first failure on node0: its agent ended without finishing the run's "
        "record"), report["verdict"]
    assert {h["host"]: h["outcome"] for h in report["hosts"]} == {"node0": "lost",
                                                                  "node1": "aborted"}
    assert ("host.lost", "node0") in {(c["id"], c["host"]) for c in report["checks"]}
    assert run_processes(run_id) == []


def hangup_ends():
    """A controller's terminal closing ends it: SIGHUP's default, which a suite started under
    nohup (SIGHUP ignored, and so in every child) would otherwise not give it."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGKILL, pytest.param(signal.SIGHUP, marks=pytest.mark.slow)])
def test_a_controller_killed_or_hung_up_leaves_nothing_running(tmp_path, sig):
    """ansible-playbook's whole process group killed (SIGKILL: a lost SSH session to the
    controller, an OOM kill, a CI job's timeout) or hung up (SIGHUP: its terminal closed)
    while the run trains. The watch runs on in an Ansible worker of its own session; it sees
    its ansible-playbook gone and asks the master to stop the run, which stops every host
    long before its lease (120 s) would have."""
    run_id = "killctl-%s-%d" % (sig.name, os.getpid())
    run_dir = Path.home() / ".torchfleet" / "runs" / run_id
    argv = [*ansible_cli.command("ansible-playbook"), "train.yml", "-e", "nnodes=2",
            "-e", "master_port=%d" % free_port(), *until_stopped(NOTORCH),
            "-e", "run_id=%s" % run_id, "-e", "run_dir=%s" % (tmp_path / "run")]
    proc = subprocess.Popen(argv, cwd=ROOT, env=dict(os.environ, PATH="%s:%s" % (
        BIN, os.environ["PATH"])), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, preexec_fn=hangup_ends)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not any(
                "step " in p.read_text(errors="replace")
                for p in run_dir.glob("node1/logs/**/stdout.log")):
            time.sleep(0.2)
        assert run_processes(run_id), "the run never trained"
        os.killpg(proc.pid, sig)
        proc.wait(timeout=60)
        # Well within the lease: the stop was asked for, not waited out.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and run_processes(run_id):
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert run_processes(run_id) == []

    def read_record():
        try:
            return json.loads((run_dir / "node0" / "control.json").read_text())
        except (OSError, ValueError):
            return {}

    # The master's agent writes its final record as it ends (after its ranks).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not read_record().get("final"):
        time.sleep(0.5)
    record = read_record()
    assert record["final"] and record["phase"] == "stopped_by_user"
    assert record["failure"]["detail"].startswith("stopped: the controller ended")
