"""What detaching costs: train.yml -e detach=true to the run's report, finished unattended by
the controller or by attach.yml, against the same run attached, side by side on the same lab
hosts; and one status look."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from bench.harness import BIN, lab, lab_down, playbook, stats, timed


def wait_for(path: Path, timeout_s: float = 600) -> None:
    end = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < end, "%s never came" % path
        time.sleep(0.1)


def end_unattended(run_dir: Path) -> None:
    """SIGKILL the controller's unattended finisher (it holds the attach lock), as a controller
    shut down would."""
    wait_for(run_dir / "attach.lock")
    pid = json.loads((run_dir / "attach.lock").read_text())["pid"]
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run(args, tmp):
    """On 3 lab hosts, the built-in DDP workload (train_steps steps) three ways, in turn:
    attached (train.yml to its end); detached and finished unattended (train.yml -e
    detach=true returns once every rank runs; the controller's background attach gathers and
    reports it: timed to its train.json); detached and finished by attach.yml (the background
    attach killed, as on a controller shut down; attach.yml -e run_id= to its end). During the
    second, status.yml -e run_id= (one look at the master's record) against `ansible node0 -m
    ping` (one Ansible round trip)."""
    the_lab = lab(3)
    inv = the_lab.inventory
    common = ("-e", "nnodes=3", "-e", "train_steps=%d" % args.detach_steps)
    times = {k: [] for k in ("attached", "unattended", "detach", "attach", "status", "ping")}
    try:
        for i in range(args.runs):
            wall, _, rc, out = playbook("train.yml", inv, *common,
                                        "-e", "run_dir=%s/attached%d" % (tmp, i))
            assert rc == 0, out[-3000:]
            times["attached"].append(wall)

            run_id = "unattended%d-%d" % (i, time.time_ns() % 100000)
            start = time.monotonic()
            _, _, rc, out = playbook("train.yml", inv, *common, "-e", "detach=true",
                                     "-e", "run_id=%s" % run_id, "-e", "runs_root=%s" % tmp)
            assert rc == 0 and "is detached" in out, out[-3000:]
            wall, _, rc, out = playbook("status.yml", inv, "-e", "run_id=%s" % run_id,
                                        "-e", "runs_root=%s" % tmp)
            assert rc == 0, out[-3000:]
            times["status"].append(wall)
            wall, _, rc, out = timed([str(BIN / "ansible"), "-i", str(inv), "node0", "-m",
                                      "ping"])
            assert rc == 0, out[-3000:]
            times["ping"].append(wall)
            wait_for(tmp / run_id / "train.json")
            times["unattended"].append(time.monotonic() - start)

            run_id = "attach%d-%d" % (i, time.time_ns() % 100000)
            wall, _, rc, out = playbook("train.yml", inv, *common, "-e", "detach=true",
                                        "-e", "run_id=%s" % run_id, "-e", "runs_root=%s" % tmp)
            assert rc == 0 and "is detached" in out, out[-3000:]
            end_unattended(tmp / run_id)
            times["detach"].append(wall)
            wall, _, rc, out = playbook("attach.yml", inv, "-e", "run_id=%s" % run_id,
                                        "-e", "runs_root=%s" % tmp)
            assert rc == 0 and "train ok" in out, out[-3000:]
            times["attach"].append(wall)
    finally:
        lab_down()
    by_attach = [d + a for d, a in zip(times["detach"], times["attach"], strict=True)]
    return {"hosts": 3, "steps": args.detach_steps,
            **{"%s_s" % k: stats(v) for k, v in times.items()},
            "by_attach_s": stats(by_attach),
            "unattended_ratio": stats([u / a for u, a in zip(
                times["unattended"], times["attached"], strict=True)]),
            "attach_ratio": stats([b / a for b, a in zip(by_attach, times["attached"],
                                                         strict=True)]),
            "status_ratio": stats([s / p for s, p in zip(times["status"], times["ping"],
                                                         strict=True)])}
