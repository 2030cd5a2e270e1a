"""torchfleet's accuracy, published (issue 65): per fault class it judges, N injected trials on
the lab, each read back from the project's own outputs (train.json and the master's record
run_state.json, preflight.json, collective.json): the time from the injection to the verdict
naming it, and whether the right host and the right cause were named; then clean runs of the
same shapes with routine kernel lines injected, and what they named anyway.

The faults are the lab tests' own (tests/lab/): a rank's exit (steps_notorch.py's exit code 3,
test_reliability_lab), a rank's SIGKILL, a host's cable pulled (Lab.cut_network), a hang
(collective_fault.py's sleeping rank, test_hang_lab), the kernel's OOM killer in a memory
cgroup (oom_rank.py, Lab.limit_memory), an Xid 79 line (tests/fixtures/kmsg/) appended to the
host's kernel_log file (test_slurm_lab, bench/hardware_watch.py), a CPU cap (Lab.limit_cpu,
test_straggler_lab), a rate-limited NIC in the collective test's pair rounds (Lab.slow_nic,
bench/isolate.py), the master port dropped by a firewall at preflight (Lab.block_port,
bench/diagnosis.py). The smallest lab that shows each: 2 hosts of 1 rank, 3 for the straggler
and the pair rounds; ranks that import no torch where the control plane is what is judged.

Detection time: from the injection (this machine's clock; the lab's hosts share it) to the
master's record of the failure (started + detected_s), or to the straggler's first_seen; for a
hang, from the stuck rank's last line (its stdout.log's time); for the OOM kill, from the rank's
"loading a batch that does not fit" (the allocation to the limit is in it); for a fault in place
before the play (the slowed NIC, the blocked port), the play's wall time to its verdict.
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import time

from ansible_collections.torchfleet.fleet.plugins.module_utils.run import procs
from bench.harness import LAB_DIR, ROOT, env, lab, lab_down, playbook, wait_until
from bench.hardware_watch import XID79
from bench.isolate import isolate_run
from lab.netns import SLOW_CPU_PCT
from torchfleet import ansible_cli

SCRIPTS = ROOT / "tests" / "fixtures" / "scripts"
KMSG = ROOT / "tests" / "fixtures" / "kmsg"
NOTORCH = SCRIPTS / "steps_notorch.py"
RUNS = LAB_DIR.with_name(LAB_DIR.name + "-accuracy-runs")  # the lab hosts' remote_runs_root
HOSTS = 3
LOST_AFTER_S = 10       # as test_reliability_lab's cut (the default 30 s: the same mechanism)
HANG_TIMEOUT_S = 6      # as test_hang_lab
HANG_AT = 15
OOM_MIB = 1536          # as test_hang_lab's OOM case
# As test_straggler_lab (its cap 20 s in, 15 %), at the lab's own cap (10 %: below a rank's
# share of this machine's 2 CPUs, which other labs load too).
CAP_PCT, CAP_AFTER_S, NAMED_WITHIN_S = SLOW_CPU_PCT, 15, 60
CLEAN_MATMUL_S = 30     # a clean straggler-shaped run: its ranks stop by themselves after it
MASTER_PORT = 29500
VERDICT_BOUND_S = 120   # from an injection to the run's end, before the bench ends it itself


# -- the routine kernel lines of the clean runs ----------------------------------------------

def _lines(name, *keep):
    lines = (KMSG / name).read_text().splitlines()
    return [lines[i] for i in keep] if keep else lines


def routine_lines():
    """What a healthy fleet's kernel logs hold, every line a warning or nothing in
    docs/checks.md's table (never one of its fatal rows): recorded lines of tests/fixtures/."""
    xid13 = [line.split("+00:00 ", 1)[1] for line in  # (dmesg --time-format iso's prefix off)
             (ROOT / "tests" / "fixtures" / "health" / "dmesg-iso.xid13.txt").read_text()
             .splitlines() if "Xid" in line]
    return (_lines("xid79-aer.gpu-burn.txt", 0, 1, 2, 3)      # a corrected AER error
            + _lines("aer-nonfatal.ptm-patch.txt")             # non-fatal, recovered
            + _lines("xid63.ml-engineering.txt")               # a row marked for remapping
            + _lines("xid94-43.akash.txt", 0, 1, 2)            # Xid 43: a program's fault
            + xid13                                            # Xid 13: a program's fault
            + _lines("mlx5-access-reg.linux-commits.txt")      # failed firmware commands
            + ["mlx5_core 0000:19:00.0: mlx5_cmd_out_err:838:(pid 2743): ACCESS_REG(0x805) "
               "op_mod(0x1) failed, status internal error(0x1), syndrome (0x6c4d5c), err(-5)"]
            + [line for line in _lines("mlx5.gpud-pstore.txt")  # NIC boot noise, not the
               if "Cable unplugged" not in line]                 # cable's (fatal) line
            + _lines("sxid12028-nonfatal.gpud.txt")            # a non-fatal NVSwitch SXid
            # An NVMe drive's fatal AER: not a device of the run (test_slurm_lab's line).
            + ["[74880.000001] nvme 0000:c1:00.0: AER: Multiple Uncorrected (Fatal) error "
               "received: 0000:c1:00.0"])


