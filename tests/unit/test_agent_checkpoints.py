"""The master's agent and goodput's inputs: its checkpoint watch (checkpoint_dir) handed to
the record on the record's clock, each rank's first collective carried by a beat, and how
long ago torchrun ended carried by the exit."""
from __future__ import annotations

import json
import os
import time
import types
from pathlib import Path

from ansible_collections.torchfleet.fleet.plugins.module_utils.run import agent, flight, runstate
from tests.unit.test_clock_step import Clocks, store_of


class FoundWatch:
    """A checkpoint watch that found what it is given (ckptwatch.Watcher.take's shape)."""

    def __init__(self, found, warnings):
        self.found, self.warnings, self.closed = found, warnings, False
        self.watch = types.SimpleNamespace(looks=3, scans=2, cpu_s=0.001, blind=True)

    def take(self):
        out = self.found, self.warnings
        self.found, self.warnings = [], []
        return out

    def finish(self):
        self.closed = True


def test_the_master_dates_each_checkpoint_on_the_records_clock_and_names_its_host(tmp_path):
    clocks = Clocks()  # the record's clock: 1.8e9, far from this host's wall clock
    store = store_of(tmp_path, clocks)
    wall = time.time()
    store.checkpoints = FoundWatch(
        [{"path": "step_100.pt", "began": wall - 10.0, "ended": wall - 4.0, "step": 100,
          "kind": "file", "bytes": 123}],
        ["checkpoint_dir /x does not exist (yet): ..."])
    clocks.mono += 1.0
    store.step(clocks.mono)
    rec = store.state.record()
    [c] = rec["checkpoints"]
    now = store.clock()
    assert abs(c["ended"] - (now - 4.0)) < 1.0 and abs(c["began"] - (now - 10.0)) < 1.0
    assert (c["path"], c["step"], c["kind"], c["bytes"]) == ("step_100.pt", 100, "file", 123)
    assert rec["checkpoint_watch"]["warnings"] == [
        "node0: checkpoint_dir /x does not exist (yet): ..."]
    assert rec["checkpoint_watch"]["blind"]  # (the watch's last look could not read it)
    watch = store.checkpoints
    store.server = types.SimpleNamespace(close=lambda: None)
    store.finish()
    assert watch.closed and store.state.final


def test_the_master_watches_checkpoint_dir_from_where_the_ranks_start(tmp_path):
    p = {"run_dir": "/r", "chdir": None, "checkpoint_dir": "ckpt"}
    assert agent.checkpoint_path(p) == "/r/ckpt"
    assert agent.checkpoint_path(dict(p, chdir="/code")) == "/code/ckpt"
    assert agent.checkpoint_path(dict(p, checkpoint_dir="/abs")) == "/abs"
    assert agent.checkpoint_path(dict(p, checkpoint_dir="")) == ""
    assert agent.checkpoint_path({"run_dir": "/r"}) == ""
    store = store_of(tmp_path, Clocks())
    assert store.checkpoints is None  # unset: nothing watched, no thread


def test_a_beat_carries_each_ranks_first_collective_and_the_exit_when_torchrun_ended(tmp_path):
    rdir = tmp_path / "logs" / "r1_x" / "attempt_0" / "0"
    rdir.mkdir(parents=True)
    now = time.time()
    (rdir / flight.POSITION).write_text(json.dumps({"rank": 0, "pid": os.getpid(),
                                                    "pgs": {"0": [3, 3, "", "", ""]},
                                                    "first": now - 7.5}))
    status = agent.local_status(str(tmp_path), os.getpid(), now=now, first_dead={})
    assert status["first"] == {"0": 7.5}
    assert "first" not in agent.local_status(str(tmp_path), os.getpid(), now=now)
    # The exit: torchrun ended 2.5 s before it was sent (the master dates it: ended).
    host = types.SimpleNamespace(
        ended_m=100.0, stopped=False, died=None, p={"run_dir": str(tmp_path),
                                                      "max_restarts": 0},
        deaths=agent.RankDeaths(), started_m=0.0, proc=types.SimpleNamespace(pid=os.getpid()),
        first_dead={}, watch=types.SimpleNamespace(take=lambda _n: [], status=lambda: {}))
    body = agent.HostAgent.exit_body(host, 0, 102.5)
    assert body["ended_s"] == 2.5 and body["first"]["0"] >= 7.5
    s = runstate.RunState("r1", ["a"], 1, now=1000.0)
    s.report("a", 1001.0, {"t": runstate.BEAT, "alive": 1})
    s.report("a", 1010.0, body)
    assert s.record()["hosts"][0]["ended"] == 1007.5
    assert s.record()["timeline"]["stopped"] == 1007.5


