"""torchfleet's benchmarks: what it costs and how it scales, against baselines in the same run.

    python -m bench                      # everything (root: lab benchmarks), 5 runs each
    python -m bench --runs 3 --only preflight_cost scale

Every figure is a ratio (or difference) to a baseline measured in the same process, median of
the runs with min and max. Results go to bench/results/results.{json,md}. This is not a test:
it never fails on a timing; a missed target is reported as such.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RESULTS = ROOT / "bench" / "results"
LAB_TAG = 3
LAB_DIR = Path(tempfile.gettempdir()) / "torchfleet-lab-bench"
RAW_BOUND_S = 120

from lab import netns as labmod  # noqa: E402  (python -m bench, from the repository root)
from torchfleet.paths import collection_root  # noqa: E402

WORKLOADS = collection_root() / "roles" / "launch" / "files" / "workloads"


def env(**extra):
    e = dict(os.environ, PATH="%s:%s" % (BIN, os.environ.get("PATH", "")), ANSIBLE_NOCOLOR="1")
    e.update(extra)
    return e


def timed(argv, timeout_s=600, **extra):
    """(wall seconds, controller CPU seconds of the children, rc, output)."""
    before = os.times()
    start = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=ROOT, env=env(**extra), capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out = None, str(exc.stdout or "")
    wall = time.monotonic() - start
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system
                                                          - before.children_system)
    return wall, cpu, rc, out


def stats(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": len(values)}


# Per-task wall times (bench/callback_plugins/bench_timer.py) into $BENCH_TIMINGS.
TIMER_ENV = {"ANSIBLE_CALLBACKS_ENABLED": "bench_timer",
             "ANSIBLE_CALLBACK_PLUGINS": str(ROOT / "bench" / "callback_plugins")}


def playbook(name, inventory, *extra, **envs):
    return timed([str(BIN / "ansible-playbook"), "-i", str(inventory), name, *extra], **envs)


def ping(inventory):
    return timed([str(BIN / "ansible"), "-i", str(inventory), "nodes", "-m", "ping"])


def lab(nodes):
    return labmod.Lab.up(nodes, LAB_DIR, LAB_TAG)


def preflight_vs_ping(inventory, runs, nhosts, tmp):
    pre, pings, cpu = [], [], []
    timings = tmp / "timings.jsonl"
    for i in range(runs):
        wall, c, rc, out = ping(inventory)
        assert rc == 0, out[-2000:]
        pings.append(wall)
        timings.unlink(missing_ok=True)
        wall, c, rc, out = playbook("preflight.yml", inventory, "-e", "run_dir=%s/pf%d" % (tmp, i),
                                    BENCH_TIMINGS=str(timings), **TIMER_ENV)
        assert rc == 0, out[-3000:]
        pre.append(wall)
        cpu.append(c / nhosts)
    tasks = [json.loads(line) for line in timings.read_text().splitlines()]
    slowest = sorted(tasks, key=lambda t: -t["seconds"])[:5]
    return {"hosts": nhosts, "preflight_s": stats(pre), "ping_s": stats(pings),
            "ratio": statistics.median(pre) / statistics.median(pings),
            "ratio_min": min(pre) / max(pings), "ratio_max": max(pre) / min(pings),
            "controller_cpu_s_per_host": stats(cpu),
            "slowest_tasks": [{"task": t["task"], "seconds": round(t["seconds"], 3)}
                              for t in slowest]}


def bench_preflight_cost(args, tmp):
    out = {"local": preflight_vs_ping(ROOT / "inventory" / "local.yml", args.runs, 2, tmp)}
    if os.geteuid() == 0:
        for n in args.lab_sizes:
            the_lab = lab(n)
            try:
                out["lab%d" % n] = preflight_vs_ping(the_lab.inventory, args.runs, n, tmp)
            finally:
                labmod.down(LAB_DIR, LAB_TAG)
    return out


def raw_launch_argv(the_lab, node, port, run_id, script, script_args, out_dir):
    """The guides' way: ssh to every node and start the same torchrun by hand."""
    master = the_lab.nodes[0].address
    remote = " ".join(shlex.quote(a) for a in [
        "env", "GLOO_SOCKET_IFNAME=eth0", "NCCL_SOCKET_IFNAME=eth0", "TORCHFLEET_OUT_DIR=" + out_dir,
        "TORCHFLEET_BACKEND=gloo", "TORCHFLEET_HOST=" + node.name,
        sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(the_lab.nodes)),
        "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
        "%s:%d" % (master, port), "--rdzv-id", run_id, "--local-addr", node.address,
        str(script), *script_args])
    keys = the_lab.root / "keys"
    return ["ssh", "-i", str(keys / "id_lab"), "-o", "UserKnownHostsFile=%s"
            % (the_lab.root / "known_hosts"), "-o", "IdentitiesOnly=yes",
            "root@" + node.address, remote]


