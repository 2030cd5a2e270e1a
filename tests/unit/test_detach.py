"""A detached run: the master's store stops awaiting the controller once a look detached it
(driven as the master's loop drives it, tests/unit/test_clock_step.py's clocks), and the run's
record on the controller (runs/<id>/run.json) with its attach lock and where a rank's log is."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import report
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import detach, runstate, watch
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import DETACHED

from tests.unit.test_clock_step import Clocks, seconds, store_of


def test_a_detached_run_outlives_its_controller_and_is_still_judged(tmp_path):
    clocks = Clocks()
    store = store_of(tmp_path, clocks)
    seconds(store, clocks, 5)
    answer = watch.look({"run_dir": str(tmp_path), "run_id": "r1", "detach": True})
    assert not answer.get("failed") and (tmp_path / DETACHED).exists()
    # Ten minutes without a look: far past the lease (30 s here); the run goes on.
    seconds(store, clocks, 600, look=False)
    assert store.detached and store.state.phase == runstate.RUNNING
    # The hosts still judge it: a silent host is lost after lost_after_s.
    for _ in range(40):
        clocks.wall += 1.0
        clocks.mono += 1.0
        store.handle("node0", {"t": runstate.BEAT, "alive": 1, "idle_s": 0.0, "last_line": "s",
                               "pid": 1})
        store.step(clocks.mono)
    assert store.state.failure["reason"] == runstate.LOST
    assert store.state.failure["host"] == "node1"


def test_an_attached_run_without_looks_is_stopped_at_its_lease(tmp_path):
    clocks = Clocks()
    store = store_of(tmp_path, clocks)
    seconds(store, clocks, 5)
    seconds(store, clocks, 40, look=False)
    assert store.state.failure["reason"] == runstate.CONTROLLER_LOST


def record_of(hosts=("node0", "node1", "node2"), nproc=2, **extra):
    return dict({"kind": "train", "run_dir": "/x", "runs_root": "", "inventory": ["inv.yml"],
                 "master": hosts[0],
                 "hosts": {h: {"remote_dir": "~/.torchfleet/runs/r1/%s" % h, "async_jid": "j1.1",
                               "connection": {"ansible_host": "10.0.0.%d" % i}}
                           for i, h in enumerate(hosts)},
                 "watch": {"nproc_per_node": nproc},
                 "preflight": {"nodes": [{"host": h} for h in hosts]}}, **extra)


def params(root, **p):
    return dict({"state": "attached", "run_id": "r1", "runs_root": str(root), "record": {},
                 "inventory_hosts": [], "owner_pid": os.getpid(), "stop": False, "rank": None,
                 "host": None}, **p)


def test_the_record_is_written_private_read_back_and_locked_once(tmp_path):
    (tmp_path / "r1").mkdir()
    detach.decide(params(tmp_path, state="present", record=record_of()))
    path = tmp_path / "r1" / detach.RECORD
    assert path.stat().st_mode & 0o777 == 0o600
    got = detach.decide(params(tmp_path))
    assert got["record"]["master"] == "node0" and got["reported"] == ""
    assert json.loads((tmp_path / "r1" / detach.LOCK).read_text())["pid"] == os.getpid()
    # Another live process (this test's) holds it: a second attach follows beside it.
    second = detach.decide(params(tmp_path, owner_pid=os.getppid()))
    assert second["followed_by"] == os.getpid() and second["record"]["master"] == "node0"
    # stop.yml is no attach: the holder is named, and gathers the run.
    stopping = detach.decide(params(tmp_path, owner_pid=os.getppid(), stop=True))
    assert stopping["followed_by"] == os.getpid()
    assert detach.decide(params(tmp_path, state="released"))["released"]
    assert not (tmp_path / "r1" / detach.LOCK).exists()


@pytest.fixture
def owner(tmp_path):
    """Run r1's record, and a live process holding its lock: the attach that owns the run (its
    ansible-playbook)."""
    (tmp_path / "r1").mkdir()
    detach.decide(params(tmp_path, state="present", record=record_of()))
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    detach.lock(str(tmp_path / "r1"), proc.pid)
    yield proc
    proc.kill()
    proc.wait()


def test_a_follower_shows_the_owners_progress_and_ends_with_its_report(tmp_path, owner):
    progress = tmp_path / "r1" / "progress.jsonl"
    progress.write_text(json.dumps({"phase": "running", "elapsed_s": 1.0}) + "\n")  # history
    seen, polls = [], []

    def sleep(_s):  # the owner's watch and report, as the follower polls
        polls.append(1)
        if len(polls) == 1:
            with open(progress, "a") as f:
                f.write(json.dumps({"phase": "running", "elapsed_s": 9.0}) + "\n{\"pha")
        elif len(polls) == 2:
            with open(progress, "a") as f:
                f.write('se": "failed", "elapsed_s": 10.0}\nnot json\n[1]\n')
        elif len(polls) == 3:
            report.write_report(str(tmp_path / "r1"), "train.json",
                                {"ok": False, "verdict": "train failed: node2 rank 4"})
    got = detach.follow(str(tmp_path), record_of(run_id="r1"), os.getppid(), seen.append,
                        sleep=sleep)
    assert [line["elapsed_s"] for line in seen] == [9.0, 10.0]  # no history, no junk
    assert got["reported"].endswith("r1/train.json") and got["report"] == {
        "ok": False, "verdict": "train failed: node2 rank 4"}
    assert detach.attached_by(str(tmp_path / "r1")) == owner.pid  # the owner's lock stays


def test_a_follower_takes_over_from_the_record_when_the_owner_dies(tmp_path, owner):
    polls = []

    def sleep(_s):  # the owner restarts the run on a spare, then is killed
        polls.append(1)
        if len(polls) == 2:
            detach.decide(params(tmp_path, state="present", record=record_of(
                hosts=("node0", "node1", "node3"), watch={"nproc_per_node": 2,
                                                         "attempt": 1})))
            owner.kill()
            owner.wait()
    got = detach.follow(str(tmp_path), record_of(run_id="r1"), os.getpid(), sleep=sleep)
    # The attempt the owner started is followed (the record read again), never restarted.
    assert got["reported"] == "" and got["followed_by"] == 0
    assert sorted(got["record"]["hosts"]) == ["node0", "node1", "node3"]
    assert got["record"]["watch"]["attempt"] == 1
    assert detach.attached_by(str(tmp_path / "r1")) == os.getpid()


def test_a_lock_whose_holder_is_gone_is_taken(tmp_path):
    (tmp_path / "r1").mkdir()
    detach.decide(params(tmp_path, state="present", record=record_of()))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    (tmp_path / "r1" / detach.LOCK).write_text(json.dumps({"pid": int(gone.stdout), "since": 1}))
    assert detach.decide(params(tmp_path))["record"]["run_id"] == "r1"


def test_a_lock_held_by_a_killed_attach_not_reaped_yet_is_taken(tmp_path):
    """A finisher killed with its parent waits as a zombie until init reaps it: not alive."""
    (tmp_path / "r1").mkdir()
    detach.decide(params(tmp_path, state="present", record=record_of()))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "r1" / detach.LOCK).write_text(json.dumps({"pid": child.pid, "since": 1}))
        assert detach.attached_by(str(tmp_path / "r1")) == child.pid
        child.kill()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped
        assert detach.attached_by(str(tmp_path / "r1")) == 0
        assert detach.decide(params(tmp_path))["record"]["run_id"] == "r1"
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("run_id, setup, words", [
    ("nosuch", None, "no run nosuch under"),
    ("../etc", None, "is not a torchfleet run id"),
    ("r1", "attached", "was not detached"),
    ("r1", "garbled", "is not a record torchfleet wrote"),
    ("r1", "foreign", "is not a record torchfleet wrote"),
])
def test_bad_run_ids_are_one_sentence_and_touch_nothing(tmp_path, run_id, setup, words):
    if setup:
        (tmp_path / "r1").mkdir()
        (tmp_path / "r1" / "train.json").write_text("{}")
    if setup == "garbled":
        (tmp_path / "r1" / detach.RECORD).write_text("{not json")
    if setup == "foreign":
        (tmp_path / "r1" / detach.RECORD).write_text(json.dumps(dict(record_of(), version=1,
                                                                     run_id="other")))
    with pytest.raises(ValueError, match=words):
        detach.decide(params(tmp_path, run_id=run_id))
    assert not list(tmp_path.rglob(detach.LOCK))


def test_an_inventory_without_the_runs_hosts_is_refused(tmp_path):
    (tmp_path / "r1").mkdir()
    detach.decide(params(tmp_path, state="present", record=record_of()))
    with pytest.raises(ValueError, match="ran on node2, which the inventory given does not hold"):
        detach.decide(params(tmp_path, inventory_hosts=["node0", "node1"]))


def test_a_gathered_run_is_answered_with_its_report_and_no_lock(tmp_path):
    (tmp_path / "r1").mkdir()
    detach.decide(params(tmp_path, state="present", record=record_of()))
    (tmp_path / "r1" / "train.json").write_text("{}")
    got = detach.decide(params(tmp_path))
    assert got["reported"].endswith("train.json")
    assert not (tmp_path / "r1" / detach.LOCK).exists()


def test_where_a_ranks_log_is():
    rec = dict(record_of(), run_id="r1")
    assert detach.place(rec) == {"host": "node0", "local_rank": 0, "rank": 0}
    assert detach.place(rec, rank=3) == {"host": "node1", "local_rank": 1, "rank": 3}
    assert detach.place(rec, host="node2") == {"host": "node2", "local_rank": 0, "rank": 4}
    for kwargs, words in (({"rank": 6}, "ranks 0 to 5; rank 6"),
                          ({"host": "node9"}, "no host node9"),
                          ({"rank": 1, "host": "node2"}, "rank 1 does not run on node2")):
        with pytest.raises(ValueError, match=words):
            detach.place(rec, **kwargs)


def test_pruning_keeps_a_detached_run_until_it_is_gathered(tmp_path):
    names = ["20261126-10000%d-aaaa" % i for i in range(4)]
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.json").write_text("{}")
    os.remove(tmp_path / names[0] / "train.json")
    (tmp_path / names[0] / detach.RECORD).write_text("{}")
    removed = report.prune_runs(str(tmp_path), 2)
    assert removed == [names[1]] and (tmp_path / names[0]).is_dir()


def test_runs_latest_stays_on_the_newest_run_started_when_an_older_one_reports(tmp_path):
    """A detached run's finisher writes its report after a newer run started from the same
    runs root: runs/latest keeps naming the newer run."""
    older, newer = str(tmp_path / "20261126-101500-ab12"), str(tmp_path / "20261126-111500-cd34")
    report.write_report(older, "preflight.json", {"ok": True}, runs_root=str(tmp_path))
    assert os.path.realpath(tmp_path / "latest") == older
    report.write_report(newer, "preflight.json", {"ok": True}, runs_root=str(tmp_path))
    report.write_report(older, "train.json", {"ok": True}, runs_root=str(tmp_path))
    assert os.path.realpath(tmp_path / "latest") == newer
    os.unlink(tmp_path / "latest")  # removed by hand: the next report puts it back
    report.write_report(older, "train.json", {"ok": True}, runs_root=str(tmp_path))
    assert os.path.realpath(tmp_path / "latest") == older


def test_a_hosts_record_keeps_what_connects_to_it_and_never_a_password():
    from ansible_collections.torchfleet.fleet.plugins.filter.run_host import FilterModule

    run_host = FilterModule().filters()["run_host"]
    got = run_host({"launch_remote_dir": "~/.torchfleet/runs/r1/node3",
                    "launch_job": {"ansible_job_id": "j1.42"}, "ansible_host": "10.0.0.3",
                    "ansible_user": "u", "ansible_password": "secret",
                    "ansible_become_password": "secret", "ansible_port": None, "other": 1},
                   {})
    assert got == {"remote_dir": "~/.torchfleet/runs/r1/node3", "async_jid": "j1.42",
                   "connection": {"ansible_host": "10.0.0.3", "ansible_user": "u"},
                   "settings": {}}
    # Where no interpreter was set, the one Ansible discovered there.
    found = run_host({"ansible_facts": {"discovered_interpreter_python": "/usr/bin/python3.12"}},
                     {})
    assert found["connection"] == {"ansible_python_interpreter": "/usr/bin/python3.12"}
    # The playbooks' add_host of a run's hosts sets exactly these variables.
    run_hosts = (detach.__file__.rsplit("/plugins/", 1)[0] + "/playbooks/tasks/run_hosts.yml")
    with open(run_hosts) as f:
        text = f.read()
    for name in detach.CONNECTION:
        assert "%s: \"{{ item.1.connection.%s | default(" % (name, name) in text


def test_a_runs_settings_are_every_public_variable_and_a_host_keeps_what_differs():
    """What a restart from the record resolves its settings from: the controller's variables
    with every default written (so the inventory a later play loads cannot stand in for one),
    and per host only what its own inventory changed."""
    from ansible_collections.torchfleet.fleet.plugins.filter.run_host import FilterModule
    from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults

    run_host = FilterModule().filters()["run_host"]
    run = run_host({"nnodes": 3, "max_restarts": 1, "inventory_file": "x"})["settings"]
    assert set(run) == set(defaults.BY_NAME)
    assert (run["nnodes"], run["max_restarts"], run["lease_s"], run["control_port"]) == (
        3, 1, defaults.default("lease_s"), None)
    host = run_host({"nnodes": 3, "max_restarts": 1, "backend": "gloo", "python": "/p"},
                    run)["settings"]
    assert host == {"backend": "gloo", "python": "/p"}
    # An attach's restart writes the record again: the recorded settings come first.
    again = run_host({detach.SETTINGS: dict(run, master_port=29600), "master_port": 1}, run)
    assert again["settings"] == {"master_port": 29600}




@pytest.mark.parametrize("slow", ["json.dump", "_holder"])
def test_two_attaches_taking_the_lock_at_once_never_both_hold_it(tmp_path, slow):
    """The finisher and a user's attach take the lock together. json.dump slow: the first one's
    lock is still being written, and a lock seen empty was taken for a stale one. _holder slow,
    beside a dead holder's stale lock: both judged it stale, and each removed the other's new
    lock. Both held the run, each time; now exactly one does, and the other is told."""
    where = tmp_path / "r1"
    where.mkdir()
    if slow == "_holder":
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)
        (where / detach.LOCK).write_text(json.dumps({"pid": int(gone.stdout), "since": 1}))
    racer = (
        "import json, sys, time\n"
        "from ansible_collections.torchfleet.fleet.plugins.module_utils.run import detach\n"
        "if sys.argv[3] == 'json.dump':\n"
        "    real = json.dump\n"
        "    def slow(*a, **k):  # the lock written late\n"
        "        time.sleep(0.5)\n"
        "        return real(*a, **k)\n"
        "    detach.json.dump = slow\n"
        "else:\n"
        "    real = detach._holder\n"
        "    def slow(*a, **k):  # the holder read at once, judged late\n"
        "        got = real(*a, **k)\n"
        "        time.sleep(0.5)\n"
        "        return got\n"
        "    detach._holder = slow\n"
        "while time.time() < float(sys.argv[2]):\n"
        "    time.sleep(0.001)\n"
        "try:\n"
        "    detach.lock(sys.argv[1], __import__('os').getpid())\n"
        "    print('held', flush=True)\n"
        "except detach.Locked:\n"
        "    print('locked', flush=True)\n"
        "time.sleep(1.5)\n")  # alive while the other judges its lock
    go = time.time() + 2
    procs = [subprocess.Popen([sys.executable, "-c", racer, str(where), str(go + i * 0.1), slow],
                              stdout=subprocess.PIPE, text=True) for i in range(2)]
    said = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert said == ["held", "locked"], said
    assert [p.name for p in where.iterdir()] == [detach.LOCK]  # no temp file left
