"""What every benchmark shares: running ansible-playbook and a lab, timing, the statistics of
the runs, and the results page (bench/results/results.{json,md}). Every figure is a ratio (or
difference) to a baseline measured in the same process, min / median / max over the runs."""
from __future__ import annotations

import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from lab import netns as labmod  # python -m bench runs from the repository root
from torchfleet.paths import collection_root
from torchfleet import ansible_cli
from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RESULTS = ROOT / "bench" / "results"
# TORCHFLEET_BENCH_LAB_TAG=N: a bench beside another bench (or a lab test) with a tag of its own.
LAB_TAG = int(os.environ.get("TORCHFLEET_BENCH_LAB_TAG", "3"))
LAB_DIR = Path(tempfile.gettempdir()) / ("torchfleet-lab-bench" + ("" if LAB_TAG == 3 else f"-t{LAB_TAG}"))
RAW_BOUND_S = 120

WORKLOADS = collection_root() / "roles" / "launch" / "files" / "workloads"


def env(**extra):
    e = dict(os.environ, PATH="%s:%s" % (BIN, os.environ.get("PATH", "")), ANSIBLE_NOCOLOR="1")
    e.update(extra)
    return e


def timed(argv, timeout_s=600, **extra):
    """(wall seconds, controller CPU seconds of the children, rc, output)."""
    before = os.times()
    start = time.monotonic()
    # A session of its own: past the limit its whole tree goes (Ansible's workers with it).
    proc = subprocess.Popen(argv, cwd=ROOT, env=env(**extra), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
        rc, out = proc.returncode, stdout + stderr
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        rc, out = None, "timed out after %.0f s: %s" % (timeout_s, (stdout + stderr)[-3000:])
    except BaseException:  # the bench stopped (Ctrl-C, SIGTERM): its tree goes with it
        os.killpg(proc.pid, signal.SIGKILL)
        raise
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


def playbook(name, inventory, *extra, timeout_s=600, **envs):
    return timed([*ansible_cli.command("ansible-playbook"), "-i", str(inventory), name, *extra],
                 timeout_s=timeout_s, **envs)


def ping(inventory, timeout_s=600):
    return timed([str(BIN / "ansible"), "-i", str(inventory), "nodes", "-m", "ping"],
                 timeout_s=timeout_s)


def lab(nodes, runs_root=None):
    """The bench's lab of `nodes` hosts; runs_root: where its hosts keep their run directories
    (remote_runs_root) when not ~/.torchfleet/runs, which every lab without one shares."""
    return labmod.Lab.up(nodes, LAB_DIR, LAB_TAG, runs_root=runs_root)


def lab_down():
    labmod.down(LAB_DIR, LAB_TAG)


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


def raw_launch(the_lab, port, script, script_args, tmp, timeout_s=RAW_BOUND_S, **popen):
    """Start torchrun on every node over plain ssh at once; (wall s, rcs, None if it ran out).
    popen: more of subprocess.Popen's arguments for the ssh clients."""
    run_id = "raw%d" % time.time_ns()
    start = time.monotonic()
    procs = [subprocess.Popen(raw_launch_argv(the_lab, node, port, run_id, script, script_args,
                                              str(tmp / "raw")),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True, **popen) for node in the_lab.nodes]
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


def wait_until(predicate, timeout_s, interval_s=0.5):
    """The predicate's first true answer within timeout_s, else its last (false) one."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        got = predicate()
        if got:
            return got
        time.sleep(interval_s)
    return predicate()


def kill_in_lab(the_lab, marker, wait_s=10.0):
    """SIGKILL every process inside the lab's nodes whose command line holds marker, until
    none is left."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any([
            labmod.kill_namespace_processes(node.ns, matching=marker) for node in the_lab.nodes]):
        time.sleep(0.1)


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

    def taken(r):  # a size kept from an earlier sitting (merge)
        return "; measured %s" % r["taken"] if r.get("taken") else ""

    pc = results.get("preflight_cost", {})
    for name, r in pc.items():
        lines.append("| preflight.yml vs `ansible nodes -m ping`, %s (%d hosts%s) | %s s | %s s | "
                     "%.2fx [%.2f-%.2f] | <= 1.5x |" % (name, r["hosts"], taken(r),
                                                      rng(r["preflight_s"]),
                                                      rng(r["ping_s"]), r["ratio"],
                                                      r["ratio_min"], r["ratio_max"]))
    for name, r in pc.items():
        if r.get("recheck"):
            rc = r["recheck"]
            lines.append("| a restart's re-check of %d candidates (bench/recheck.yml: restart_plan, "
                         "every candidate probed and its ports tested again, one decision) vs the "
                         "same run's preflight, %s | %s s | %s s | %.2fx | |"
                         % (rc["candidates"], name, rng(rc["recheck_s"]),
                            rng(rc["preflight_in_run_s"]), rc["ratio"]))
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
    cl = results.get("container_launch") or {}
    for r in (cl.get("sizes") or {}).values():
        lines.append("| train.yml (built-in workload, 20 steps) with its ranks in a podman "
                     "container vs on the host, %d lab nodes | %s s | %s s | +%.2f s (%.2fx [%.2f-%.2f]) | |" % (
                         r["hosts"], rng(r["container_s"]), rng(r["host_s"]), r["added_s"],
                         r["ratio"], r["ratio_min"], r["ratio_max"]))
    for key, what in (("podman_start", "`python -c pass` (a container's start)"),
                      ("import_torch", "`python -c 'import torch'` (a rank's start)")):
        if cl.get(key):
            ps = cl[key]
            lines.append("| %s in the lab's image under podman vs on the host | %s s | %s s | "
                         "+%.2f s | |" % (what, rng(ps["podman_s"]), rng(ps["host_s"]),
                                          ps["added_s"]))
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
                                                "the masters reached first, ports tested once")):
        if name in sp:
            r = sp[name]
            lines.append("| preflight.yml nnodes=8 spares=2 (10 lab hosts checked), %s, vs "
                         "nnodes=8 | %s s | %s s | %.2fx [%.2f-%.2f] | ~1.25x (10 / 8 hosts) |"
                         % (text, rng(r["preflight_s"]), rng(sp["nnodes8"]["preflight_s"]),
                            r["ratio"], r["ratio_min"], r["ratio_max"]))
    hc = results.get("health_cost") or {}
    for level, target in (("basic", "<= 1.10x"), ("full", "no clean run names a host")):
        if level in hc:
            r = hc[level]
            lines.append("| preflight.yml health=%s vs health=off, 8 lab hosts (no GPU)%s | %s s | "
                         "%s s | %.2fx [%.2f-%.2f] | %s |" % (
                             level, "; clean runs naming a host: %d" % r[
                                 "clean_runs_naming_a_host"] if level == "full" else "",
                             rng(r["preflight_s"]), rng(hc["off"]["preflight_s"]), r["ratio"],
                             r["ratio_min"], r["ratio_max"], target))
    for size, r in (k for k in (results.get("recording_cost") or {}).items()
                    if k[0] not in ("goal", "per_op")):
        lines.append("| all_reduce busbw %s B, 2 ranks gloo, Flight Recorder on "
                     "(flight_recorder=2000 + watcher) vs off | %s GB/s | %s GB/s | %.3fx "
                     "[%.3f-%.3f] | >= 0.98x |" % (size, rng(r["on_gbs"]), rng(r["off_gbs"]),
                                                   r["ratio"], r["ratio_min"], r["ratio_max"]))
    op = (results.get("recording_cost") or {}).get("per_op")
    if op:
        lines.append("| one all_reduce of 1 float, a one-rank gloo group, Flight Recorder on vs "
                     "off | %s us | %s us | %+.2f us per collective | - |" % (
                         rng(op["on_us"]), rng(op["off_us"]), op["cost_us"]))
    rc = results.get("restart_cost")
    if rc:
        lines.append("| a worker's network cut to every rank of the restarted attempt running "
                     "(nnodes=6 spares=2 max_restarts=1, %d lab hosts, lost_after_s=5) vs a fresh "
                     "train.yml of the same 6 hosts by hand to every rank running | %s s | %s s | "
                     "%.2fx [%.2f-%.2f] | <= 1.0x |" % (
                         rc["hosts"], rng(rc["restart_s"]), rng(rc["fresh_s"]), rc["ratio"],
                         rc["ratio_min"], rc["ratio_max"]))
    if rc and rc.get("buckets"):
        def parts(side):
            return ", ".join("%s %s" % (k, rng(v)) for k, v in rc["buckets"].get(side, {}).items())
        lines.append("| the same, train.json's goodput buckets (s): the restart's | %s | the fresh "
                     "run's: %s | | |" % (parts("restart"), parts("fresh")))
    sp_ = results.get("spare_prepare")
    if sp_:
        lines.append("| a rank's `import torch` on a spare: after spare_prepare's process vs its "
                     "files never read (site-packages evicted from the page cache) | %s s | %s s | "
                     "%.2f s saved [%.2f-%.2f]; the process %s s at nice 19 | |" % (
                         rng(sp_["prepared_import_s"]), rng(sp_["cold_import_s"]),
                         sp_["saved_s"]["median"], sp_["saved_s"]["min"], sp_["saved_s"]["max"],
                         rng(sp_["prepare_s"])))
    dc = results.get("detach_cost")
    if dc:
        lines.append("| train.yml -e detach=true to its report, finished unattended by the "
                     "controller, vs the same run attached, %d lab hosts, %d steps | %s s | %s s "
                     "| %sx | <= 1.3x |" % (dc["hosts"], dc["steps"], rng(dc["unattended_s"]),
                                           rng(dc["attached_s"]), rng(dc["unattended_ratio"])))
        lines.append("| train.yml -e detach=true + attach.yml (the finisher gone) to the report "
                     "vs the same run attached | %s s | %s s | %sx | <= 1.3x |" % (
                         rng(dc["by_attach_s"]), rng(dc["attached_s"]), rng(dc["attach_ratio"])))
        lines.append("| status.yml -e run_id= (one look at the master) vs `ansible node0 -m ping` "
                     "| %s s | %s s | %sx | <= 2x |" % (rng(dc["status_s"]), rng(dc["ping_s"]),
                                                       rng(dc["status_ratio"])))
    for r in (results.get("checkpoint_watch") or {}).values():
        lines.append("| the checkpoint watch (a look each %.0f s, a torch.save every 5 s) over a "
                     "checkpoint_dir of %d files, its CPU over %.0f s; its first look (the past) "
                     "%.3f CPU-s once; checkpoints found of those saved %s | %s %% of one core | "
                     "| | <= 0.1 %% |" % (defaults.CHECKPOINT_LOOK_S, r["files"], r["window_s"],
                                         r["first_look_s"], r["found_of_saved"],
                                         "%.4f [%.4f-%.4f]" % (r["core_pct"]["median"],
                                                               r["core_pct"]["min"],
                                                               r["core_pct"]["max"])))
    hw = results.get("hardware_watch")
    if hw:
        w = hw["watcher"]
        lines.append("| the hardware watcher's look per heartbeat (%s) vs a heartbeat without it "
                     "(agent.local_status) | %.1f us | %.1f us | %.4f [%.4f-%.4f] %% of one core "
                     "at one look per second | <= 0.5 %% |" % (
                         w["source"], 1e6 * w["watch_cpu_s"]["median"],
                         1e6 * w["beat_cpu_s"]["median"], w["core_pct"]["median"],
                         w["core_pct"]["min"], w["core_pct"]["max"]))
        lines.append("| a kernel line (Xid 79) on node1 of a 2-host train.yml to the master's "
                     "record naming it | %s s | | | <= 5 s |"
                     % rng(hw["line_to_verdict"]["latency_s"]))
    sg = results.get("straggler")
    if sg:
        c, lb = sg["cost"], sg["lab"]
        lines.append("| a training step (5 ms of compute, all_reduce of 64 KiB, gloo, one rank, "
                     "recorder full) with straggler sampling vs without | %s ms | %s ms | %sx "
                     "| <= 1.01x |" % (rng(c["step_ms_on"]), rng(c["step_ms_off"]),
                                       rng(c["ratio"])))
        if lb.get("cap_to_named_s"):
            lines.append("| node2's CPU capped 20 s into a 4-host train.yml: the cap to the "
                         "master naming it (%d of %d runs named it, others named %s) | %s s | | "
                         "| <= 60 s |" % (lb["named"], lb["capped_runs"], lb["others_named"],
                                          rng(lb["cap_to_named_s"])))
        lines.append("| clean 4-host train.yml runs: stragglers named | %s | | | 0 in 5 |"
                     % lb["false_names"])
    sc = results.get("scale")
    for n, r in sorted(((sc or {}).get("sizes") or {}).items(), key=lambda kv: int(kv[0])):
        if "error" in r:
            lines.append("| %s simulated hosts x 8 ranks (lab/scale.py) | failed: %s | | | |"
                         % (n, r["error"].replace("|", "/").replace("\n", " ")[:300]))
            continue
        if "runs" in r:  # the fail-fast runs (a size may hold only other parts: --scale-parts)
            g, allowed = r.get("growth", {}), r.get("growth_allowed", 0)
            grow = "; growth over the smallest size %s (allowed %.1fx)" % (", ".join(
                "%s %.1fx" % (k, v) for k, v in sorted(g.items())), allowed) if g else ""
            lines.append("| %s simulated hosts x 8 ranks (lab/scale.py%s): a rank dies -> the "
                         "master's failure / every host told / every host's torchrun ended / "
                         "record final (%d of %d runs named the rank; the master's broadcast of "
                         "its abort %s s) | %s / %s / %s / %s s | | | told <= 3 s |"
                         % (n, taken(r), r["named_right"], r["runs"], rng(r["broadcast_s"]),
                            rng(r["detected_s"]), rng(r["told_s"]), rng(r["ended_s"]),
                            rng(r["final_s"])))
            lines.append("| %s simulated hosts, steady: the master's CPU (cores) / RSS (MB) / "
                         "control channel up, down (B/s) / run_state.json (bytes) / a look / "
                         "status (s)%s | %s / %s / %s, %s / %s / %s / %s | | | status <= 2 s "
                         "at 512 |"
                         % (n, grow, rng(r["master_cores"]), rng(r["master_rss_mb"]),
                            rng(r["channel_up_Bps"]), rng(r["channel_down_Bps"]),
                            rng(r["record_bytes"]), rng(r["look_s"]), rng(r["status_s"])))
        h = r.get("hang")
        if h:
            lines.append("| %s simulated hosts: a hang named (rank named right: %s), past "
                         "hang_timeout_s=%.0f%s | %.1f s | | | <= 30 s |"
                         % (n, h["named_right"], sc["hang_timeout_s"], taken(h),
                            h["over_timeout_s"]))
        if "verdict_s" in r:
            lines.append("| %s simulated hosts: the play's verdict (run_summary on the final "
                         "record; %d of %d named the rank) / train.json (bytes) | %s s / %s | "
                         "| | |" % (n, r["verdict_right"], r["runs"], rng(r["verdict_s"]),
                                    rng(r["train_json_bytes"])))
        d = r.get("detach")
        if d:
            lines.append("| %s simulated hosts: detach (a look, to the master detached) / the "
                         "attach's look / its full look / a rank killed -> the follower sees "
                         "it final (ran on past 2 x lease_s=%.0f with no look: %s; named "
                         "right: %s%s) | %.3f / %.3f / %.3f / %.1f s | | | |"
                         % (n, sc.get("lease_s", 0), d["held"], d["named_right"], taken(d),
                            d["detach_s"], d["attach_look_s"], d["attach_full_look_s"],
                            d["final_seen_s"]))
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
    ac = results.get("accuracy")
    if ac:
        for name, r in ac["classes"].items():
            d = r["detect_s"]
            lines.append("| accuracy: %s on %s (%s), %d trials: detection median / max; right "
                         "host, right cause (k of N) | %s | | host %d/%d, cause %d/%d | |" % (
                             name, r["host"], r["check"], r["trials"],
                             "%.2f / %.2f s" % (d["median"], d["max"]) if d else "none",
                             r["right_host"], r["trials"], r["right_cause"], r["trials"]))
        c = ac["clean"]
        if c.get("runs"):
            lines.append("| accuracy: clean runs with routine kernel lines (%d lines a host): "
                         "named a failure / acted / quarantined / drained (warnings raised) | "
                         "%d / %d / %d / %d of %d (%d) | | | 0 |" % (
                             c["lines"], c["named_a_failure"], c["acted"], c["quarantined"],
                             c["drained"], c["runs"], c["warned"]))
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
    for r in (cl.get("sizes") or {}).values():
        lines += ["", "train.yml in a container vs on the host, %d lab nodes, median container "
                  "- median host: goodput buckets %s; tasks changed by %.1f s or more: %s" % (
                      r["hosts"], ", ".join("%s %+.2f s" % kv
                                            for kv in sorted(r["buckets_added_s"].items())),
                      r["task_delta_s"], "; ".join("%s %+.2f s" % (t["task"], t["seconds"])
                                                   for t in r["tasks_added_s"]) or "none")]
    if results.get("launch_profile"):
        from bench import launch_profile  # (it imports this module)
        lines += ["", "Where a 2-host launch spends its wall time and CPU (CPU-seconds of one "
                  "run; bench/launch_profile.py):", "", launch_profile.markdown(
                      results["launch_profile"])]
    if pc:
        lines += ["", "Slowest preflight tasks (last run of each size):", ""]
        for name, r in pc.items():
            lines.append("- %s: %s" % (name, "; ".join("%s %.2f s" % (t["task"], t["seconds"])
                                                        for t in r["slowest_tasks"])))
    return "\n".join(lines) + "\n"


