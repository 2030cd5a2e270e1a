"""Where a 2-host launch spends its wall time and its CPU (issue 58, "measure first"):
collective.yml and train.yml (the same workload: collective.py, 64K, 5 iterations) on 2 lab
hosts, beside the guides' raw ssh + torchrun of it, task by task (the bench timer callback)
and process by process.

CPU: the controller's side (ansible-playbook and everything it forks, or the raw launch's ssh
clients) and each node's sshd with every session it serves and every process of its namespace
go into cpuacct cgroups of this bench's own (tflab15-*-cpuacct), whose cpuacct.usage is the
total; cgroups follow fork, so what Ansible's async wrapper detaches is still counted. A
sampler reads every member's utime + stime each SAMPLE_S and files it under what its command
line says it is (the last it showed): a process shorter than a sample is only in the total
("unseen"). Every figure is CPU-seconds of one run, median [min-max] over the runs.

With a revision (`python -m bench.launch_profile 3 REV`, or TORCHFLEET_BENCH_BEFORE=REV), the
playbooks run side by side, in turn, from two copies of the working tree made at the same
instant: "after" as it is, "before" with the launch's playbooks and roles (LAUNCH_PATHS) as they
were at REV; everything else (preflight, the agent, the modules) is the same in both.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.harness import ROOT, TIMER_ENV, WORKLOADS, env, raw_launch, stats
from lab import netns as labmod
from torchfleet import ansible_cli

LAB_TAG = 15  # its own lab: bench's tag 3 is other benches'
LAB_DIR = Path(tempfile.gettempdir()) / "torchfleet-lab-profile"
ACCT = Path("/sys/fs/cgroup/cpuacct")
SAMPLE_S = 0.05
TICK = os.sysconf("SC_CLK_TCK")
SARGS = ["--sizes", "64K", "--iters", "5"]
COLLECTION = "src/ansible_collections/torchfleet/fleet"
# What the launch's controller share is made of (issue 58 item 2): a "before" tree takes these
# from the revision it is given.
LAUNCH_PATHS = [COLLECTION + "/playbooks/" + name for name in (
    "train.yml", "collective.yml", "attempt.yml", "report.yml", "attach.yml", "tasks", "vars")] + [
    COLLECTION + "/roles/launch", COLLECTION + "/roles/results"]
TREE = ["ansible.cfg", "src", "inventory", "train.yml", "collective.yml"]


def trees(rev, dest):
    """{"before": dir, "after": dir}: copies of the working tree, the first with LAUNCH_PATHS
    as they were at rev."""
    out = {}
    for name in ("after", "before"):
        root = dest / name
        root.mkdir()
        subprocess.run(["cp", "-a", *TREE, str(root)], cwd=ROOT, check=True)
        out[name] = root
    def git(*argv):
        return subprocess.run(["git", *argv, "--", *LAUNCH_PATHS], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.split()
    changed = git("diff", "--name-only", rev) + git("ls-files", "--others", "--exclude-standard")
    for path in changed:
        old = subprocess.run(["git", "show", "%s:%s" % (rev, path)], cwd=ROOT, capture_output=True)
        target = out["before"] / path
        if old.returncode:  # new since rev
            target.unlink(missing_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(old.stdout)
    return out


def _kind(argv, root_pid, pid):
    """What a process is, from its command line."""
    line = " ".join(argv)
    head = os.path.basename(argv[0]) if argv else "?"
    if pid == root_pid:
        return "ansible-playbook (its main process)"
    if "ansible-playbook" in line:
        return "ansible-playbook (its forks)"
    if head == "ssh":
        return "ssh clients"
    if head.startswith("sshd") or line.startswith("sshd"):
        return "sshd (the nodes')"
    if "torch.distributed.run" in line or head == "torchrun":
        return "torchrun (each host's agent)"
    if "collective.py" in line:
        return "ranks (collective.py)"
    if "torchrun_job" in line:
        return "torchfleet's agent (torchrun_job)"
    if "AnsiballZ" in line or "ansible-tmp" in line or "async_wrapper" in line \
            or head.startswith("python") and argv[1:] in ([], ["-"]):  # pipelined: on stdin
        return "Ansible modules (python reading the module on stdin)"
    if head.startswith("python") and argv[1:2] == ["-c"]:
        return "python -c: the port-test listener" if "select" in line \
            else "python -c: " + line.split("\n")[0][len(argv[0]) + 4:][:40]
    return "other: " + head



def proc_sample(pid):
    """(CPU-seconds so far, its start time in ticks since boot as /proc writes it, command
    line) of a process, or None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / TICK, fields[19], argv

