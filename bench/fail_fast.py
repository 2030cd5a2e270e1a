"""Rank 1 exits 1: until every rank on every host is gone, and the play's exit; plain torchrun beside it.

Each run also says where the time went (`phases`), from the processes themselves (the lab's
nodes share this machine's PID space, so /proc shows every host's torchrun and ranks) and the
master's record and each agent's log (their run directories share its filesystem too):

    rank_gone        the failing rank's process is gone (its interpreter's own exit)
    every_rank_gone  every rank of every host is gone (torchrun processes aside)
    torchrun_gone    its host's torchrun is gone
    heard            the master recorded the failure (the record's detected_s)
    told_last        the last agent logged the abort (agent.log's "abort:" line, where it has one)
    others_gone      every rank and torchrun of every other host is gone (= every rank gone)

With FAIL_FAST_BASELINE=<a checkout of another commit> every run is made twice on the same lab,
that tree's play first, then this one's: the baseline side by side (its figures under
"baseline").
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from bench.harness import (
    env,
    RAW_BOUND_S,
    ROOT,
    pids_running,
    raw_launch,
    stats)
from lab import netns as labmod
from torchfleet import ansible_cli

# Its own lab (tag and directory), so that another bench's lab (tag 3) is never in the way:
# tag 2 (molecule's lab scenario, never run beside a bench), or TORCHFLEET_BENCH_LAB_TAG's.
LAB_TAG = int(os.environ.get("TORCHFLEET_BENCH_LAB_TAG", "2"))
LAB_DIR = Path(tempfile.gettempdir()) / ("torchfleet-lab-failfast" + (
    "" if LAB_TAG == 2 else "-t%d" % LAB_TAG))
RUNS = LAB_DIR.with_name(LAB_DIR.name + "-runs")

FAIL_SCRIPT = '''
import os, sys, time, torch.distributed as dist
dist.init_process_group("gloo")
time.sleep(4)
if dist.get_rank() == 1:
    with open(sys.argv[1], "w") as f:
        f.write(repr(time.time()))
    sys.exit(1)
time.sleep(300)
'''


def _read(path, mode="rb"):
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:
        return None


def _alive(pid):
    stat = _read("/proc/%d/stat" % pid, "r")
    return bool(stat) and stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


class Phases(threading.Thread):
    """Every process of the run (the script's path among its arguments: torchrun and its
    ranks), its host and kind, and when each was first seen gone once the failure's stamp
    exists; gone_at: when none is left (the last full scan finds none)."""

    POLL_S = 0.005   # the known processes, after the failure
    SCAN_S = 0.2     # every process of the machine, before it

    def __init__(self, marker, stamp):
        super().__init__(daemon=True)
        self.marker, self.stamp = marker.encode(), stamp
        self.procs = {}       # pid -> {"host", "kind", "rank", "gone"}
        self.gone_at = None
        self.done = threading.Event()

    def scan(self):
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            line = _read("/proc/%d/cmdline" % pid)
            if not line or self.marker not in line.split(b"\0") or not _alive(pid):
                continue
            found.append(pid)
            if pid not in self.procs:
                environ = dict(kv.split(b"=", 1) for kv in (_read("/proc/%d/environ" % pid) or b"")
                               .split(b"\0") if b"=" in kv)
                self.procs[pid] = {
                    "host": environ.get(b"TORCHFLEET_HOST", b"?").decode(),
                    "kind": "torchrun" if b"torch.distributed.run" in line else "rank",
                    "rank": int(environ[b"RANK"]) if b"RANK" in environ else None,
                    "gone": None}
        return found

    def run(self):
        while not self.done.is_set():
            if not self.stamp.exists():
                self.scan()
                self.done.wait(self.SCAN_S)
                continue
            now = time.time()
            left = [pid for pid, p in self.procs.items() if p["gone"] is None]
            for pid in left:
                if not _alive(pid):
                    self.procs[pid]["gone"] = now
            if all(p["gone"] is not None for p in self.procs.values()) and not self.scan():
                self.gone_at = now
                return
            time.sleep(self.POLL_S)

    def breakdown(self, failed, failing_host, record, logs):
        """Seconds from the failure to each phase (None where not seen)."""
        def since(t):
            return None if t is None else round(t - failed, 3)

        mine = [p for p in self.procs.values() if p["host"] == failing_host]
        others = [p for p in self.procs.values() if p["host"] != failing_host]
        rank = [p["gone"] for p in mine if p["kind"] == "rank" and p["rank"] == 1]
        torchrun = [p["gone"] for p in mine if p["kind"] == "torchrun"]
        failure = (record or {}).get("failure") or {}
        heard = (record["started"] + failure["detected_s"]
                 if failure.get("detected_s") is not None else None)
        told = [t for t in logs if t is not None]
        return {"rank_gone": since(max(rank, default=None)),
                "every_rank_gone": since(max((p["gone"] for p in self.procs.values()
                                              if p["kind"] == "rank"), default=None)),
                "torchrun_gone": since(max(torchrun, default=None)),
                "heard": since(heard),
                "told_last": since(max(told)) if told and len(told) == len(logs) else None,
                "others_ranks_gone": since(max((p["gone"] for p in others
                                                if p["kind"] == "rank"), default=None)),
                "others_torchrun_gone": since(max((p["gone"] for p in others
                                                   if p["kind"] == "torchrun"), default=None)),
                "named": "%s rank %s" % (failure.get("host"), failure.get("rank"))}


def told_at(log):
    """When an agent logged the abort it obeyed (agent.log's 'abort:' line, with
    milliseconds), as a time on this machine's clock; None where it has none."""
    text = _read(log, "r") or ""
    for line in text.splitlines():
        stamp, _, rest = line.partition(" ")
        if rest.startswith("abort:") and "." in stamp:
            day = time.strftime("%Y-%m-%d ", time.localtime(os.stat(log).st_mtime))
            whole, frac = stamp.split(".")
            return time.mktime(time.strptime(day + whole, "%Y-%m-%d %H:%M:%S")) + float(
                "0." + frac)
    return None


