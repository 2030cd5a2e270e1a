"""The controller's CPU per minute of watch, by number of hosts."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from bench.harness import ROOT, env, lab, lab_down, stats
from torchfleet import ansible_cli


STEADY_SCRIPT = '''
import sys, time
for i in range(int(sys.argv[1])):
    print("step", i, flush=True)
    time.sleep(1)
'''


def tree_cpu_s(root_pid):
    """CPU seconds of a process tree so far: every live process under root_pid, plus what the
    ones already reaped left in their parents' cutime/cstime."""
    tick = os.sysconf("SC_CLK_TCK")
    stats_by_pid = {}
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open("/proc/%d/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        stats_by_pid[pid] = (int(fields[1]), sum(int(v) for v in fields[11:15]))
    tree, grew = {root_pid}, True
    while grew:
        grew = False
        for pid, (ppid, _) in stats_by_pid.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return sum(stats_by_pid[p][1] for p in tree if p in stats_by_pid) / tick


def run(args, tmp):
    """Controller CPU-seconds per minute of watch: the CPU of ansible-playbook's whole process
    tree, sampled twice while every host's ranks are running (nothing else of the play is)."""
    script = tmp / "steady.py"
    window_s = args.watch_window_s
    script.write_text(STEADY_SCRIPT)
    out = {"sizes": {}, "window_s": window_s}
    for n in args.watch_sizes:
        the_lab = lab(n)
        try:
            per_minute = []
            for i in range(args.runs):
                started = time.time()
                proc = subprocess.Popen(
                    [*ansible_cli.command("ansible-playbook"), "-i", str(the_lab.inventory),
                     "train.yml",
                     "-e", "nnodes=%d" % n, "-e", "run_dir=%s/wc%d-%d" % (tmp, n, i),
                     "-e", "script=%s" % script,
                     "-e", json.dumps({"script_args": [str(int(window_s) + 20)]})],
                    cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    stdin=subprocess.DEVNULL)
                runs = Path.home() / ".torchfleet" / "runs"

                def all_running(runs=runs, started=started, n=n):
                    logs = [p for p in runs.glob("*/node*/logs/*/attempt_0/0/stdout.log")
                            if p.stat().st_mtime >= started and "step" in p.read_text()]
                    return len(logs) >= n

                deadline = time.monotonic() + 600
                while not all_running() and time.monotonic() < deadline and proc.poll() is None:
                    time.sleep(0.5)
                time.sleep(5)  # the start task's last fork batch has returned
                first = tree_cpu_s(proc.pid)
                time.sleep(window_s)
                last = tree_cpu_s(proc.pid)
                per_minute.append((last - first) / window_s * 60)
                assert proc.wait(timeout=900) == 0
            out["sizes"]["lab%d" % n] = {"hosts": n, "cpu_s_per_minute": stats(per_minute)}
        finally:
            lab_down()
    return out