def write_noise(kdir, hosts):
    for host in hosts:
        with open(kdir / ("%s.log" % host), "a") as f:
            f.write("\n".join(routine_lines()) + "\n")


# -- what a report says (pure: tests/unit/test_bench_accuracy.py) ----------------------------

def named_hosts(report, check):
    """The hosts a train.json / preflight.json / collective.json names for `check`: the
    stragglers, the first failure's host (a hang's: the ranks its collective names), or the
    hosts of the failing checks."""
    if check == "run.straggler":
        return sorted({s["host"] for s in report.get("stragglers") or []})
    if report.get("kind") == "train":
        first = report.get("first_failure") or {}
        if first.get("host"):
            return [first["host"]]
        found = first.get("collective") or {}
        return sorted({m["host"] for m in (found.get("missing") or []) +
                       (found.get("mismatch") or [])})
    return sorted({c["host"] for c in report.get("checks") or []
                   if not c["ok"] and c.get("severity", "error") == "error" and c.get("host")})


def score(report, host, check, exit_code=None, detail=None):
    """(right host, right cause) of one trial: the report names `host` and no other; and it
    fails `check` on that host as an error (a straggler: names it run.straggler), with the rank's
    `exit_code` where one is given, and `detail` in the check's words where one is given, and,
    for a preflight or a collective test, no other check fails."""
    right_host = named_hosts(report, check) == [host]
    failing = [c for c in report.get("checks") or [] if not c["ok"]]
    # An error (a straggler is a warning where straggler_action=warn, the default).
    ours = [c for c in failing if c["id"] == check and c.get("host") == host
            and (c.get("severity", "error") == "error" or check == "run.straggler")
            and (detail is None or detail in c.get("detail", ""))]
    if exit_code is not None:
        ours = ours if (report.get("first_failure") or {}).get("exit_code") == exit_code else []
    if report.get("kind") != "train":  # preflight, collective: nothing else may fail
        ours = ours if all(c["id"] == check for c in failing
                           if c.get("severity", "error") == "error") else []
    return right_host, bool(ours)


def held_against(report):
    """Everything a report holds against a host: [(what, host)] with what a check id and its
    severity ("run.hardware warning"), "first failure", "straggler", "drain" or an action
    ("quarantine", "would quarantine" where not done)."""
    out = []
    first = report.get("first_failure")
    if first:
        out += [("first failure", h) for h in named_hosts(report, "") or [None]]
    out += [("%s %s" % (c["id"], c.get("severity", "error")), c.get("host"))
            for c in report.get("checks") or [] if not c["ok"]]
    out += [("straggler", s["host"]) for s in report.get("stragglers") or []]
    out += [("drain", d["host"]) for d in report.get("drain") or []]
    out += [(("" if a.get("done") else "would ") + a["action"], a.get("host"))
            for a in report.get("actions") or []]
    return out


