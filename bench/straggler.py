"""What watching stragglers costs the ranks and how well it names one (issue 49).

- Step time, sampling on against off, side by side, run by run interleaved: a one-rank gloo
  group with the run's sitecustomize (the Flight Recorder's watcher) running a training loop
  (compute for COMPUTE_MS of CPU, then an all_reduce of 16 Ki floats) with the recorder full
  (flight_recorder's default, 2000 entries: the dump's worst case); on is the environment an
  agent gives its ranks, off the same without TORCHFLEET_FR_SAMPLE (the recorder and its
  position watcher stay on in both). NCCL's timing cost needs a GPU: none here (its figure,
  from the H200 recordings, is in docs/running.md).
- In the lab (4 hosts, gloo, train.yml with the same loop as tests/lab/test_straggler_lab.py):
  clean runs, counting the stragglers the master named (false names; goal 0); and runs with
  node2's CPU capped by a cgroup 20 s into training, the delay from the cap to the record's
  first_seen of node2 (the master's clock is this machine's wall clock from its start).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ansible_collections.torchfleet.fleet.plugins.module_utils.run import flight, stacks, straggle
from bench.harness import ROOT, env, lab, lab_down, stats
from lab.ports import free_port
from torchfleet import ansible_cli

SCRIPT = ROOT / "tests" / "fixtures" / "scripts" / "compute_then_allreduce.py"
COMPUTE_MS = 5.0
STEPS = 11000  # about a minute: several of the sampling periods (20 s with the recorder full)

LOOP = r"""
import sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % sys.argv[1], rank=0,
                        world_size=1)
grad = torch.ones(16384)
for _ in range(2500):  # the recorder full, as in a long run
    dist.all_reduce(grad)
steps, compute_s = int(sys.argv[2]), float(sys.argv[3]) / 1000.0
began = time.perf_counter()
for _ in range(steps):
    end = time.thread_time() + compute_s
    while time.thread_time() < end:
        pass
    dist.all_reduce(grad)
print((time.perf_counter() - began) / steps * 1e3)
"""


def step_ms(tmp, sampling, i):
    run_dir = Path(tmp) / ("straggle-%s-%d" % (sampling, i))
    (run_dir / "0").mkdir(parents=True)
    e = dict(os.environ, RANK="0", TORCHELASTIC_ERROR_FILE=str(run_dir / "0" / "error.json"))
    e.update(flight.rank_env(2000, str(run_dir)))
    if sampling:
        e.update(straggle.rank_env(2000))
    stacks.install_hook(str(run_dir), e, flight.WATCHER)
    out = subprocess.run([sys.executable, "-c", LOOP, str(free_port()), str(STEPS),
                          str(COMPUTE_MS)], env=e, check=True, timeout=600, capture_output=True,
                         text=True).stdout
    return float(out.split()[-1])


def cost(runs, tmp):
    on, off = [], []
    for i in range(runs):
        off.append(step_ms(tmp, False, i))
        on.append(step_ms(tmp, True, i))
    return {"step_ms_on": stats(on), "step_ms_off": stats(off),
            "ratio": stats([a / b for a, b in zip(on, off, strict=True)])}


def lab_run(the_lab, tmp, name, steps, cap_after_s=None):
    """One train.yml on the lab's 4 hosts; (its record, seconds from the cap to node2 named)."""
    run_dir = tmp / name
    started = time.time()
    proc = subprocess.Popen(
        [*ansible_cli.command("ansible-playbook"), "train.yml", "-i", str(the_lab.inventory),
         "-e", "nnodes=4", "-e", "script=%s" % SCRIPT,
         "-e", json.dumps({"script_args": [str(steps), "15"]}), "-e", "run_dir=%s" % run_dir],
        cwd=ROOT, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL)
    capped = None
    try:
        if cap_after_s is not None:
            end = time.monotonic() + 300
            while time.monotonic() < end and proc.poll() is None and not _training(started):
                time.sleep(0.5)
            time.sleep(cap_after_s)
            the_lab.limit_cpu("node2")
            capped = time.time()
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
        the_lab.heal()
    record = json.loads((run_dir / "run_state.json").read_text())
    named = [s for s in record.get("stragglers") or [] if s["host"] == "node2"]
    delay = named[0]["first_seen"] - capped if capped is not None and named else None
    return record, delay


def _training(started):
    runs = Path(os.path.expanduser("~/.torchfleet/runs"))
    logs = [p for p in runs.glob("*/node*/logs/*/attempt_0/0/stdout.log")
            if p.stat().st_mtime >= started and "step" in p.read_text(errors="replace")]
    return len(logs) >= 4


def in_lab(runs, tmp):
    the_lab = lab(4)
    try:
        false, delays, wrong = [], [], []
        for i in range(runs):
            record, _ = lab_run(the_lab, tmp, "clean%d" % i, 500)
            false.append(len(record.get("stragglers") or []))
        for i in range(max(1, runs // 2)):
            record, delay = lab_run(the_lab, tmp, "capped%d" % i, 900, cap_after_s=20)
            wrong.append(len([s for s in record.get("stragglers") or []
                              if s["host"] != "node2"]))
            if delay is not None:
                delays.append(delay)
        return {"false_names": false, "cap_to_named_s": stats(delays) if delays else None,
                "named": len(delays), "capped_runs": len(wrong), "others_named": wrong}
    finally:
        lab_down()


def run(args, tmp):
    return {"cost": cost(args.runs, tmp), "lab": in_lab(args.runs, Path(tmp))}
