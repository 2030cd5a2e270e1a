"""What watching the hardware during a run costs and how fast it names a cause (issue 48).

- The watcher's CPU on a host: one look of hwwatch.HostWatch (the kernel log from /dev/kmsg,
  or a file where /dev/kmsg cannot be read; the RDMA ports where the host has them; NVML or
  nvidia-smi where it has NVIDIA GPUs) per heartbeat, against what a heartbeat costs without
  it (agent.local_status of a run directory with two ranks' logs), side by side in this
  process; as % of one core at one look per BEAT_S.
- A kernel line to the verdict: a real train.yml on the embedded default inventory (2 hosts
  on this machine), a recorded Xid 79 line appended to node1's kernel_log file while its
  ranks train; the time from the write to the master's record naming node1 (the master's
  clock is this machine's wall clock from its start, so the two are compared on one clock).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.host import hwwatch, kmsg
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import agent
from bench.harness import ROOT, env, stats
from torchfleet import ansible_cli

XID79 = (ROOT / "tests" / "fixtures" / "kmsg" / "xid79-aer.gpu-burn.txt").read_text() \
    .splitlines()[-1]
LOOKS = 2000
KMSG = kmsg.KMSG
NOISE = 5  # kernel lines a look (a second): a busy 8-GPU host's corrected errors and NIC noise
NOISE_LINE = ("pcieport 0000:00:01.1: AER: Corrected error received: 0000:01:00.0\n")


def stand_in_ranks():
    """8 processes standing for a host's ranks, each with 4 children (its DataLoader
    workers): {pid: (local_rank, rank)} and every process to end."""
    ranks, procs = {}, []
    for i in range(8):
        p = subprocess.Popen(["sh", "-c", "for i in 1 2 3 4; do sleep 600 & done; wait"],
                             start_new_session=True)
        ranks[p.pid] = (i, i)
        procs.append(p)
    return ranks, procs


def per_look_cpu_s(step, looks=LOOKS):
    start = time.process_time()
    for i in range(looks):
        step(float(i))
    return (time.process_time() - start) / looks


def watcher_cpu(runs):
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        for local_rank in (0, 1):  # a host's part with two ranks' logs, as torchrun writes it
            d = run_dir / "logs" / "attempt_0" / str(local_rank)
            d.mkdir(parents=True)
            (d / "stdout.log").write_text("step 1\n")
            (d / "stderr.log").write_text("")
        # A fleet host's shape: 8 ranks of 4 DataLoader workers each (the watch walks their
        # tree for the OOM killer's victims), and a kernel log that is never quiet: a file
        # the bench writes NOISE corrected AER lines a look to (as well as /dev/kmsg, when
        # it can be read, which this machine's own kernel writes to).
        ranks, procs = stand_in_ranks()
        log = run_dir / "kern.log"
        log.touch()
        watches = [hwwatch.HostWatch(str(log), defaults.default("rdma_sysfs"))]
        if kmsg.readable(kmsg.KMSG) is None:
            watches.append(hwwatch.HostWatch(kmsg.KMSG, defaults.default("rdma_sysfs")))
        pid = os.getpid()
        beat, watched = [], []

        def look(now):
            with open(log, "a") as f:
                f.write(NOISE_LINE * NOISE)
            for w in watches:
                w.look(now * defaults.BEAT_S, ranks)
                w.take(now * defaults.BEAT_S)
        try:
            for _run in range(runs):
                beat.append(per_look_cpu_s(lambda now: agent.local_status(str(run_dir), pid)))
                # The watched beat: the same beat plus the watchers' look and take.
                watched.append(per_look_cpu_s(lambda now: (
                    agent.local_status(str(run_dir), pid), look(now))))
        finally:
            for w in watches:
                w.close()
            for p in procs:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        source = " and ".join(["a followed file"] + [KMSG for w in watches[1:]]) + \
            " (%d corrected AER lines a look written to the file; 8 ranks x 4 workers)" % NOISE
    extra = [w - b for w, b in zip(watched, beat, strict=True)]
    return {"source": source, "beat_cpu_s": stats(beat), "watched_cpu_s": stats(watched),
            "watch_cpu_s": stats(extra),
            "core_pct": stats([100.0 * max(0.0, e) / defaults.BEAT_S for e in extra])}


def line_to_verdict(runs, tmp):
    latencies = []
    for i in range(runs):
        kdir, stop = tmp / ("kmsg%d" % i), tmp / ("stop%d" % i)
        kdir.mkdir()
        run_dir, run_id = tmp / ("hw%d" % i), "benchhw-%d-%d" % (os.getpid(), i)
        proc = subprocess.Popen(
            [*ansible_cli.command("ansible-playbook"), "train.yml", "-e", "nnodes=2",
             "-e", "script=%s" % (ROOT / "tests" / "fixtures" / "scripts" / "steps_until_file.py"),
             "-e", json.dumps({"script_args": [str(stop)]}), "-e", "run_dir=%s" % run_dir,
             "-e", "run_id=%s" % run_id,
             "-e", "kernel_log=%s/{{ inventory_hostname }}.log" % kdir],
            cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL)
        logs = Path(os.path.expanduser("~/.torchfleet/runs")) / run_id / "node1" / "logs"
        try:
            end = time.monotonic() + 300
            while time.monotonic() < end and proc.poll() is None and not any(
                    "step 3" in p.read_text(errors="replace") for p in logs.glob("**/stdout.log")):
                time.sleep(0.05)
            written = time.time()
            with open(kdir / "node1.log", "a") as f:
                f.write(XID79 + "\n")  # the run lasts until this stops it (stop is never made)
            proc.wait(timeout=300)
            record = json.loads((run_dir / "run_state.json").read_text())
            failure = record["failure"]
            assert failure and failure["host"] == "node1" and failure["reason"] == "hardware", \
                failure
            latencies.append(record["started"] + failure["detected_s"] - written)
        finally:
            if proc.poll() is None:
                proc.kill()
    return {"latency_s": stats(latencies)}


def run(args, tmp):
    return {"watcher": watcher_cpu(args.runs), "line_to_verdict": line_to_verdict(args.runs, tmp)}