def clean_verdict(report):
    """One clean run's tally: did it fail or stop, name a failure, a straggler, drain,
    quarantine or act at all; and the warnings it raised, by check id."""
    held = held_against(report)
    acts = [w for w, _h in held if w.split()[-1] in ("stop", "drain", "quarantine", "exclude",
                                                     "restart")]
    return {"ok": bool(report.get("ok")),
            "failures": sorted({"%s %s" % (w, h) for w, h in held
                                if not w.endswith(" warning") and w not in acts}),
            "warnings": sorted({"%s %s" % (w, h) for w, h in held if w.endswith(" warning")}),
            "actions": sorted(set(acts)),
            "quarantined": any("quarantine" in w for w in acts) or any(
                w.startswith("host.quarantined") for w, _h in held),
            "drained": any(w == "drain" or w.endswith("drain") for w, _h in held)}


# -- the runs --------------------------------------------------------------------------------

def train(the_lab, tmp, name, script, args, *extra, nnodes=2, kdir=None):
    """train.yml started in the background on the lab; (process, run id, run dir)."""
    run_id = "acc-%s-%d" % (name, time.time_ns() % 10 ** 9)
    run_dir = tmp / name / "run"  # a ledger of its own per trial (fleet_db is run_dir's parent's)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    kernel = ["-e", "kernel_log=%s/{{ inventory_hostname }}.log" % kdir] if kdir else []
    proc = subprocess.Popen(
        [*ansible_cli.command("ansible-playbook"), "train.yml", "-i", str(the_lab.inventory),
         "-e", "nnodes=%d" % nnodes, "-e", "script=%s" % script,
         "-e", json.dumps({"script_args": [str(a) for a in args]}), "-e", "run_id=%s" % run_id,
         "-e", "run_dir=%s" % run_dir, *kernel, *extra],
        cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        stdin=subprocess.DEVNULL, start_new_session=True)
    return proc, run_id, run_dir


def rank_logs(run_id, host):
    return list((RUNS / run_id / host / "logs").glob("**/stdout.log"))


def training(run_id, hosts, word="step"):
    return all(any(word in p.read_text(errors="replace") for p in rank_logs(run_id, h))
               for h in hosts)


def finish(proc, timeout_s=300):
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    return out


def results(run_dir):
    report = json.loads((run_dir / "train.json").read_text())
    record = json.loads((run_dir / "run_state.json").read_text())
    return report, record


def detected_at(record):
    failure = record.get("failure") or {}
    return None if failure.get("detected_s") is None else record["started"] + failure["detected_s"]


def rank_pid(run_id, host):
    """The PID of `host`'s rank (one rank a host) of the run: the lab's hosts share this
    machine's PID space."""
    found = [pid for pid in procs.run_processes(run_id)
             if procs.environ(pid).get(b"TORCHFLEET_HOST") == host.encode()
             and b"LOCAL_RANK" in procs.environ(pid)
             and b"torch.distributed.run" not in procs.cmdline(pid).encode()]
    return found[0] if found else None


def trial_in_run(the_lab, tmp, name, inject, script, args, *extra, kdir=None, nnodes=2,
                 started_word="step", go=None):
    """A run that trains, then `inject(run_id)` (which returns when it injected, or None where
    the injection is dated from the rank's log after the run). go: the file that ends the
    run's ranks, made VERDICT_BOUND_S after the injection when the run has not ended by then
    (a fault never judged is a trial that failed, not a bench that waits forever)."""
    proc, run_id, run_dir = train(the_lab, tmp, name, script, args, *extra, nnodes=nnodes,
                                  kdir=kdir)
    hosts = ["node%d" % i for i in range(nnodes)]
    try:
        if not wait_until(lambda: training(run_id, hosts, started_word)
                          or proc.poll() is not None, 240, 0.1) or proc.poll() is not None:
            return {"error": "never trained: " + finish(proc)[-1500:]}
        injected = inject(run_id)
        if go is not None:
            wait_until(lambda: proc.poll() is not None, VERDICT_BOUND_S, 0.2)
            go.touch()
        out = finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        the_lab.heal()
    try:
        report, record = results(run_dir)
    except (OSError, ValueError) as e:
        return {"error": "no train.json (%s): %s" % (e, out[-1500:])}
    return {"report": report, "record": record, "injected": injected, "run_id": run_id}


