"""Where a restart's seconds go (issue 59 item 5, "measure first"): bench restart_cost's two
runs (a worker's network cut in train.yml nnodes=6 spares=2 max_restarts=1 on 8 lab hosts, and
a fresh train.yml of the same six hosts), with the bench timer on and every process sampled.

For each run: every task's start and wall time on this machine's monotonic clock (the timer's
play starts, each task's end being the next one's start), laid against the bench's own marks
(the cut, every host's ranks started, every host's rank resuming from the checkpoint), and the
CPU of each kind of process (launch_profile's cpuacct groups and command lines) in each phase:

- restart: cut -> the watch's end (detection) -> the failed attempt's stop and gather -> the
  restart's plays (restart_plan, the re-probe and port test, the re-check decision) -> the
  launch play -> every agent started -> every rank process started -> every rank resumed;
- fresh: start -> preflight's plays -> the launch play -> the same marks.

Figures are seconds (median [min-max] over the runs); `tasks` lists each task between the
failure and every rank resumed (restart) or the start and every rank resumed (fresh), with its
offset from the cut (or the start) and its wall time, as the last run had them; runs_marks_s
each run's marks. A process shorter than a sample (SAMPLE_S) is only in "unseen".

By hand: `TORCHFLEET_BENCH_LAB_TAG=N python -m bench.restart_profile RUNS DIR` (DIR keeps the
runs, the timer's files and restart_profile.json); TORCHFLEET_BENCH_TREE=COPY measures a
changed copy of the tree.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time

import yaml

from bench import launch_profile
from bench.harness import LAB_TAG, ROOT, TIMER_ENV, env, lab, lab_down, stats
from bench.restart_cost import buckets
from lab import netns as labmod
from torchfleet import ansible_cli

SAMPLE_S = 0.1
TICK = os.sysconf("SC_CLK_TCK")
HOSTS = ["node0", "node1", "node3", "node4", "node5", "node6"]  # node2 is cut
BOUND_S = 300
# TORCHFLEET_BENCH_TREE=DIR: run the playbooks from DIR, a copy of the tree with a change to
# measure (as launch_profile.trees makes: ansible.cfg, src, inventory, train.yml).
TREE = os.environ.get("TORCHFLEET_BENCH_TREE") or str(ROOT)


def _boot_offset():
    """monotonic - (seconds since boot as /proc's start times count them)."""
    with open("/proc/uptime") as f:
        up = float(f.read().split()[0])
    return time.monotonic() - up


def _kind(argv, root_pid, pid):
    line = " ".join(argv)
    if "train.py" in line and "torch.distributed.run" not in line and "ansible" not in line:
        return "ranks (train.py)"
    return launch_profile._kind(argv, root_pid, pid)


class Groups(launch_profile.Groups):
    """launch_profile's cpuacct groups, for the bench's own lab tag."""

    def __init__(self, the_lab):
        self.the_lab = the_lab
        prefix = labmod.lab_prefix(LAB_TAG)
        self.controller = launch_profile.ACCT / (prefix + "controller-cpuacct")
        self.nodes = [launch_profile.ACCT / ("%s%s-cpuacct" % (prefix, n.name))
                      for n in the_lab.nodes]

    def __exit__(self, *exc):
        labmod.release_groups(LAB_TAG)


class Sampler(threading.Thread):
    """Every member's CPU over time: {(pid, start): [kind, group, start (monotonic), [(t, cpu)]]},
    and each group's cpuacct total over time."""

    def __init__(self, groups):
        super().__init__(daemon=True)
        self.groups, self.root_pid, self.done = groups, None, threading.Event()
        self.names = ["controller"] + [n.name for n in groups.the_lab.nodes]
        self.seen, self.totals, self.boot = {}, [], _boot_offset()

    def run(self):
        all_groups = [self.groups.controller, *self.groups.nodes]
        while not self.done.wait(SAMPLE_S):
            now = time.monotonic()
            with contextlib.suppress(OSError):
                self.totals.append((now, sum(self.groups.usage())))
            for name, group in zip(self.names, all_groups, strict=True):
                try:
                    pids = (group / "cgroup.procs").read_text().split()
                except OSError:
                    continue
                for pid in pids:
                    self._look(int(pid), name, now)

    def _look(self, pid, group, now):
        seen = launch_profile.proc_sample(pid)
        if seen is None:
            return
        cpu, started, argv = seen
        key = (pid, started)
        known = self.seen.get(key)
        if known is None:
            known = self.seen[key] = [None, group, self.boot + int(started) / TICK, []]
        if argv:  # a zombie's command line is empty: it keeps what it showed
            known[0] = _kind(argv, self.root_pid, pid)
        known[3].append((now, cpu))

    def started(self, kind, after):
        """{group: the latest start of a `kind` process started after `after`}."""
        out = {}
        for k, group, start, _ in self.seen.values():
            if k == kind and start >= after:
                out[group] = max(out.get(group, start), start)
        return out

    def cpu(self, a, b):
        """CPU-seconds by kind between a and b (a process's CPU at t: its last sample <= t)."""
        def at(series, t):
            value = 0.0
            for when, cpu in series:
                if when > t:
                    break
                value = cpu
            return value
        out = {}
        for kind, _, start, series in self.seen.values():
            if not series or series[-1][0] < a or start > b:
                continue
            used = at(series, b) - (at(series, a) if start < a else 0.0)
            if used > 0:
                out[kind or "?"] = out.get(kind or "?", 0.0) + used
        total = at(self.totals, b) - at(self.totals, a)
        out["unseen (shorter than a sample)"] = max(0.0, total - sum(out.values()))
        return out


def tasks_of(path):
    """The timer's file as [{"play", "task", "start", "seconds"}] (monotonic starts): a task
    ends where the next one (or the next play) starts, so starts are counted back from each
    play's end; a play's setup is the gap before its first task ("task": None)."""
    plays, current = [], None
    for line in path.read_text().splitlines():
        t = json.loads(line)
        if "play" in t or "end" in t:
            if current is not None:
                current["end"] = t.get("at", t.get("end"))
            if "end" in t:
                break
            current = {"play": t["play"], "at": t["at"], "tasks": []}
            plays.append(current)
        elif "task" in t and current is not None:
            current["tasks"].append(t)
    out = []
    for play in plays:
        end = play.get("end", play["at"] + sum(t["seconds"] for t in play["tasks"]))
        rows = []
        for t in reversed(play["tasks"]):
            rows.append({"play": play["play"], "task": t["task"], "start": end - t["seconds"],
                         "seconds": t["seconds"]})
            end -= t["seconds"]
        out.append({"play": play["play"], "task": None, "start": play["at"],
                    "seconds": max(0.0, end - play["at"])})
        out += reversed(rows)
    return out


def _resumed(remote, attempt_dir, hosts):
    """{host: True} for every host whose rank wrote its 'resuming' line."""
    found = {}
    for host in hosts:
        for log in remote.glob("*/%s/%slogs/*/attempt_0/0/stdout.log" % (host, attempt_dir)):
            if "resuming" in log.read_text(errors="replace"):
                found[host] = True
    return found


def _one(the_lab, argv, timings, remote, attempt_dir, on_checkpoint=None):
    """Run train.yml with the timer and the sampler; (sampler, t0, {host: resumed at}, rc, out):
    t0 the start, or the cut when on_checkpoint (called once the checkpoint exists) cuts.
    The groups are made for each run: the lab's heal() removes them."""
    with Groups(the_lab) as groups:
        return _sampled(groups, argv, timings, remote, attempt_dir, on_checkpoint)


def _sampled(groups, argv, timings, remote, attempt_dir, on_checkpoint):
    sampler = Sampler(groups)
    sampler.start()
    t0 = time.monotonic()
    proc = subprocess.Popen([*ansible_cli.command("ansible-playbook"), *argv], cwd=TREE,
                            env=env(**TIMER_ENV, BENCH_TIMINGS=str(timings)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL, preexec_fn=groups.join)
    sampler.root_pid = proc.pid
    resumed = {}
    try:
        if on_checkpoint is not None:
            t0 = on_checkpoint(proc)
        end = time.monotonic() + BOUND_S
        while len(resumed) < len(HOSTS):
            assert proc.poll() is None and time.monotonic() < end, "the ranks never resumed"
            now = time.monotonic()
            for host in _resumed(remote, attempt_dir, [h for h in HOSTS if h not in resumed]):
                resumed[host] = now
            time.sleep(0.1)
        out, _ = proc.communicate(timeout=BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sampler.done.set()
        sampler.join()
    return sampler, t0, resumed, proc.returncode, out


def _find(rows, after, play=None, task=None):
    """The first row starting at or after `after`: with `play`, the start (setup) of a play
    whose name starts so; with `task`, a task whose name (after its role's) holds it."""
    for r in rows:
        if r["start"] >= after - 1e-6 and (
                (play is not None and r["task"] is None and r["play"].startswith(play))
                or (task is not None and task in (r["task"] or ""))):
            return r
    return None


def _marks(rows, sampler, t0, resumed, restart):
    """The run's marks (seconds after t0) and its phases."""
    m = {}
    if restart:
        gather = _find(rows, t0, task="Stop whatever is left")
        plan = _find(rows, t0, play="Restart | after a failed attempt")
        probe = _find(rows, t0, play="Restart | probe the remaining")
        decide = _find(rows, t0, play="Restart | decide with the re-check")
        unguard = _find(rows, t0, task="Remove the guard of the run's ports on this host")
        m["watch end (the master's verdict back)"] = gather["start"] if gather else None
        m["gather end (the failed attempt stopped, its logs back)"] = \
            unguard["start"] if unguard else None
        m["restart_plan play"] = plan["start"] if plan else None
        m["re-probe play"] = probe["start"] if probe else None
        m["re-check decision play"] = decide["start"] if decide else None
    else:
        m["preflight: probe play"] = (_find(rows, t0, play="Preflight | probe every node")
                                      or {}).get("start")
        m["preflight: decide play"] = (_find(rows, t0, play="Preflight | decide and report")
                                       or {}).get("start")
    launch = _find(rows, t0, play="Attempt | launch and watch")
    agents = _find(rows, t0, task="Start this host's agent")
    watch2 = _find(rows, launch["start"] if launch else t0, task="Watch the run on its master")
    m["launch play"] = launch["start"] if launch else None
    m["agents' start task"] = agents["start"] if agents else None
    m["watch task (every agent started)"] = watch2["start"] if watch2 else None
    after = launch["start"] if launch else t0
    for kind, label in (("torchrun (each host's agent)", "torchrun"),
                        ("ranks (train.py)", "ranks")):
        started = sampler.started(kind, after)
        if started:
            m["first %s started" % label] = min(started.values())
            m["last %s started" % label] = max(started.values())
    m["first rank resumed"] = min(resumed.values())
    m["every rank resumed"] = max(resumed.values())
    marks = {k: v - t0 for k, v in sorted(((k, v) for k, v in m.items() if v is not None),
                                          key=lambda kv: kv[1])}
    # Phases: between consecutive marks, each with its CPU by process.
    names, points = ["cut" if restart else "start", *marks], [t0, *(t0 + v for v in marks.values())]
    phases = {}
    for i in range(1, len(points)):
        key = "%s -> %s" % (names[i - 1], names[i])
        phases[key] = {"s": points[i] - points[i - 1],
                       "cpu_s": {k: round(v, 2) for k, v in sorted(
                           sampler.cpu(points[i - 1], points[i]).items(), key=lambda kv: -kv[1])
                           if v >= 0.05}}
    # From the task running at t0 (the watch of the attempt that failed) to the last mark.
    first = max([i for i, r in enumerate(rows) if r["start"] <= t0] or [0])
    tasks = [[round(r["start"] - t0, 2), round(r["seconds"], 2), r["play"], r["task"] or "(setup)"]
             for r in rows[first:] if r["start"] <= points[-1]]
    return marks, phases, tasks


def run(args, tmp):
    """bench restart_cost's restart and fresh run, each args.runs times, profiled."""
    the_lab = lab(8)
    inv = yaml.safe_load(the_lab.inventory.read_text())
    inv["all"]["children"]["nodes"]["hosts"] = {
        h: v for h, v in inv["all"]["children"]["nodes"]["hosts"].items() if h in HOSTS}
    hand_inventory = tmp / "by-hand.yml"
    hand_inventory.write_text(yaml.safe_dump(inv, sort_keys=False))
    sides = {"restart": [], "fresh": []}
    try:
        for i in range(args.runs):
            ckpt, remote = tmp / ("ckpt%d" % i), tmp / ("remote%d" % i)

            def cut(proc, ckpt=ckpt):
                end = time.monotonic() + BOUND_S
                while not (ckpt / "ddp_train.pt").exists():
                    assert proc.poll() is None and time.monotonic() < end, "no checkpoint"
                    time.sleep(0.1)
                the_lab.cut_network("node2")
                return time.monotonic()

            timings = tmp / ("rs-%d.jsonl" % i)
            try:
                sampler, t0, resumed, rc, out = _one(
                    the_lab, ["-i", str(the_lab.inventory), "train.yml", "-e", "nnodes=6",
                              "-e", "spares=2", "-e", "max_restarts=1", "-e", "lost_after_s=5",
                              "-e", "train_steps=400", "-e", "train_checkpoint_dir=%s" % ckpt,
                              "-e", "remote_runs_root=%s" % remote,
                              "-e", "run_dir=%s/rs-%d" % (tmp, i),
                 # Each run its own ledger: the fleet's memory would quarantine the host
                 # cut in every run, and the next runs would leave it out.
                 "-e", "fleet_db=%s/rs-%d.db" % (tmp, i)],
                    timings, remote, "attempt_1/", cut)
            finally:
                the_lab.heal()
            assert rc == 0, out[-3000:]
            marks, phases, tasks = _marks(tasks_of(timings), sampler, t0, resumed, True)
            sides["restart"].append({"marks": marks, "phases": phases, "tasks": tasks,
                                     "buckets": buckets(tmp / ("rs-%d" % i))})
            hand_ckpt, hand_remote = tmp / ("hand-ckpt%d" % i), tmp / ("hand-remote%d" % i)
            hand_ckpt.mkdir()
            (hand_ckpt / "ddp_train.pt").write_bytes((ckpt / "ddp_train.pt").read_bytes())
            timings = tmp / ("fr-%d.jsonl" % i)
            sampler, t0, resumed, rc, out = _one(
                the_lab, ["-i", str(hand_inventory), "train.yml", "-e", "nnodes=6",
                          "-e", "train_steps=400", "-e", "train_checkpoint_dir=%s" % hand_ckpt,
                          "-e", "remote_runs_root=%s" % hand_remote,
                          "-e", "run_dir=%s/fr-%d" % (tmp, i),
                 # Each run its own ledger: the fleet's memory would quarantine the host
                 # cut in every run, and the next runs would leave it out.
                 "-e", "fleet_db=%s/fr-%d.db" % (tmp, i)], timings, hand_remote, "")
            assert rc == 0, out[-3000:]
            marks, phases, tasks = _marks(tasks_of(timings), sampler, t0, resumed, False)
            sides["fresh"].append({"marks": marks, "phases": phases, "tasks": tasks,
                                   "buckets": buckets(tmp / ("fr-%d" % i))})
    finally:
        lab_down()
    return {side: _summary(runs) for side, runs in sides.items()}


def _summary(runs):
    """Each mark and phase over the runs; the CPU by process and the tasks of the last run."""
    def over(key):
        names = [k for k in runs[-1][key]]
        return {k: stats([r[key][k] if key == "marks" else r[key][k]["s"]
                          for r in runs if k in r[key]]) for k in names}
    return {"marks_s": over("marks"), "runs_marks_s": [r["marks"] for r in runs],
            "phases_s": over("phases"),
            "phases_cpu_s": {k: v["cpu_s"] for k, v in runs[-1]["phases"].items()},
            "buckets": [r["buckets"] for r in runs], "tasks": runs[-1]["tasks"]}


def markdown(r):
    """A table of each side's phases, then its tasks of 0.3 s or more."""
    lines = []
    for side, s in r.items():
        lines += ["", "%s: phase | s median [min-max] | CPU-s by process (last run)" % side,
                  "--- | --- | ---"]
        for k, v in s["phases_s"].items():
            cpu = ", ".join("%s %.1f" % kv for kv in s["phases_cpu_s"].get(k, {}).items())
            lines.append("%s | %.1f [%.1f-%.1f] | %s" % (k, v["median"], v["min"], v["max"], cpu))
        lines += ["", "%s: tasks of 0.3 s or more (offset s, wall s, play, task):" % side]
        lines += ["  %+.1f %.1f %s / %s" % tuple(t) for t in s["tasks"] if t[1] >= 0.3]
    return "\n".join(lines)


if __name__ == "__main__":  # python -m bench.restart_profile [runs [DIR]]: prints the figures
    import sys
    import tempfile
    from pathlib import Path

    # DIR (kept): the runs' directories and timer files, and restart_profile.json.
    d = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(tempfile.mkdtemp(prefix="rp-"))
    d.mkdir(parents=True, exist_ok=True)
    res = run(type("A", (), {"runs": int(sys.argv[1]) if len(sys.argv) > 1 else 1})(), d)
    (d / "restart_profile.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    print(markdown(res))