class Sampler(threading.Thread):
    """Each member of `groups`' last utime + stime, by (pid, start time)."""

    def __init__(self, groups, root_pid):
        super().__init__(daemon=True)
        self.groups, self.root_pid, self.done = groups, root_pid, threading.Event()
        self.seen = {}  # (pid, start) -> [kind, cpu s]
        self.unknown = set()  # command lines filed under "other: python" (to name them)

    def run(self):
        while not self.done.wait(SAMPLE_S):
            for group in self.groups:
                with contextlib.suppress(OSError):
                    pids = (group / "cgroup.procs").read_text().split()
                for pid in pids:
                    self._look(int(pid))

    def _look(self, pid):
        seen = proc_sample(pid)
        if seen is None:
            return
        cpu, started, argv = seen
        key = (pid, started)
        known = self.seen.get(key)
        # What it showed while alive: a zombie's command line is empty.
        kind = known[0] if known and not argv else _kind(argv, self.root_pid, pid)
        self.seen[key] = [kind, cpu]
        if kind.startswith("other: python") and len(self.unknown) < 20:
            self.unknown.add(" ".join(argv)[:300])

    def by_kind(self):
        out = {}
        for kind, cpu in self.seen.values():
            out[kind] = out.get(kind, 0.0) + cpu
        return out


class Groups:
    """cpuacct groups of this bench's own: the controller's, and one per node holding its sshd,
    every session and every process of its namespace (the lab's limit_cpu does the same for the
    cpu controller)."""

    def __init__(self, the_lab):
        self.the_lab = the_lab
        prefix = labmod.lab_prefix(LAB_TAG)
        self.controller = ACCT / (prefix + "controller-cpuacct")
        self.nodes = [ACCT / ("%s%s-cpuacct" % (prefix, n.name)) for n in the_lab.nodes]

    def __enter__(self):
        for group in (self.controller, *self.nodes):
            group.mkdir(exist_ok=True)
        labmod.close_control_masters(self.the_lab.root)  # new sessions fork inside the group
        for node, group in zip(self.the_lab.nodes, self.nodes, strict=True):
            pid = self.the_lab.sshd_pid(node)
            members = {int(p) for p in labmod.sh("ip", "netns", "pids", node.ns,
                                                  check=False).stdout.split()}
            if pid:
                members |= {pid} | labmod.procs.descendants(labmod.procs.table(), [pid])
            for member in members:
                with contextlib.suppress(OSError):
                    (group / "cgroup.procs").write_text(str(member))
        return self

    def usage(self):
        """CPU-seconds so far: (the controller's, the nodes')."""
        def read(group):
            return int((group / "cpuacct.usage").read_text()) / 1e9
        return read(self.controller), sum(read(g) for g in self.nodes)

    def join(self):
        """For a child: join the controller's group before it execs."""
        (self.controller / "cgroup.procs").write_text(str(os.getpid()))

    def __exit__(self, *exc):
        labmod.release_groups(LAB_TAG)  # (also what the lab's down removes after a crash)


def measured(groups, start):
    """Run start() (returns (rc, the process whose tree is the controller's or None)) while
    sampling; {wall_s, controller_s, nodes_s, kinds}."""
    before = groups.usage()
    began = time.monotonic()
    sampler = Sampler([groups.controller, *groups.nodes], None)
    sampler.start()
    try:
        rc = start(sampler)
    finally:
        sampler.done.set()
        sampler.join()
    wall = time.monotonic() - began
    after = groups.usage()
    kinds = sampler.by_kind()
    for line in sampler.unknown:
        print("other: python:", line, file=sys.stderr)
    total = (after[0] - before[0]) + (after[1] - before[1])
    kinds["unseen (shorter than a sample)"] = max(0.0, total - sum(kinds.values()))
    return rc, {"wall_s": wall, "controller_s": after[0] - before[0],
                "nodes_s": after[1] - before[1], "kinds": kinds}


def _playbook(groups, name, inventory, extra, timings, cwd=ROOT):
    def start(sampler):
        proc = subprocess.Popen(
            [*ansible_cli.command("ansible-playbook"), "-i", str(inventory), name, *extra],
            cwd=cwd, env=env(**TIMER_ENV, BENCH_TIMINGS=str(timings)),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=groups.join)
        sampler.root_pid = proc.pid
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-3000:]
        return proc.returncode
    return measured(groups, start)[1]


def _raw(groups, the_lab, port, tmp):
    def start(_sampler):
        _wall, rcs = raw_launch(the_lab, port, WORKLOADS / "collective.py", SARGS, tmp,
                                preexec_fn=groups.join)
        assert rcs == [0] * len(the_lab.nodes), rcs
        return 0
    return measured(groups, start)[1]