def measure(trial, host, check, exit_code=None, detail=None, injected=None, at=None):
    """One trial's row: detection seconds, right host, right cause, the verdict."""
    if "error" in trial:
        return {"error": trial["error"], "right_host": False, "right_cause": False}
    report = trial["report"]
    right_host, right_cause = score(report, host, check, exit_code, detail)
    injected = trial.get("injected") if injected is None else injected
    at = detected_at(trial["record"]) if at is None else at
    return {"detect_s": None if at is None or injected is None else round(at - injected, 2),
            "right_host": right_host, "right_cause": right_cause,
            "verdict": report.get("verdict", "")[:300], "run_id": trial.get("run_id")}


def stamp_of(path_list):
    return max((p.stat().st_mtime for p in path_list), default=None)


def run_exit(the_lab, tmp, i):
    go = tmp / ("exit-go-%d" % i)

    def inject(_run_id):
        go.touch()
        return time.time()
    t = trial_in_run(the_lab, tmp, "exit%d" % i, inject, NOTORCH, [go, 1],
                     kdir=empty_kernel_logs(tmp, "exit%d" % i))  # (go: rank 0 steps on)
    return measure(t, "node1", "run.exit", exit_code=3)


def run_signal(the_lab, tmp, i):
    go = tmp / ("signal-go-%d" % i)

    def inject(run_id):
        pid = rank_pid(run_id, "node1")
        os.kill(pid, signal.SIGKILL)
        return time.time()
    try:
        t = trial_in_run(the_lab, tmp, "signal%d" % i, inject, NOTORCH, [go],
                         kdir=empty_kernel_logs(tmp, "signal%d" % i), go=go)
    finally:
        go.touch()
    return measure(t, "node1", "run.exit", exit_code=-9)


def run_lost(the_lab, tmp, i):
    go = tmp / ("lost-go-%d" % i)

    def inject(_run_id):
        the_lab.cut_network("node1")
        return time.time()
    try:
        t = trial_in_run(the_lab, tmp, "lost%d" % i, inject, NOTORCH, [go],
                         "-e", "lost_after_s=%d" % LOST_AFTER_S,
                         kdir=empty_kernel_logs(tmp, "lost%d" % i), go=go)
    finally:
        go.touch()
    return measure(t, "node1", "host.lost")


def run_xid(the_lab, tmp, i):
    go, kdir = tmp / ("xid-go-%d" % i), empty_kernel_logs(tmp, "xid%d" % i)

    def inject(_run_id):
        with open(kdir / "node1.log", "a") as f:
            f.write(XID79 + "\n")
        return time.time()
    try:
        t = trial_in_run(the_lab, tmp, "xid%d" % i, inject, NOTORCH, [go], kdir=kdir,
                         go=go)
    finally:
        go.touch()
    return measure(t, "node1", "run.hardware")


def run_hang(the_lab, tmp, i):
    t = trial_in_run(the_lab, tmp, "hang%d" % i, lambda run_id: None,
                     SCRIPTS / "collective_fault.py", ["sleep", 1, HANG_AT],
                     "-e", "hang_timeout_s=%d" % HANG_TIMEOUT_S,
                     kdir=empty_kernel_logs(tmp, "hang%d" % i))
    # The hang began at the stuck rank's last line (its step before the sleep).
    injected = stamp_of(rank_logs(t["run_id"], "node1")) if "run_id" in t else None
    return measure(t, "node1", "run.hang", injected=injected)


