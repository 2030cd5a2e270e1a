"""A launch with its ranks in a container against the same launch on the host (issue 68): on the
same lab, train.yml of the built-in workload (20 steps, as the lab's container test) once with
container_image (podman, the lab's image and settings: lab/podman.py) and once without,
alternating (the order flips each run), at each of --container-sizes lab hosts. Both sides run
through the same sshd settings (the podman environment is given to every host once, before the
first run), so the difference is what the container path adds: preflight's container.* checks
and its Python probe run in a throwaway container per host, and each host's torchrun starts
under `podman run` and its container is removed at the end. Where the seconds go: train.json's
goodput buckets (preflight, launch to every rank running, init, training, teardown) and the
timer callback's per-task times, median per side; and podman's own start (`python -c pass` in
the image against the same on this machine, outside the lab).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections import defaultdict

from bench.harness import TIMER_ENV, lab, lab_down, playbook, stats, timed
from lab import podman as labpodman

SIDES = {"container": labpodman.EXTRA_VARS, "host": []}
# The bench's podman storage, its own: the lab tests (other tags, at the same time) import,
# replace and remove images in theirs, and an image gone mid-run fails container.pull.
STORAGE = "bench"
# A task whose medians differ by less than this is noise on 2 busy CPUs, not the container's.
TASK_DELTA_S = 0.2


def task_seconds(timings):
    """{task: seconds} of one playbook run (a task name run in several plays: their sum)."""
    out = defaultdict(float)
    for line in timings.read_text().splitlines():
        row = json.loads(line)
        if "task" in row:
            out[row["task"]] += row["seconds"]
    return out


def added_by(values):
    """{name: median on the container side - median on the host side} of {side: {name: [s]}}
    (a name one side lacks counts 0 there)."""
    median = {side: {k: statistics.median(v) for k, v in values[side].items()} for side in SIDES}
    return {k: median["container"].get(k, 0.0) - median["host"].get(k, 0.0)
            for k in set(median["container"]) | set(median["host"])}


def one_run(the_lab, side, run_dir, timings):
    timings.unlink(missing_ok=True)
    wall, _, rc, out = playbook("train.yml", the_lab.inventory, "-e", "run_dir=%s" % run_dir,
                                "-e", "train_steps=20", *SIDES[side], **TIMER_ENV,
                                BENCH_TIMINGS=str(timings))
    assert rc == 0, out[-3000:]
    checks = json.loads((run_dir / "preflight.json").read_text())["checks"]
    ran_in = {c["host"] for c in checks if c["id"] == "container.runtime" and c["ok"]}
    # The container side took the container path on every host, the host side on none.
    assert ran_in == ({node.name for node in the_lab.nodes} if side == "container" else set()), \
        ran_in
    report = json.loads((run_dir / "train.json").read_text())
    assert labpodman.containers("torchfleet-" + report["run_id"], STORAGE) == [], report["run_id"]
    # (a bucket that is null, lost_work without checkpoints, is left out)
    buckets = {k: v for k, v in report["goodput"]["buckets"].items() if v is not None}
    return wall, task_seconds(timings), buckets


def container_launch_at(n, args, tmp):
    the_lab = lab(n)
    timings = tmp / "container-timings.jsonl"
    try:
        labpodman.use_on(the_lab, {node.name: STORAGE for node in the_lab.nodes})
        walls = {side: [] for side in SIDES}
        tasks = {side: defaultdict(list) for side in SIDES}
        buckets = {side: defaultdict(list) for side in SIDES}
        for i in range(args.runs):
            for side in (list(SIDES) if i % 2 == 0 else list(SIDES)[::-1]):
                wall, seconds, parts = one_run(the_lab, side,
                                               tmp / ("cl%d-%s-%d" % (n, side, i)), timings)
                walls[side].append(wall)
                for task, s in seconds.items():
                    tasks[side][task].append(s)
                for bucket, s in parts.items():
                    buckets[side][bucket].append(s)
        added = sorted(added_by(tasks).items(), key=lambda kv: -abs(kv[1]))
        c, h = (statistics.median(walls[s]) for s in ("container", "host"))
        return {"hosts": n, "container_s": stats(walls["container"]),
                "host_s": stats(walls["host"]), "added_s": c - h, "ratio": c / h,
                "ratio_min": min(walls["container"]) / max(walls["host"]),
                "ratio_max": max(walls["container"]) / min(walls["host"]),
                "buckets": {side: {k: stats(v) for k, v in buckets[side].items()}
                            for side in SIDES},
                "buckets_added_s": {k: round(v, 3) for k, v in added_by(buckets).items()},
                "task_delta_s": TASK_DELTA_S, "tasks_added_s": [{"task": t, "seconds": round(d, 3)} for t, d in added
                                  if abs(d) >= TASK_DELTA_S]}
    finally:
        lab_down()


def in_image_vs_host(code, runs):
    """`python -c code` in the lab's image under podman (no network, the venv mounted
    read-only, as preflight's probe) vs the same interpreter on this machine, alternating."""
    python = sys.executable  # (the image holds the base interpreter the venv's links reach)
    argv = {"podman": ["podman", "run", "--rm", "--network", "none", "--ulimit", "host",
                       "--volume", "%s:%s:ro" % (sys.prefix, sys.prefix), labpodman.IMAGE,
                       python, "-c", code],
            "host": [python, "-c", code]}
    walls = {side: [] for side in argv}
    for _ in range(runs):
        for side, cmd in argv.items():
            wall, _, rc, out = timed(cmd, timeout_s=120, **labpodman.env(STORAGE))
            assert rc == 0, out[-2000:]
            walls[side].append(wall)
    return {"podman_s": stats(walls["podman"]), "host_s": stats(walls["host"]),
            "added_s": statistics.median(walls["podman"]) - statistics.median(walls["host"])}


def run(args, tmp):
    reason = labpodman.unavailable()
    if reason:
        return {"skipped": reason}
    labpodman.ensure_image(STORAGE, marker=STORAGE)  # (use_on's marker for a storage of its own)
    load = [round(os.getloadavg()[0], 2)]
    began = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    # A container's start (python -c pass), and a rank's `import torch` in the image, which
    # every rank of the launch pays once (train.json's init).
    out = {"podman_start": in_image_vs_host("pass", max(args.runs, 5)),
           "import_torch": in_image_vs_host("import torch", max(args.runs, 5)), "sizes": {}}
    for n in args.container_sizes:
        out["sizes"]["lab%d" % n] = container_launch_at(n, args, tmp)
        load.append(round(os.getloadavg()[0], 2))
    out.update(began=began, load_1min=load)
    return out