def _summary(runs, timings):
    kinds = sorted({k for r in runs for k in r["kinds"]})
    out = {"wall_s": stats([r["wall_s"] for r in runs]),
           "controller_cpu_s": stats([r["controller_s"] for r in runs]),
           "nodes_cpu_s": stats([r["nodes_s"] for r in runs]),
           "cpu_s_by_process": {k: stats([r["kinds"].get(k, 0.0) for r in runs]) for k in kinds}}
    if timings is not None:
        tasks = {}
        for line in timings.read_text().splitlines():
            t = json.loads(line)
            if "task" in t:
                tasks.setdefault(t["task"], []).append(t["seconds"])
        per_run = len(runs)
        out["tasks_s"] = sorted(([name, round(sum(s) / per_run, 3)] for name, s in tasks.items()),
                                key=lambda kv: -kv[1])
        out["tasks_per_run"] = round(sum(len(s) for s in tasks.values()) / per_run, 1)
    return out


def run(args, tmp):
    rev = getattr(args, "before", None) or os.environ.get("TORCHFLEET_BENCH_BEFORE")
    if rev:
        made = trees(rev, tmp)
        roots = {" (before %s)" % rev: made["before"], "": made["after"]}
    else:
        roots = {"": ROOT}
    the_lab = labmod.Lab.up(2, LAB_DIR, LAB_TAG)
    try:
        books = [book + tag for tag in roots for book in ("collective.yml", "train.yml")]
        sides = {name: [] for name in [*books, "raw ssh + torchrun"]}
        timings = {k: tmp / ("%d.jsonl" % n) for n, k in enumerate(books)}
        with Groups(the_lab) as groups:
            for i in range(args.runs):
                for tag, root in roots.items():
                    name = "collective.yml" + tag
                    sides[name].append(_playbook(
                        groups, "collective.yml", the_lab.inventory,
                        ["-e", "run_dir=%s/c%d%s" % (tmp, i, "b" if tag else ""),
                         "-e", "collective_sizes=64K", "-e", "collective_iters=5"],
                        timings[name], root))
                for tag, root in roots.items():
                    name = "train.yml" + tag
                    sides[name].append(_playbook(
                        groups, "train.yml", the_lab.inventory,
                        ["-e", "nnodes=2", "-e", "run_dir=%s/t%d%s" % (tmp, i, "b" if tag else ""),
                         "-e", "script=%s" % (WORKLOADS / "collective.py"),
                         "-e", json.dumps({"script_args": SARGS})], timings[name], root))
                sides["raw ssh + torchrun"].append(_raw(groups, the_lab, 29520 + i, tmp))
        return {name: _summary(runs, timings.get(name)) for name, runs in sides.items()}
    finally:
        labmod.down(LAB_DIR, LAB_TAG)


def markdown(r):
    """The section docs/benchmarks.md keeps of it."""
    def rng(s):
        return "%.2f [%.2f-%.2f]" % (s["median"], s["min"], s["max"])
    names = list(r)
    lines = ["| on 2 lab hosts | " + " | ".join(names) + " |",
             "| --- |" + " --- |" * len(names),
             "| wall s | " + " | ".join(rng(r[n]["wall_s"]) for n in names) + " |",
             "| controller CPU s | " + " | ".join(rng(r[n]["controller_cpu_s"]) for n in names)
             + " |",
             "| nodes' CPU s | " + " | ".join(rng(r[n]["nodes_cpu_s"]) for n in names) + " |"]
    kinds = sorted({k for n in names for k in r[n]["cpu_s_by_process"]},
                   key=lambda k: -max(r[n]["cpu_s_by_process"].get(k, {"median": 0})["median"]
                                      for n in names))
    for k in kinds:
        lines.append("| %s | " % k + " | ".join(
            "%.2f" % r[n]["cpu_s_by_process"][k]["median"] if k in r[n]["cpu_s_by_process"]
            else "" for n in names) + " |")
    for n in names:
        if "tasks_s" in r[n]:
            lines += ["", "%s: %s tasks a run; the longest (s, mean of the runs): %s" % (
                n, r[n]["tasks_per_run"],
                "; ".join("%s %.2f" % (t, s) for t, s in r[n]["tasks_s"][:12]))]
    return "\n".join(lines)


if __name__ == "__main__":  # python -m bench.launch_profile [runs [REV]]: prints the section
    with tempfile.TemporaryDirectory() as d:
        res = run(type("A", (), {"runs": int(sys.argv[1]) if len(sys.argv) > 1 else 3,
                                 "before": sys.argv[2] if len(sys.argv) > 2 else None})(),
                  Path(d))
    print(json.dumps(res, indent=1))
    print(markdown(res))