def run_oom(the_lab, tmp, i):
    def inject(_run_id):
        return None  # the rank allocates at step 5 by itself: its line dates it

    the_lab.limit_memory("node1", OOM_MIB)
    # The kernel's own line: the default kernel_log (/dev/kmsg), as test_hang_lab's OOM case.
    t = trial_in_run(the_lab, tmp, "oom%d" % i, inject, SCRIPTS / "oom_rank.py", [1, 5])
    injected = stamp_of(rank_logs(t["run_id"], "node1")) if "run_id" in t else None
    return measure(t, "node1", "run.oom", injected=injected)


def run_straggler(the_lab, tmp, i):
    stop, capped = tmp / ("straggle-stop-%d" % i), {}

    def inject(run_id):
        time.sleep(CAP_AFTER_S)  # into training: the workload sizes its steps in its first 10 s
        the_lab.limit_cpu("node2", CAP_PCT)
        capped["at"] = time.time()
        capped["lines"] = len(rate_lines(run_id))
        master = RUNS / run_id / "node0" / "control.json"

        def named():
            try:
                return any(s["host"] == "node2" for s in
                           json.loads(master.read_text()).get("stragglers") or [])
            except (OSError, ValueError):
                return False
        wait_until(named, NAMED_WITHIN_S, 1.0)
        stop.touch()
        return capped["at"]
    try:
        t = trial_in_run(the_lab, tmp, "straggler%d" % i, inject, SCRIPTS / "matmul_allreduce.py",
                         [20, stop, 900], nnodes=3, kdir=empty_kernel_logs(tmp, "straggler%d" % i))
    finally:
        stop.touch()
    first = [s["first_seen"] for s in (t.get("record") or {}).get("stragglers") or []
             if s["host"] == "node2"]
    row = measure(t, "node2", "run.straggler", at=min(first) if first else None)
    # Did the cap slow the run? rank 0's collectives a second (a line a second) in the 10 s
    # before it and from 5 s after it (test_straggler_lab asks for a third fewer).
    rates = rate_lines(t["run_id"]) if "run_id" in t else []
    n = capped.get("lines", 0)
    if rates and n:
        row["rate_before_after"] = [round(statistics.median(part), 1) if part else None
                                    for part in (rates[max(0, n - 10):n], rates[n + 5:])]
    return row


def rate_lines(run_id):
    """Rank 0's collectives a second, each second (matmul_allreduce.py's lines)."""
    return [float(line.split(", ")[1].split()[0]) for p in rank_logs(run_id, "node0")
            for line in p.read_text(errors="replace").splitlines()
            if line.startswith("[rank 0] step ") and "collectives/s," in line]


def run_slow_nic(the_lab, tmp, i):
    the_lab.slow_nic("node2")
    try:
        # (tmp/nicI/run: a ledger of its own, tmp/nicI/fleet.db)
        (tmp / ("nic%d" % i)).mkdir(exist_ok=True)
        wall, _iso, _named, _rc, _load = isolate_run(the_lab, HOSTS, tmp / ("nic%d" % i), "run")
        report = json.loads((tmp / ("nic%d" % i) / "run" / "collective.json").read_text())
    except (OSError, ValueError, KeyError) as e:
        return {"error": repr(e), "right_host": False, "right_cause": False}
    finally:
        the_lab.heal()
    right_host, right_cause = score(report, "node2", "node.slow")
    return {"detect_s": round(wall, 2), "right_host": right_host, "right_cause": right_cause,
            "verdict": str(report.get("verdict", ""))[:300]}