# The measures whose sizes are run one at a time (a size of 512 hosts is a sitting of its own):
# the sizes not re-run are kept from the previous results, each with the date it was taken.
BY_SIZE = {"preflight_cost": None, "scale": "sizes"}


def merge(old, new, names):
    """Keep the measures not re-run from the previous results (with the date they were taken)
    and record the previous value of each re-run one under "before"."""
    if not old:
        return new
    when = old.get("machine", {}).get("date", "an earlier run")
    merged = dict(new, before=dict(old.get("before", {})), carried={})
    for name in names:
        if name in new and name in old:  # a carried measure dates from when it was taken
            taken = old.get("carried", {}).get(name, when)
            merged["before"][name] = dict(old[name], taken=taken)
            if name in BY_SIZE:
                key = BY_SIZE[name]
                sizes = dict(new[name][key] if key else new[name])
                for size, value in (old[name][key] if key else old[name]).items():
                    if not isinstance(value, dict):
                        continue
                    kept = dict(value, taken=value.get("taken", taken))
                    if size not in sizes:
                        sizes[size] = kept
                    elif sizes[size].get("parts") and "error" not in sizes[size]:
                        # Only some parts re-run (scale --scale-parts): each dated on its own.
                        now = new.get("machine", {}).get("date")
                        sizes[size] = dict(kept, **{p: dict(sizes[size][p], taken=now)
                                                    for p in sizes[size]["parts"]})
                merged[name] = dict(new[name], **{key: sizes}) if key else sizes
        elif name in old:
            merged[name] = old[name]
            merged["carried"][name] = old.get("carried", {}).get(name, when)
    return merged


def write(out, results):
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "results.md").write_text(markdown(results))