# Two real torch ranks (gloo) training with an all_reduce a step; rank 0 saves at step 40 in
# the training loop (every rank waits: a stall) and at step 80 from a thread while training
# goes on (not one), each to a temporary name renamed when done, as most scripts save.
SAVING = """
import io, os, sys, threading, time
import torch
import torch.distributed as dist
ckdir = sys.argv[1]
with open(os.path.join(sys.argv[2], "torch_imported_%s" % os.environ["RANK"]), "w") as f:
    f.write(repr(time.time()))
dist.init_process_group("gloo")
rank, t = dist.get_rank(), torch.ones(256)

def save(step, slow_s):
    buf = io.BytesIO()
    torch.save({"step": step, "w": t.clone()}, buf)
    data, tmp = buf.getvalue(), os.path.join(ckdir, "step_%d.pt.tmp" % step)
    with open(tmp, "wb") as f:  # written in 8 pieces over slow_s (slow storage)
        for i in range(8):
            f.write(data[i * len(data) // 8:(i + 1) * len(data) // 8])
            f.flush()
            time.sleep(slow_s / 8)
    os.replace(tmp, os.path.join(ckdir, "step_%d.pt" % step))
    print("saved", step, flush=True)

saver = None
for step in range(1, 161):
    dist.all_reduce(t)
    time.sleep(0.05)
    if rank == 0 and step == 40:
        save(step, 4.0)
    if rank == 0 and step == 80:
        saver = threading.Thread(target=save, args=(step, 5.0))
        saver.start()
if saver is not None:
    saver.join()
dist.destroy_process_group()
"""


def test_a_real_run_records_its_checkpoints_stalls_and_timeline(tmp_path):
    from tests.unit.test_run_modules import agent_args, start_agent
    from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import CONTROL

    script, ckdir = tmp_path / "saving.py", tmp_path / "ckpt"
    script.write_text(SAVING)
    ckdir.mkdir()
    args = agent_args(tmp_path, "unit-ckpt-%d" % os.getpid(), script=str(script),
                      script_args=[str(ckdir), str(tmp_path)], nproc_per_node=2,
                      checkpoint_dir=str(ckdir),
                      join_timeout_s=120)
    job = start_agent(args)
    try:
        out, _ = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
    assert json.loads(out)["rc"] == 0, out
    rec = json.loads((Path(args["run_dir"]) / CONTROL).read_text())
    assert rec["final"] and rec["phase"] == runstate.SUCCEEDED
    got = [(c["path"], c["step"], c["kind"], c["stall"]) for c in rec["checkpoints"]]
    assert got == [("step_40.pt", 40, "file", True), ("step_80.pt", 80, "file", False)], rec
    line = rec["timeline"]
    for c in rec["checkpoints"]:
        # Began when its temporary file appeared, ended when it was last written: the window
        # holds the save's writing (4 s and 5 s; a second of slack for the looks).
        assert 3.0 < c["ended"] - c["began"] < 7.0 and c["bytes"] > 0
        assert line["init_done"] < c["began"] < line["stopped"]
    assert rec["started"] <= line["running"] <= line["init_done"] <= line["stopped"]
    assert line["failed"] is None and rec["checkpoint_watch"] == {"dir": str(ckdir),
                                                                  "warnings": [],
                                                                  "blind": False}
    # Every rank was running (its agent saw it start) before any had imported torch.
    imported = [float((tmp_path / ("torch_imported_%d" % r)).read_text()) for r in (0, 1)]
    assert line["running"] < min(imported)
    assert line["stopped"] == max(h["ended"] for h in rec["hosts"])
    t0 = rec["started"]
    print("\ntimeline (s from the start): %s; checkpoints: %s" % (
        {k: round(v - t0, 2) for k, v in line.items() if v is not None},
        [(c["path"], round(c["began"] - t0, 2), round(c["ended"] - t0, 2), c["stall"])
         for c in rec["checkpoints"]]))