def run_blocked_port(the_lab, tmp, i):
    """The master's port dropped: the worker that must reach it fails port.blocked, naming
    the master's address and port."""
    the_lab.block_port("node0", MASTER_PORT)
    try:
        wall, _cpu, _rc, out = playbook("preflight.yml", the_lab.inventory, "-e", "nnodes=2",
                                        "-e", "run_dir=%s/port%d/run" % (tmp, i))
        report = json.loads((tmp / ("port%d" % i) / "run" / "preflight.json").read_text())
    except (OSError, ValueError) as e:
        return {"error": repr(e), "right_host": False, "right_cause": False}
    finally:
        the_lab.heal()
    right_host, right_cause = score(report, "node1", "port.blocked",
                                    detail="%s:%d" % (the_lab.nodes[0].address, MASTER_PORT))
    return {"detect_s": round(wall, 2), "right_host": right_host, "right_cause": right_cause,
            "verdict": str(report.get("verdict", ""))[:300]}


def empty_kernel_logs(tmp, name):
    """Each host's kernel_log file of one run (the lab's hosts share this machine's kernel
    log: where it is not what is judged, a file of its own keeps the other labs' out)."""
    kdir = tmp / name / "kmsg"
    kdir.mkdir(parents=True, exist_ok=True)
    for n in range(HOSTS):
        (kdir / ("node%d.log" % n)).touch()
    return kdir


CLASSES = {  # name: (what is injected, the trial)
    "rank exit": ("node1's rank exits 3 (steps_notorch.py, 2 hosts x 1 rank)", run_exit),
    "rank killed by a signal": ("node1's rank SIGKILLed (steps_notorch.py, 2 x 1)", run_signal),
    "host lost": ("node1's cable pulled (its veth down; lost_after_s=%d; 2 x 1)" % LOST_AFTER_S,
                  run_lost),
    "hang": ("node1's rank sleeps before all_reduce #%d (collective_fault.py sleep, torch gloo, "
             "hang_timeout_s=%d; 2 x 1)" % (HANG_AT, HANG_TIMEOUT_S), run_hang),
    "kernel OOM kill": ("node1 in a %d MiB memory cgroup, its rank allocates past it at step 5 "
                        "(oom_rank.py, torch; the kernel's own line in /dev/kmsg; 2 x 1)" % OOM_MIB,
                        run_oom),
    "Xid 79": ("a recorded Xid 79 line (xid79-aer.gpu-burn.txt) appended to node1's kernel_log "
               "file while it trains (steps_notorch.py, 2 x 1)", run_xid),
    "CPU-capped straggler": ("node2's CPU capped at %d %% of a CPU %d s into training "
                             "(matmul_allreduce.py at 20 collectives/s, torch gloo; 3 x 1); "
                             "the run stopped once node2 is named, or %d s after the cap"
                             % (CAP_PCT, CAP_AFTER_S, NAMED_WITHIN_S), run_straggler),
    "slowed NIC (collective test)": ("node2's NIC rate-limited (tbf) before collective.yml "
                                     "with the pair rounds (3 hosts)", run_slow_nic),
    "blocked port at preflight": ("node0's firewall drops TCP %d before preflight.yml "
                                  "(2 hosts)" % MASTER_PORT, run_blocked_port),
}
CHECK = {"rank exit": "run.exit (exit code 3)", "rank killed by a signal": "run.exit (-9)",
         "host lost": "host.lost", "hang": "run.hang", "kernel OOM kill": "run.oom",
         "Xid 79": "run.hardware", "CPU-capped straggler": "run.straggler",
         "slowed NIC (collective test)": "node.slow",
         "blocked port at preflight": "port.blocked (names node0:%d)" % MASTER_PORT}
EXPECTED_HOST = {"CPU-capped straggler": "node2", "slowed NIC (collective test)": "node2"}


# -- the clean runs --------------------------------------------------------------------------