def playbook(tree, *extra, timeout_s=600):
    """ansible-playbook train.yml of `tree` (its ansible.cfg, its collection), from there."""
    proc = subprocess.run([*ansible_cli.command("ansible-playbook"), *extra], cwd=tree,
                          env=env(), capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)
    return proc.returncode, proc.stdout + proc.stderr


def one_run(tree, the_lab, n, script, tmp, name):
    stamp = tmp / ("failed-at-" + name)
    watcher = Phases(str(script), stamp)
    watcher.start()
    run_id = "ff-%s-%d" % (name, time.time_ns() % 10 ** 9)
    rc, out = playbook(tree, "-i", str(the_lab.inventory), "train.yml", "-e", "nnodes=%d" % n,
                       "-e", "run_id=%s" % run_id, "-e", "run_dir=%s/%s" % (tmp, run_id),
                       "-e", "script=%s" % script, "-e", json.dumps({"script_args": [str(stamp)]}))
    ended = time.time()
    watcher.done.set()
    watcher.join()
    assert rc != 0 and stamp.exists(), out[-3000:]
    assert not pids_running(str(script)), (tmp / run_id / "train.json")
    failed = float(stamp.read_text())
    stamp.unlink()
    hosts = [node.name for node in the_lab.nodes[:n]]
    record = json.loads(_read(RUNS / run_id / hosts[0] / "control.json", "r") or "null")
    logs = [told_at(RUNS / run_id / h / "agent.log") for h in hosts if h != "node1"]
    return {"gone": watcher.gone_at - failed, "exit": ended - failed,
            "phases": watcher.breakdown(failed, "node1", record, logs)}


def _summary(runs):
    out = {"failure_to_every_rank_gone_s": stats([r["gone"] for r in runs]),
           "failure_to_play_exit_s": stats([r["exit"] for r in runs]), "phases": {}}
    for key in runs[0]["phases"]:
        values = [r["phases"][key] for r in runs]
        out["phases"][key] = (stats(values) if all(isinstance(v, float) for v in values)
                              else values)
    return out


def fail_fast_at(n, args, tmp, raw_runs):
    the_lab = labmod.Lab.up(n, LAB_DIR, LAB_TAG, runs_root=RUNS)
    script = tmp / ("fail_after_4s_%d.py" % n)
    script.write_text(FAIL_SCRIPT)
    baseline = os.environ.get("FAIL_FAST_BASELINE")
    try:
        ours, theirs, raw = [], [], []
        for i in range(args.runs):
            if baseline:
                theirs.append(one_run(baseline, the_lab, n, script, tmp, "base%d-%d" % (n, i)))
            ours.append(one_run(ROOT, the_lab, n, script, tmp, "ours%d-%d" % (n, i)))
        for i in range(raw_runs):
            stamp = tmp / ("raw-failed-at-%d-%d" % (n, i))
            wall, rcs = raw_launch(the_lab, 29520 + i, script, [str(stamp)], tmp,
                                   timeout_s=RAW_BOUND_S)
            raw.append((time.time() - float(stamp.read_text())) if rcs is not None and
                       stamp.exists() else float("inf"))
        out = dict({"hosts": n, "runs": ours}, **_summary(ours))
        if theirs:
            out["baseline"] = dict({"tree": baseline, "runs": theirs}, **_summary(theirs))
        if raw:
            out["raw_torchrun_failure_to_all_exited_s"] = stats(raw)
        return out
    finally:
        labmod.down(LAB_DIR, LAB_TAG)


def run(args, tmp):
    out = {"sizes": {}}
    for n in args.fail_fast_sizes:
        # Plain torchrun's figure is a bound (> RAW_BOUND_S): measured once, at the first size,
        # and not at all with a baseline (the comparison is then the baseline's).
        raw_runs = 0 if out["sizes"] or os.environ.get("FAIL_FAST_BASELINE") else 1
        out["sizes"]["lab%d" % n] = fail_fast_at(n, args, tmp, raw_runs)
    first = next(iter(out["sizes"].values()))
    out.update({"failure_to_play_exit_s": first["failure_to_play_exit_s"],
                "raw_torchrun_failure_to_all_exited_s":
                    first.get("raw_torchrun_failure_to_all_exited_s"),
                "raw_note": "inf means plain torchrun was still running %d s after the failure"
                            % RAW_BOUND_S})
    return out
