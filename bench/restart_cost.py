"""A worker's network cut to every rank of the restarted attempt running, against a fresh run."""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import time

import yaml

from bench.harness import ROOT, env, lab, lab_down, stats
from torchfleet import ansible_cli

# TORCHFLEET_BENCH_TREE=DIR: run the playbooks from DIR, a copy of the tree (ansible.cfg, src,
# inventory, train.yml) at another revision: a baseline measured beside a change.
TREE = os.environ.get("TORCHFLEET_BENCH_TREE") or str(ROOT)


def all_ranks_resumed(remote, hosts, attempt_dir):
    """True once every host's rank wrote its 'resuming from the checkpoint' line (after the
    process group formed): every rank of the attempt runs."""
    found = set()
    for host in hosts:
        for log in remote.glob("*/%s/%slogs/*/attempt_0/0/stdout.log" % (host, attempt_dir)):
            if "resuming" in log.read_text(errors="replace"):
                found.add(host)
    return found == set(hosts)


def buckets(run_dir):
    """train.json's goodput of a finished run: the restart's buckets (its failure's detection
    and restart, the next attempt's launch and init, the failure's cost) or a fresh run's
    (preflight, launch, init); {} when the run wrote none."""
    try:
        g = json.loads((run_dir / "train.json").read_text())["goodput"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    if len(g["attempts"]) > 1:
        first, second = g["attempts"][0]["buckets"], g["attempts"][1]["buckets"]
        return {"detection": first["detection"], "restart": first["restart"],
                "launch": second["launch"], "init": second["init"],
                "cost": g["failures"][0]["cost_s"] if g["failures"] else None}
    b = g["attempts"][0]["buckets"] if g["attempts"] else g["buckets"]
    return {"preflight": b["preflight"], "launch": b["launch"], "init": b["init"]}


def run(args, tmp):
    """From a worker's network cut to every rank of the restarted attempt running (train.yml
    nnodes=6 spares=2 max_restarts=1 on 8 lab hosts, lost_after_s=5), against a fresh train.yml
    of the same six hosts started by hand (an inventory without the cut host) to every rank
    running; both resume the built-in DDP workload from a checkpoint."""
    the_lab = lab(8)
    hosts = ["node0", "node1", "node3", "node4", "node5", "node6"]
    inv = yaml.safe_load(the_lab.inventory.read_text())
    by_hand = {h: v for h, v in inv["all"]["children"]["nodes"]["hosts"].items() if h in hosts}
    inv["all"]["children"]["nodes"]["hosts"] = by_hand
    hand_inventory = tmp / "by-hand.yml"
    hand_inventory.write_text(yaml.safe_dump(inv, sort_keys=False))
    times = {"restart": [], "fresh": []}
    parts = {"restart": [], "fresh": []}  # train.json's goodput buckets of each run

    def wait(predicate, proc, what):
        end = time.monotonic() + 300
        while not predicate():
            assert proc.poll() is None and time.monotonic() < end, what
            time.sleep(0.1)
        return time.monotonic()

    try:
        for i in range(args.runs):
            ckpt, remote = tmp / ("ckpt%d" % i), tmp / ("remote%d" % i)
            proc = subprocess.Popen(
                [*ansible_cli.command("ansible-playbook"), "-i", str(the_lab.inventory), "train.yml",
                 "-e", "nnodes=6", "-e", "spares=2", "-e", "max_restarts=1",
                 "-e", "lost_after_s=5", "-e", "train_steps=400",
                 "-e", "train_checkpoint_dir=%s" % ckpt, "-e", "remote_runs_root=%s" % remote,
                 "-e", "run_dir=%s/rs-%d" % (tmp, i),
                 # Each run its own ledger: the fleet's memory would quarantine the host
                 # cut in every run, and the next runs would leave it out.
                 "-e", "fleet_db=%s/rs-%d.db" % (tmp, i)],
                cwd=TREE, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True)
            wait(lambda: (ckpt / "ddp_train.pt").exists(), proc, "no checkpoint")  # noqa: B023
            the_lab.cut_network("node2")
            cut = time.monotonic()
            running = wait(lambda: all_ranks_resumed(remote, hosts, "attempt_1/"),  # noqa: B023
                           proc, "attempt 1 never ran")
            out, _ = proc.communicate(timeout=300)
            the_lab.heal()
            assert proc.returncode == 0, out[-3000:]
            times["restart"].append(running - cut)
            parts["restart"].append(buckets(tmp / ("rs-%d" % i)))
            # By hand: the same checkpoint, an inventory without node2, a fresh train.yml.
            hand_ckpt, hand_remote = tmp / ("hand-ckpt%d" % i), tmp / ("hand-remote%d" % i)
            hand_ckpt.mkdir()
            shutil.copy(ckpt / "ddp_train.pt", hand_ckpt / "ddp_train.pt")
            start = time.monotonic()
            proc = subprocess.Popen(
                [*ansible_cli.command("ansible-playbook"), "-i", str(hand_inventory), "train.yml",
                 "-e", "nnodes=6", "-e", "train_steps=400",
                 "-e", "train_checkpoint_dir=%s" % hand_ckpt,
                 "-e", "remote_runs_root=%s" % hand_remote, "-e", "run_dir=%s/fr-%d" % (tmp, i),
                 # Each run its own ledger: the fleet's memory would quarantine the host
                 # cut in every run, and the next runs would leave it out.
                 "-e", "fleet_db=%s/fr-%d.db" % (tmp, i)],
                cwd=TREE, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True)
            running = wait(lambda: all_ranks_resumed(hand_remote, hosts, ""),  # noqa: B023
                           proc, "the fresh run never ran")
            out, _ = proc.communicate(timeout=300)
            assert proc.returncode == 0, out[-3000:]
            times["fresh"].append(running - start)
            parts["fresh"].append(buckets(tmp / ("fr-%d" % i)))
    finally:
        lab_down()
    r, f = times["restart"], times["fresh"]
    return {"hosts": 8, "restart_s": stats(r), "fresh_s": stats(f),
            "ratio": statistics.median(r) / statistics.median(f),
            "ratio_min": min(r) / max(f), "ratio_max": max(r) / min(f),
            "buckets": {side: {k: stats([p[k] for p in runs if p.get(k) is not None])
                               for k in sorted({k for p in runs for k in p})
                               if any(p.get(k) is not None for p in runs)}
                        for side, runs in parts.items()}}