def clean_train(the_lab, tmp, i):
    go, kdir = tmp / ("clean-go-%d" % i), empty_kernel_logs(tmp / "clean", "k%d" % i)
    run_id = "acc-clean%d-%d" % (i, time.time_ns() % 10 ** 9)
    run_dir = tmp / "clean" / ("train%d" % i)  # one ledger for every clean run: clean/fleet.db
    proc = subprocess.Popen(
        [*ansible_cli.command("ansible-playbook"), "train.yml", "-i", str(the_lab.inventory),
         "-e", "nnodes=2", "-e", "script=%s" % NOTORCH, "-e", json.dumps({"script_args": [str(go)]}),
         "-e", "run_id=%s" % run_id, "-e", "run_dir=%s" % run_dir,
         "-e", "kernel_log=%s/{{ inventory_hostname }}.log" % kdir],
        cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(lambda: training(run_id, ["node0", "node1"]) or proc.poll() is not None, 240,
                   0.2)
        write_noise(kdir, ["node0", "node1"])
        time.sleep(3)  # several of the agents' looks at the kernel log (a beat a second)
        write_noise(kdir, ["node0", "node1"])
        seen = time.monotonic()
        wait_until(lambda: time.monotonic() - seen > 3 or proc.poll() is not None, 10, 0.2)
        go.touch()
        out = finish(proc)
    finally:
        go.touch()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return clean_report(run_dir / "train.json", out)


def clean_report(path, out=""):
    """A clean run's report, or one that fails it and says why (its play's output's end)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return {"ok": False, "verdict": "no %s (%s)%s" % (path.name, e,
                                                          ": " + out[-800:] if out else "")}


def clean_matmul(the_lab, tmp, i):
    """The straggler's shape, uncapped: 3 hosts' torch ranks at 20 collectives a second for
    CLEAN_MATMUL_S, the routine lines written while they train."""
    kdir = empty_kernel_logs(tmp / "clean", "mk%d" % i)
    run_id = "acc-cleanmm%d-%d" % (i, time.time_ns() % 10 ** 9)
    run_dir = tmp / "clean" / ("matmul%d" % i)
    proc = subprocess.Popen(
        [*ansible_cli.command("ansible-playbook"), "train.yml", "-i", str(the_lab.inventory),
         "-e", "nnodes=%d" % HOSTS, "-e", "script=%s" % (SCRIPTS / "matmul_allreduce.py"),
         "-e", json.dumps({"script_args": ["20", str(tmp / "never"), str(CLEAN_MATMUL_S)]}),
         "-e", "run_id=%s" % run_id, "-e", "run_dir=%s" % run_dir,
         "-e", "kernel_log=%s/{{ inventory_hostname }}.log" % kdir],
        cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(lambda: training(run_id, ["node%d" % n for n in range(HOSTS)])
                   or proc.poll() is not None, 240, 0.5)
        write_noise(kdir, ["node%d" % n for n in range(HOSTS)])
        out = finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return clean_report(run_dir / "train.json", out)


def clean_preflight(the_lab, tmp, i):
    kdir = empty_kernel_logs(tmp / "clean", "pk%d" % i)
    write_noise(kdir, ["node0", "node1"])
    run_dir = tmp / "clean" / ("preflight%d" % i)
    playbook("preflight.yml", the_lab.inventory, "-e", "nnodes=2", "-e", "run_dir=%s" % run_dir,
             "-e", "kernel_log=%s/{{ inventory_hostname }}.log" % kdir)
    return clean_report(run_dir / "preflight.json")


def clean_collective(the_lab, tmp, i):
    kdir = empty_kernel_logs(tmp / "clean", "ck%d" % i)
    write_noise(kdir, ["node%d" % n for n in range(HOSTS)])
    name = "clean/collective%d" % i
    playbook("collective.yml", the_lab.inventory, "-e", "run_dir=%s/%s" % (tmp, name), "-e",
             "nnodes=%d" % HOSTS, "-e", "collective_isolate=true", "-e", "collective_sizes=64K",
             "-e", "collective_iters=3", "-e",
             "kernel_log=%s/{{ inventory_hostname }}.log" % kdir)
    return clean_report(tmp / name / "collective.json")


CLEAN = [("train.yml (2 x 1, steps_notorch.py)", clean_train),
         ("preflight.yml (2 hosts)", clean_preflight),
         ("collective.yml with the pair rounds (3 hosts)", clean_collective),
         ("train.yml (3 x 1, matmul_allreduce.py, torch)", clean_matmul)]


def summarize(rows):
    times = [r["detect_s"] for r in rows if r.get("detect_s") is not None]
    return {"trials": len(rows),
            "detect_s": {"median": statistics.median(times), "max": max(times),
                         "min": min(times), "runs": len(times)} if times else None,
            "right_host": sum(r["right_host"] for r in rows),
            "right_cause": sum(r["right_cause"] for r in rows), "rows": rows}


def run(args, tmp):
    trials, clean_n = args.accuracy_trials, args.accuracy_clean
    load = [round(os.getloadavg()[0], 2)]
    the_lab = lab(HOSTS, runs_root=RUNS)
    out = {"hosts": HOSTS, "classes": {}, "clean": {}}
    try:
        for name, (what, trial) in CLASSES.items():
            if args.accuracy_classes and name not in args.accuracy_classes:
                continue
            print("  accuracy: %s x %d" % (name, trials), flush=True)
            rows = []
            for i in range(trials):
                try:
                    rows.append(trial(the_lab, tmp, i))
                except Exception as e:  # a trial that broke is a row that says so
                    rows.append({"error": repr(e)[:500], "right_host": False,
                                 "right_cause": False})
                    the_lab.heal()
                load.append(round(os.getloadavg()[0], 2))
            out["classes"][name] = dict(summarize(rows), injected=what, check=CHECK[name],
                                        host=EXPECTED_HOST.get(name, "node1"))
        print("  accuracy: %d clean runs" % clean_n, flush=True)
        (tmp / "clean").mkdir(exist_ok=True)
        runs = []
        for i in range(clean_n):
            shape, clean = CLEAN[i % len(CLEAN)]
            try:
                report = clean(the_lab, tmp, i)
            except Exception as e:  # a run that broke is a row that says so
                report = {"ok": False, "verdict": "the bench broke: %r" % e}
                the_lab.heal()
            runs.append(dict(clean_verdict(report), shape=shape,
                             verdict=str(report.get("verdict", ""))[:300]))
            load.append(round(os.getloadavg()[0], 2))
        out["clean"] = {
            "runs": len(runs), "lines": len(routine_lines()),
            "named_a_failure": sum(bool(r["failures"]) or not r["ok"] for r in runs),
            "acted": sum(bool(r["actions"]) for r in runs),
            "quarantined": sum(r["quarantined"] for r in runs),
            "drained": sum(r["drained"] for r in runs),
            "warned": sum(bool(r["warnings"]) for r in runs),
            "shapes": {s: sum(r["shape"] == s for r in runs) for s, _ in CLEAN},
            "rows": runs}
    finally:
        lab_down()
    out["load1"] = {"median": statistics.median(load), "min": min(load), "max": max(load)}
    return out


def table(ac):
    """docs/accuracy.md's tables from the bench's results."""
    lines = ["| class | injected | trials | detection median / max | right host | right cause |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, r in ac["classes"].items():
        d = r["detect_s"]
        lines.append("| %s (%s on %s) | %s | %d | %s | %d/%d | %d/%d |" % (
            name, r["check"], r["host"], r["injected"], r["trials"],
            "%.2f s / %.2f s" % (d["median"], d["max"]) if d else "-",
            r["right_host"], r["trials"], r["right_cause"], r["trials"]))
    c = ac["clean"]
    if c.get("runs"):
        lines += ["", "| clean runs | named a failure or failed | acted (stop, drain, quarantine, "
                  "exclude, restart) | quarantined | drained | raised a warning |",
                  "| --- | --- | --- | --- | --- | --- |",
                  "| %d (%s) | %d | %d | %d | %d | %d |" % (
                      c["runs"], ", ".join("%d %s" % (n, s) for s, n in c["shapes"].items()),
                      c["named_a_failure"], c["acted"], c["quarantined"], c["drained"],
                      c["warned"])]
    return "\n".join(lines) + "\n"