def raw_launch(the_lab, port, script, script_args, tmp, timeout_s=RAW_BOUND_S):
    """Start torchrun on every node over plain ssh at once; (wall s, rcs, None if it ran out)."""
    run_id = "raw%d" % time.time_ns()
    start = time.monotonic()
    procs = [subprocess.Popen(raw_launch_argv(the_lab, node, port, run_id, script, script_args,
                                              str(tmp / "raw")),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True) for node in the_lab.nodes]
    rcs = []
    try:
        for proc in procs:
            left = timeout_s - (time.monotonic() - start)
            rcs.append(proc.wait(timeout=max(left, 0.1)))
    except subprocess.TimeoutExpired:
        rcs = None
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        for node in the_lab.nodes:  # whatever the raw launch left inside the nodes
            labmod.kill_namespace_processes(node.ns, keep=the_lab.sshd_pid(node))
        # Without a tty nothing signals the remote torchrun when its ssh dies, and while its
        # sshd session lingers it still descends from the kept sshd: end it by its script.
        kill_in_lab(the_lab, str(script))
    return time.monotonic() - start, rcs


def kill_in_lab(the_lab, marker, wait_s=10.0):
    """SIGKILL every process inside the lab's nodes whose command line holds marker, until
    none is left."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any([
            labmod.kill_namespace_processes(node.ns, matching=marker) for node in the_lab.nodes]):
        time.sleep(0.1)


def launch_overhead_at(n, args, tmp):
    the_lab = lab(n)
    timings = tmp / "launch-timings.jsonl"
    try:
        script = WORKLOADS / "collective.py"
        sargs = ["--sizes", "64K", "--iters", "5"]
        fleet, raw = [], []
        for i in range(args.runs):
            timings.unlink(missing_ok=True)
            wall, _, rc, out = playbook("collective.yml", the_lab.inventory, "-e",
                                        "run_dir=%s/lo%d-%d" % (tmp, n, i),
                                        "-e", "collective_sizes=64K",
                                        "-e", "collective_iters=5", **TIMER_ENV,
                                        BENCH_TIMINGS=str(timings))
            assert rc == 0, out[-3000:]
            fleet.append(wall)
            wall, rcs = raw_launch(the_lab, 29510 + i, script, sargs, tmp)
            assert rcs == [0] * n, rcs
            raw.append(wall)
        tasks = [json.loads(line) for line in timings.read_text().splitlines()]
        return {"hosts": n, "collective_yml_s": stats(fleet), "raw_ssh_torchrun_s": stats(raw),
                "overhead_s": statistics.median(fleet) - statistics.median(raw),
                "ratio": statistics.median(fleet) / statistics.median(raw),
                "tasks_last_run": [{"task": t["task"], "seconds": round(t["seconds"], 3)}
                                   for t in tasks if t["seconds"] >= 0.3]}
    finally:
        labmod.down(LAB_DIR, LAB_TAG)


def bench_launch_overhead(args, tmp):
    out = {"sizes": {}}
    for n in args.launch_sizes:
        out["sizes"]["lab%d" % n] = launch_overhead_at(n, args, tmp)
    # The 2-host figures stay where earlier results had them (before/after comparisons).
    first = out["sizes"].get("lab2") or next(iter(out["sizes"].values()))
    out.update({k: first[k] for k in ("collective_yml_s", "raw_ssh_torchrun_s", "overhead_s",
                                      "tasks_last_run")})
    return out


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


def pids_running(marker):
    """PIDs of live processes with marker as one of their arguments: torchrun and its workers,
    not ansible-playbook's `-e script=...` (the lab's nodes share this machine's PID space:
    only the network is namespaced)."""
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                line = f.read()
            with open("/proc/%s/stat" % pid) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in line.split(b"\0") and state not in ("Z", "X"):
            found.append(int(pid))
    return found


class GoneWatcher(threading.Thread):
    """Records when the last process holding marker is gone, once the stamp exists."""

    def __init__(self, marker, stamp):
        super().__init__(daemon=True)
        self.marker, self.stamp, self.gone_at, self.done = marker, stamp, None, threading.Event()

    def run(self):
        while not self.done.is_set():
            if self.stamp.exists():
                if not pids_running(self.marker):
                    self.gone_at = time.time()
                    return
            time.sleep(0.02)


def fail_fast_at(n, args, tmp, raw_runs):
    the_lab = lab(n)
    script = tmp / ("fail_after_4s_%d.py" % n)
    script.write_text(FAIL_SCRIPT)
    try:
        gone, exits, raw = [], [], []
        for i in range(args.runs):
            stamp = tmp / ("failed-at-%d-%d" % (n, i))
            watcher = GoneWatcher(str(script), stamp)
            watcher.start()
            wall, _, rc, out = playbook("train.yml", the_lab.inventory, "-e",
                                        "nnodes=%d" % n, "-e",
                                        "run_dir=%s/ff%d-%d" % (tmp, n, i), "-e",
                                        "script=%s" % script,
                                        "-e", json.dumps({"script_args": [str(stamp)]}))
            ended = time.time()
            watcher.done.set()
            watcher.join()
            assert rc != 0 and stamp.exists(), out[-3000:]
            assert not pids_running(str(script)), (tmp / ("ff%d-%d" % (n, i)) / "train.json")
            failed = float(stamp.read_text())
            gone.append(watcher.gone_at - failed)
            exits.append(ended - failed)
            stamp.unlink()
        for i in range(raw_runs):
            stamp = tmp / ("raw-failed-at-%d-%d" % (n, i))
            wall, rcs = raw_launch(the_lab, 29520 + i, script, [str(stamp)], tmp,
                                   timeout_s=RAW_BOUND_S)
            raw.append((time.time() - float(stamp.read_text())) if rcs is not None and
                       stamp.exists() else float("inf"))
        out = {"hosts": n, "failure_to_every_rank_gone_s": stats(gone),
               "failure_to_play_exit_s": stats(exits)}
        if raw:
            out["raw_torchrun_failure_to_all_exited_s"] = stats(raw)
        return out
    finally:
        labmod.down(LAB_DIR, LAB_TAG)


def bench_fail_fast(args, tmp):
    out = {"sizes": {}}
    for n in args.fail_fast_sizes:
        # Plain torchrun's figure is a bound (> RAW_BOUND_S): measured once, at the first size.
        out["sizes"]["lab%d" % n] = fail_fast_at(n, args, tmp, 1 if not out["sizes"] else 0)
    first = next(iter(out["sizes"].values()))
    out.update({"failure_to_play_exit_s": first["failure_to_play_exit_s"],
                "raw_torchrun_failure_to_all_exited_s":
                    first.get("raw_torchrun_failure_to_all_exited_s"),
                "raw_note": "inf means plain torchrun was still running %d s after the failure"
                            % RAW_BOUND_S})
    return out


# Prints a line a second for argv[1] seconds: a run the controller only watches.
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


def bench_watch_cpu(args, tmp):
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
                    [str(BIN / "ansible-playbook"), "-i", str(the_lab.inventory), "train.yml",
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
            labmod.down(LAB_DIR, LAB_TAG)
    return out


def bench_diagnosis(args, tmp):
    the_lab = lab(2)
    try:
        the_lab.block_port("node0", 29500)
        times = []
        for i in range(args.runs):
            wall, _, rc, out = playbook("preflight.yml", the_lab.inventory, "-e",
                                        "run_dir=%s/dg%d" % (tmp, i))
            assert rc != 0 and "port.blocked" in out, out[-3000:]
            times.append(wall)
        script = WORKLOADS / "collective.py"
        wall, rcs = raw_launch(the_lab, 29500, script, ["--sizes", "1K", "--iters", "1"], tmp)
        return {"preflight_names_port_blocked_s": stats(times),
                "raw_torchrun": ("> %d s (still hanging, stopped by the benchmark)" % RAW_BOUND_S
                                 if rcs is None else "ended after %.1f s with %s" % (wall, rcs))}
    finally:
        labmod.down(LAB_DIR, LAB_TAG)


def bench_harness_overhead(args, tmp):
    """The collective test's all_reduce busbw / a raw loop's, measured in the same torchrun
    processes (bench/harness_vs_raw.py: alternating rounds) on 2 lab nodes under train.yml."""
    the_lab = lab(2)
    try:
        # Beside the workloads it measures, as the launch role ships them to a run's hosts.
        shipped = tmp / "harness"
        shutil.copytree(WORKLOADS, shipped, dirs_exist_ok=True)
        script = Path(shutil.copy(ROOT / "bench" / "harness_vs_raw.py", shipped))
        ratios, per_run = {}, {}
        for i in range(args.runs):
            out = tmp / ("ho-%d.json" % i)
            wall, _, rc, text = playbook(
                "train.yml", the_lab.inventory, "-e", "run_dir=%s/ho%d" % (tmp, i), "-e",
                "script=%s" % script, "-e", json.dumps({"script_args": [
                    "--sizes", "1M,16M", "--iters", str(args.busbw_iters), "--out", str(out)]}))
            assert rc == 0, text[-3000:]
            for size, values in json.loads(out.read_text()).items():
                ratios.setdefault(size, []).extend(values)
                per_run.setdefault(size, []).append(statistics.median(values))
        return {"iters": args.busbw_iters, "method": "same processes, alternating rounds",
                "busbw_ratio_collective_over_raw": {size: stats(v) for size, v in ratios.items()},
                "per_run_median": {size: stats(v) for size, v in per_run.items()}}
    finally:
        labmod.down(LAB_DIR, LAB_TAG)


def isolate_run(the_lab, n, tmp, name):
    """(wall seconds, the isolate verdict, the failed node/link checks) of one collective.yml
    with the pair rounds on n lab hosts."""
    wall, _, rc, out = playbook("collective.yml", the_lab.inventory, "-e",
                                "run_dir=%s/%s" % (tmp, name), "-e", "nnodes=%d" % n, "-e",
                                "collective_isolate=true", "-e", "collective_sizes=64K", "-e",
                                "collective_iters=3")
    report = json.loads((tmp / name / "collective.json").read_text())
    named = sorted((c["id"], c["host"]) for c in report["checks"]
                   if c["id"] in ("node.slow", "link.slow") and not c["ok"])
    return wall, report["isolate"], named, rc


def bench_isolate(args, tmp):
    """Time to name a rate-limited NIC on n lab hosts, and false positives on the clean lab."""
    n = args.isolate_size
    the_lab = lab(n)
    try:
        clean, clean_named, walls, pair_s, named_ok = [], 0, [], [], 0
        for i in range(args.runs):
            wall, iso, named, rc = isolate_run(the_lab, n, tmp, "iso-clean%d" % i)
            clean.append(wall)
            clean_named += len(named)
        slow = "node%d" % (n // 2 + 1)
        the_lab.slow_nic(slow)
        for i in range(args.runs):
            wall, iso, named, rc = isolate_run(the_lab, n, tmp, "iso-slow%d" % i)
            walls.append(wall)
            pair_s.append(iso["time_s"])
            named_ok += named == [("node.slow", slow)]
        rounds = iso["rounds"]
        return {"hosts": n, "schedule": iso["schedule"], "rounds": rounds,
                "rate": labmod.SLOW_RATE, "pair_size_bytes": iso["size_bytes"],
                "clean_collective_yml_s": stats(clean), "false_positives": clean_named,
                "clean_runs": args.runs, "slow_collective_yml_s": stats(walls),
                "pair_rounds_s": stats(pair_s), "named_only_the_slow_host": named_ok,
                "slow_runs": args.runs}
    finally:
        labmod.down(LAB_DIR, LAB_TAG)


def bench_fuzz(args, tmp):
    """The control channel's fuzz campaign (bench/fuzz_control.py): inputs on each end, crashes."""
    from bench.fuzz_control import campaign

    return campaign(lines=args.fuzz_lines, connections=max(300, args.fuzz_lines // 100))


def free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def bench_flood(args, tmp):
    """train.yml on n lab hosts with its control port flooded (garbage lines and idle
    connections from this machine, bench/fuzz_control.Flood) against the same run unflooded,
    alternating; the flooder's own CPU is on the same 2 CPUs, so it is rate-limited."""
    from bench.fuzz_control import Flood

    n = args.flood_size
    the_lab = lab(n)
    try:
        clean, flooded, sent, refused = [], [], [], []
        for i in range(args.runs):
            for flood_on in (False, True):
                port = free_port()
                flood = Flood(the_lab.node("node0").address, port, rate_hz=args.flood_rate)
                if flood_on:
                    flood.start()
                run_dir = tmp / ("flood%d-%d-%d" % (n, i, flood_on))
                wall, _, rc, out = playbook(
                    "train.yml", the_lab.inventory, "-e", "nnodes=%d" % n, "-e",
                    "train_steps=%d" % args.flood_steps, "-e", "control_port=%d" % port,
                    "-e", "run_dir=%s" % run_dir)
                flood.done.set()
                if flood_on:
                    flood.join(30)
                    sent.append(flood.sent)
                    state = json.loads((run_dir / "run_state.json").read_text())
                    refused.append(sum(state["channel"]["refused"].values()))
                assert rc == 0, out[-3000:]
                (flooded if flood_on else clean).append(wall)
        return {"hosts": n, "train_steps": args.flood_steps, "rate_hz": args.flood_rate,
                "clean_s": stats(clean), "flooded_s": stats(flooded),
                "ratio": statistics.median(flooded) / statistics.median(clean),
                "ratio_min": min(flooded) / max(clean), "ratio_max": max(flooded) / min(clean),
                "garbage_sent": stats(sent), "refused": stats(refused)}
    finally:
        labmod.down(LAB_DIR, LAB_TAG)


def bench_start_skew(args, tmp):
    """train.yml on n lab hosts with few forks: the agents start over many fork batches, the
    start longer than the master's lease (args.skew_lease_s, looked at every second). Whether
    the run ends ok (no false abort), and how far apart the first and the last agent
    started."""
    n = args.skew_size
    the_lab = lab(n)
    try:
        out = {"hosts": n, "lease_s": args.skew_lease_s, "forks": {}}
        for forks in args.skew_forks:
            run_dir = tmp / ("skew%d-%d" % (n, forks))
            wall, _, rc, text = playbook("train.yml", the_lab.inventory, "-e", "nnodes=%d" % n,
                                         "-e", "train_steps=20", "-f", str(forks),
                                         "-e", "launch_lease_s=%g" % args.skew_lease_s,
                                         "-e", "launch_poll_s=1", "-e", "run_dir=%s" % run_dir)
            state = json.loads((run_dir / "run_state.json").read_text())
            runs = Path.home() / ".torchfleet" / "runs" / state["run_id"]
            started = [json.loads((runs / ("node%d" % i) / "torchrun.pid").read_text())["started"]
                       for i in range(n)]
            out["forks"][str(forks)] = {"ok": rc == 0, "phase": state["phase"],
                                        "start_spread_s": round(max(started) - min(started), 2),
                                        "wall_s": round(wall, 2)}
        return out
    finally:
        labmod.down(LAB_DIR, LAB_TAG)


def table_lines(out):
    """Lines of the debug messages (the plays' own tables), which both callbacks print alike."""
    count, inside = 0, False
    for line in out.splitlines():
        if line.lstrip().startswith("msg: |"):
            inside, indent = True, len(line) - len(line.lstrip())
            count += 1
            continue
        if inside and (not line.strip() or len(line) - len(line.lstrip()) > indent):
            count += 1
            continue
        inside = False
    return count


def bench_output_lines(args, tmp):
    """Lines preflight.yml prints with Ansible's default stdout callback and with torchfleet's,
    on a lab with one node unreachable (a failure to show in full); besides the plays' tables,
    which both print alike."""
    out = {}
    for n in args.output_sizes:
        the_lab = lab(n)
        try:
            the_lab.unreachable(the_lab.nodes[-1].name)
            row = {"hosts": n}
            for callback in ("default", "torchfleet"):
                _, _, rc, text = playbook("preflight.yml", the_lab.inventory, "-e",
                                          "run_dir=%s/out-%s-%d" % (tmp, callback, n),
                                          ANSIBLE_STDOUT_CALLBACK=callback)
                assert rc != 0 and "UNREACHABLE" in text, text[-3000:]
                lines = len(text.splitlines())
                row[callback] = {"lines": lines, "besides_tables": lines - table_lines(text)}
            out["lab%d" % n] = row
        finally:
            labmod.down(LAB_DIR, LAB_TAG)
    return out


def bench_report_scale(args, tmp):
    """The HTML report of a record built from a real 2-host collective run's shape, repeated
    for 16 / 128 / 512 hosts (lab/scaled_record.py builds it): render time and
    size, each size against the 16-host page rendered in the same process."""
    import torchfleet
    from torchfleet import html_report

    from lab.scaled_record import scaled

    real = torchfleet.collective(runs_root=tmp / "report-runs", master_port=free_port())
    out = {}
    for n in args.report_sizes:
        run_dir = scaled(real.run_dir, tmp / ("report%d" % n), n)
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            page = html_report.write(run_dir)
            times.append(time.perf_counter() - start)
        out["hosts%d" % n] = {"hosts": n, "render_s": stats(times),
                              "bytes": page.stat().st_size}
    return out


def bench_spares_cost(args, tmp):
    """preflight.yml with nnodes=8 spares=2 (10 hosts checked) against nnodes=8 alone, side by
    side on one 10-host lab; and with the first host unreachable, where the chosen hosts' ports
    are tested again against the new master."""
    the_lab = lab(10)
    times = {"nnodes8": [], "spares2": [], "spares2_master_down": []}
    try:
        for i in range(args.runs):
            for name, extra in (("nnodes8", []), ("spares2", ["-e", "spares=2"])):
                wall, _, rc, out = playbook("preflight.yml", the_lab.inventory, "-e", "nnodes=8",
                                            *extra, "-e", "run_dir=%s/sp-%s-%d" % (tmp, name, i))
                assert rc == 0, out[-3000:]
                times[name].append(wall)
        the_lab.unreachable("node0")
        for i in range(args.runs):
            wall, _, rc, out = playbook("preflight.yml", the_lab.inventory, "-e", "nnodes=8",
                                        "-e", "spares=2", "-e", "run_dir=%s/sp-down-%d" % (tmp, i))
            assert rc == 0 and "not used: node0 (host.unreachable)" in out, out[-3000:]
            times["spares2_master_down"].append(wall)
    finally:
        labmod.down(LAB_DIR, LAB_TAG)
    base = statistics.median(times["nnodes8"])
    return {name: {"preflight_s": stats(v), "ratio": statistics.median(v) / base,
                   "ratio_min": min(v) / max(times["nnodes8"]),
                   "ratio_max": max(v) / min(times["nnodes8"])} for name, v in times.items()}


def all_ranks_resumed(remote, hosts, attempt_dir):
    """True once every host's rank wrote its 'resuming from the checkpoint' line (after the
    process group formed): every rank of the attempt runs."""
    found = set()
    for host in hosts:
        for log in remote.glob("*/%s/%slogs/*/attempt_0/0/stdout.log" % (host, attempt_dir)):
            if "resuming" in log.read_text(errors="replace"):
                found.add(host)
    return found == set(hosts)


def bench_restart_cost(args, tmp):
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
                [str(BIN / "ansible-playbook"), "-i", str(the_lab.inventory), "train.yml",
                 "-e", "nnodes=6", "-e", "spares=2", "-e", "max_restarts=1",
                 "-e", "lost_after_s=5", "-e", "train_steps=400",
                 "-e", "train_checkpoint_dir=%s" % ckpt, "-e", "remote_runs_root=%s" % remote,
                 "-e", "run_dir=%s/rs-%d" % (tmp, i)],
                cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
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
            # By hand: the same checkpoint, an inventory without node2, a fresh train.yml.
            hand_ckpt, hand_remote = tmp / ("hand-ckpt%d" % i), tmp / ("hand-remote%d" % i)
            hand_ckpt.mkdir()
            shutil.copy(ckpt / "ddp_train.pt", hand_ckpt / "ddp_train.pt")
            start = time.monotonic()
            proc = subprocess.Popen(
                [str(BIN / "ansible-playbook"), "-i", str(hand_inventory), "train.yml",
                 "-e", "nnodes=6", "-e", "train_steps=400",
                 "-e", "train_checkpoint_dir=%s" % hand_ckpt,
                 "-e", "remote_runs_root=%s" % hand_remote, "-e", "run_dir=%s/fr-%d" % (tmp, i)],
                cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True)
            running = wait(lambda: all_ranks_resumed(hand_remote, hosts, ""),  # noqa: B023
                           proc, "the fresh run never ran")
            out, _ = proc.communicate(timeout=300)
            assert proc.returncode == 0, out[-3000:]
            times["fresh"].append(running - start)
    finally:
        labmod.down(LAB_DIR, LAB_TAG)
    r, f = times["restart"], times["fresh"]
    return {"hosts": 8, "restart_s": stats(r), "fresh_s": stats(f),
            "ratio": statistics.median(r) / statistics.median(f),
            "ratio_min": min(r) / max(f), "ratio_max": max(r) / min(f)}


BENCHES = {
    "preflight_cost": bench_preflight_cost,
    "launch_overhead": bench_launch_overhead,
    "fail_fast": bench_fail_fast,
    "watch_cpu": bench_watch_cpu,
    "diagnosis": bench_diagnosis,
    "harness_overhead": bench_harness_overhead,
    "isolate": bench_isolate,
    "fuzz": bench_fuzz,
    "flood": bench_flood,
    "start_skew": bench_start_skew,
    "output_lines": bench_output_lines,
    "report_scale": bench_report_scale,
    "spares_cost": bench_spares_cost,
    "restart_cost": bench_restart_cost,
}
NEEDS_ROOT = {"launch_overhead", "fail_fast", "watch_cpu", "diagnosis", "harness_overhead",
              "isolate", "flood", "start_skew", "output_lines", "spares_cost",
              "restart_cost"}


def machine():
    def read(cmd):
        return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()

    import torch

    return {"cpus": os.cpu_count(), "memory": read(["free", "-h"]).splitlines()[1].split()[1],
            "kernel": platform.release(), "python": platform.python_version(),
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def markdown(results):
    m = results["machine"]
    lines = ["# torchfleet benchmark results", "",
             "Machine: %(cpus)s CPUs, %(memory)s memory, kernel %(kernel)s, Python %(python)s, "
             "torch %(torch)s; %(date)s. Median of the runs [min-max]." % m, "",
             "| measure | torchfleet | baseline | ratio / difference | target |",
             "| --- | --- | --- | --- | --- |"]

    def rng(s):
        return "%.2f [%.2f-%.2f]" % (s["median"], s["min"], s["max"])

    pc = results.get("preflight_cost", {})
    for name, r in pc.items():
        lines.append("| preflight.yml vs `ansible nodes -m ping`, %s (%d hosts) | %s s | %s s | "
                     "%.2fx [%.2f-%.2f] | <= 1.5x |" % (name, r["hosts"], rng(r["preflight_s"]),
                                                      rng(r["ping_s"]), r["ratio"],
                                                      r["ratio_min"], r["ratio_max"]))
    if "lab16" in pc and "lab2" in pc:
        lines.append("| preflight scale: 16 hosts / 2 hosts | %.2f s | %.2f s | %.2fx | <= 3.0x |"
                     % (pc["lab16"]["preflight_s"]["median"], pc["lab2"]["preflight_s"]["median"],
                        pc["lab16"]["preflight_s"]["median"] / pc["lab2"]["preflight_s"]["median"]))
    for name, r in pc.items():
        lines.append("| controller CPU per host, %s | %s s | | | |"
                     % (name, rng(r["controller_cpu_s_per_host"])))
    lo = results.get("launch_overhead")
    if lo:
        for r in (lo.get("sizes") or {"lab2": dict(lo, hosts=2)}).values():
            lines.append("| collective.yml vs raw ssh+torchrun, %d lab nodes | %s s | %s s | "
                         "+%.2f s%s | %s |" % (
                             r["hosts"], rng(r["collective_yml_s"]), rng(r["raw_ssh_torchrun_s"]),
                             r["overhead_s"], " (%.2fx)" % r["ratio"] if "ratio" in r else "",
                             "<= 3 s" if r["hosts"] <= 2 else "<= 1.25x"))
    fl = results.get("flood")
    if fl:
        lines.append("| train.yml on %d lab hosts, control port flooded (%d garbage "
                     "connections/s + 300 idle) vs not | %s s | %s s | %.2fx [%.2f-%.2f] | "
                     "<= 1.1x |" % (fl["hosts"], fl["rate_hz"], rng(fl["flooded_s"]),
                                    rng(fl["clean_s"]), fl["ratio"], fl["ratio_min"],
                                    fl["ratio_max"]))
    sk = results.get("start_skew")
    for forks, r in ((sk or {}).get("forks") or {}).items():
        lines.append("| train.yml on %d lab hosts with forks %s: start spread (first to last "
                     "agent) | %.1f s | lease %g s | %s | no false abort |" % (
                         sk["hosts"], forks, r["start_spread_s"], sk.get("lease_s", 30),
                         "ok" if r["ok"] else "failed: %s" % r["phase"]))
    for r in (results.get("output_lines") or {}).values():
        lines.append("| preflight.yml output lines on %d lab hosts (one unreachable), besides the "
                     "plays' tables: torchfleet's stdout callback vs Ansible's default | %d | %d "
                     "| %.2fx | <= 100 at 128 hosts |" % (
                         r["hosts"], r["torchfleet"]["besides_tables"],
                         r["default"]["besides_tables"],
                         r["torchfleet"]["besides_tables"] / r["default"]["besides_tables"]))
    rs = results.get("report_scale") or {}
    base = rs.get("hosts16")
    for r in rs.values():
        lines.append("| HTML report of a %d-host record: render time, size | %s s, %.2f MB | "
                     "16 hosts: %s s | %.2fx | < 2 s, < 2 MB at 512 |" % (
                         r["hosts"], rng(r["render_s"]), r["bytes"] / 1e6,
                         rng(base["render_s"]) if base else "-",
                         r["render_s"]["median"] / base["render_s"]["median"] if base else 0))
    sp = results.get("spares_cost") or {}
    for name, text in (("spares2", "healthy"), ("spares2_master_down", "first host unreachable: "
                                                "ports tested again against the second")):
        if name in sp:
            r = sp[name]
            lines.append("| preflight.yml nnodes=8 spares=2 (10 lab hosts checked), %s, vs "
                         "nnodes=8 | %s s | %s s | %.2fx [%.2f-%.2f] | ~1.25x (10 / 8 hosts) |"
                         % (text, rng(r["preflight_s"]), rng(sp["nnodes8"]["preflight_s"]),
                            r["ratio"], r["ratio_min"], r["ratio_max"]))
    rc = results.get("restart_cost")
    if rc:
        lines.append("| a worker's network cut to every rank of the restarted attempt running "
                     "(nnodes=6 spares=2 max_restarts=1, %d lab hosts, lost_after_s=5) vs a fresh "
                     "train.yml of the same 6 hosts by hand to every rank running | %s s | %s s | "
                     "%.2fx [%.2f-%.2f] | <= 1.2x |" % (
                         rc["hosts"], rng(rc["restart_s"]), rng(rc["fresh_s"]), rc["ratio"],
                         rc["ratio_min"], rc["ratio_max"]))
    fz = results.get("fuzz")
    if fz:
        lines.append("| control channel fuzz: inputs fed to the master's end / the agent's end "
                     "(frames, and byte streams over real connections) | %d / %d | | crashes "
                     "%d / %d, outsiders' messages taken %d | 0 |" % (
                         fz["inputs_master"], fz["inputs_agent"], fz["crashes_master"],
                         fz["crashes_agent"], fz["verified_from_outsiders"]))
    ff = results.get("fail_fast")
    for r in ((ff or {}).get("sizes") or {}).values():
        lines.append("| rank 1 exits 1 on %d hosts: every rank on every host gone | %s s | | | "
                     "<= 3 s |" % (r["hosts"], rng(r["failure_to_every_rank_gone_s"])))
        lines.append("| rank 1 exits 1 on %d hosts: play exit | %s s | | | |"
                     % (r["hosts"], rng(r["failure_to_play_exit_s"])))
    wc = results.get("watch_cpu")
    if wc:
        base = wc["sizes"].get("lab2")
        for r in wc["sizes"].values():
            ratio = (r["cpu_s_per_minute"]["median"] / base["cpu_s_per_minute"]["median"]
                     if base and base["cpu_s_per_minute"]["median"] > 0 else float("nan"))
            lines.append("| controller CPU-s per minute of watch, %d hosts | %s | 2 hosts | "
                         "%.2fx | 16 hosts <= 1.2x |" % (r["hosts"], rng(r["cpu_s_per_minute"]),
                                                         ratio))
    if ff and ff.get("raw_torchrun_failure_to_all_exited_s"):
        raw = ff["raw_torchrun_failure_to_all_exited_s"]
        plain = ("%s s" % rng(raw) if raw["max"] != float("inf") else
                 "> %d s (the other node's rank still running, stopped by the benchmark)"
                 % RAW_BOUND_S if raw["min"] == float("inf") else
                 "%s s, some runs > %d s" % (rng(raw), RAW_BOUND_S))
        lines.append("| rank 1 exits 1, plain torchrun (no torchfleet) | | %s | | |" % plain)
    dg = results.get("diagnosis")
    if dg:
        lines.append("| firewall drops the master port: time to name it | %s s | plain torchrun: "
                     "%s | | <= 10 s |" % (rng(dg["preflight_names_port_blocked_s"]),
                                           dg["raw_torchrun"]))
    ho = results.get("harness_overhead")
    if ho:
        for size, s in ho["busbw_ratio_collective_over_raw"].items():
            lines.append("| all_reduce busbw, collective test / raw loop in the same processes "
                         "(alternating rounds), %s B, %s timed iterations, %d rounds | | | %s | "
                         ">= 0.95 |" % (size, ho.get("iters", 20), s["runs"], rng(s)))
    iso = results.get("isolate")
    if iso:
        lines.append("| rate-limited NIC (%s) on %d lab hosts: collective.yml with the pair rounds "
                     "(%s, %d rounds) until node.slow names it | %s s (rounds %s s) | the same "
                     "run on the clean lab: %s s | named the host alone in %d of %d | <= 60 s |"
                     % (iso["rate"], iso["hosts"], iso["schedule"], iso["rounds"],
                        rng(iso["slow_collective_yml_s"]), rng(iso["pair_rounds_s"]),
                        rng(iso["clean_collective_yml_s"]), iso["named_only_the_slow_host"],
                        iso["slow_runs"]))
        lines.append("| false positives (node.slow / link.slow) on the clean lab, %d hosts | %d "
                     "in %d runs | | | 0 |" % (iso["hosts"], iso["false_positives"],
                                               iso["clean_runs"]))
    carried = results.get("carried") or {}
    if carried:
        lines += ["", "Not re-run this time, carried from the earlier run: %s." % ", ".join(
            "%s (%s)" % (name, when) for name, when in carried.items())]
    before = (results.get("before") or {}).get("preflight_cost")
    if pc and before:
        lines += ["", "Preflight before / after this change (%s / %s):" % (
            before["taken"], carried.get("preflight_cost", m["date"])), ""]
        for name, r in pc.items():
            if name in before:
                lines.append("- %s: %.2fx (%.2f s) -> %.2fx (%.2f s)" % (
                    name, before[name]["ratio"], before[name]["preflight_s"]["median"],
                    r["ratio"], r["preflight_s"]["median"]))
    before_lo = (results.get("before") or {}).get("launch_overhead")
    if lo and before_lo:
        lines += ["", "Launch overhead before / after this change (%s / %s): +%.2f s -> +%.2f s"
                  % (before_lo["taken"], carried.get("launch_overhead", m["date"]),
                     before_lo["overhead_s"], lo["overhead_s"])]
    if lo and lo.get("tasks_last_run"):
        lines += ["", "collective.yml tasks of 0.3 s or more (last run): " + "; ".join(
            "%s %.2f s" % (t["task"], t["seconds"]) for t in lo["tasks_last_run"])]
    if pc:
        lines += ["", "Slowest preflight tasks (last run of each size):", ""]
        for name, r in pc.items():
            lines.append("- %s: %s" % (name, "; ".join("%s %.2f s" % (t["task"], t["seconds"])
                                                        for t in r["slowest_tasks"])))
    return "\n".join(lines) + "\n"


def merge(old, new):
    """Keep the measures not re-run from the previous results (with the date they were taken)
    and record the previous value of each re-run one under "before"."""
    if not old:
        return new
    when = old.get("machine", {}).get("date", "an earlier run")
    merged = dict(new, before=dict(old.get("before", {})), carried={})
    for name in BENCHES:
        if name in new and name in old:  # a carried measure dates from when it was taken
            merged["before"][name] = dict(old[name],
                                          taken=old.get("carried", {}).get(name, when))
        elif name in old:
            merged[name] = old[name]
            merged["carried"][name] = old.get("carried", {}).get(name, when)
    return merged


def write(out, results):
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "results.md").write_text(markdown(results))


def main():
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--only", nargs="*", choices=sorted(BENCHES), default=sorted(BENCHES))
    parser.add_argument("--lab-sizes", type=int, nargs="*", default=[2, 16, 64, 128],
                        help="lab sizes of preflight_cost")
    parser.add_argument("--launch-sizes", type=int, nargs="*", default=[2, 16])
    parser.add_argument("--fail-fast-sizes", type=int, nargs="*", default=[2, 8, 16])
    parser.add_argument("--watch-sizes", type=int, nargs="*", default=[2, 8, 16])
    parser.add_argument("--watch-window-s", type=float, default=30,
                        help="how long watch_cpu samples the controller during the watch")
    parser.add_argument("--isolate-size", type=int, default=8,
                        help="lab hosts of the isolate bench")
    parser.add_argument("--flood-size", type=int, default=16, help="lab hosts of flood")
    parser.add_argument("--flood-rate", type=float, default=200,
                        help="garbage connections a second of flood's flooder")
    parser.add_argument("--flood-steps", type=int, default=100,
                        help="steps of the built-in training run of flood")
    parser.add_argument("--skew-size", type=int, default=16, help="lab hosts of start_skew")
    parser.add_argument("--skew-forks", type=int, nargs="*", default=[16, 1],
                        help="Ansible forks of start_skew (1: a batch per host)")
    parser.add_argument("--skew-lease-s", type=float, default=5,
                        help="the master's lease in start_skew (30 s by default in a run)")
    parser.add_argument("--fuzz-lines", type=int, default=100000,
                        help="frames fed to each end of the control channel by the fuzz bench")
    parser.add_argument("--output-sizes", type=int, nargs="*", default=[2, 16, 128],
                        help="lab sizes of output_lines")
    parser.add_argument("--report-sizes", type=int, nargs="*", default=[16, 128, 512],
                        help="hosts of the records report_scale renders")
    parser.add_argument("--out", type=Path, default=RESULTS)
    # 20 iterations time a 20-400 ms window, shorter than the noise of 2 busy CPUs.
    parser.add_argument("--busbw-iters", type=int, default=100,
                        help="timed iterations per size, both sides of harness_overhead")
    args = parser.parse_args()
    try:
        old = json.loads((args.out / "results.json").read_text())
    except (OSError, ValueError):
        old = None
    results = {"machine": machine()}
    with tempfile.TemporaryDirectory(prefix="torchfleet-bench-") as tmp:
        for name in [b for b in BENCHES if b in args.only]:
            if name in NEEDS_ROOT and os.geteuid() != 0:
                print("skip %s: needs root for the lab" % name)
                continue
            print("running %s ..." % name, flush=True)
            results[name] = BENCHES[name](args, Path(tmp))
            write(args.out, merge(old, results))  # a later measure's crash keeps this one
    print(markdown(merge(old, results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
