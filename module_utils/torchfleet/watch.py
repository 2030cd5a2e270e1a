"""One look at this host's part of a run: torchrun's state and each local rank's.

Used two ways: by the torchrun_watch module, and as a plain script the watcher's action plugin
pipes to the host's Python for each look. The second costs a bare interpreter start instead of
an AnsiballZ module's (~0.3 CPU-s on the host per look, more on the controller), which matters
when every host is looked at every few seconds next to ranks that want every core.
Hence only the standard library and the two sibling files below.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time

try:
    from ansible.module_utils.torchfleet.procs import (
        alive, cmdline, is_run_torchrun, run_processes)
    from ansible.module_utils.torchfleet.rundir import (
        EXITCODE, LEASE, PIDFILE, STACK_DUMP, TORCHRUN_LOG, rank_dirs, read_json, root_cause,
        tail)
except ImportError:  # a plain script: the action plugin loaded procs and rundir by these names
    from procs import alive, cmdline, is_run_torchrun, run_processes  # type: ignore
    from rundir import (  # type: ignore
        EXITCODE, LEASE, PIDFILE, STACK_DUMP, TORCHRUN_LOG, rank_dirs, read_json, root_cause,
        tail)

# Seconds between two looks while a look waits for the state to change (wait_s).
POLL_S = 0.2

DEFAULTS = {"touch_lease": True, "async_jid": None, "async_dir": "~/.ansible_async",
            "wait_s": 0.0, "dump_stacks": False, "py_spy": None}


def worker_pids(run_id, torchrun_pid):
    """{local_rank: (pid, global rank)} of the live workers this host's torchrun started."""
    workers = {}
    for pid in run_processes(run_id, torchrun_pid, orphans=False):
        if pid == torchrun_pid:
            continue
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if b"LOCAL_RANK" in env and env.get(b"TORCHELASTIC_RUN_ID") is not None:
            workers.setdefault(int(env[b"LOCAL_RANK"]), (pid, int(env.get(b"RANK", b"-1"))))
    return workers


def find_py_spy(explicit, python):
    if explicit:
        return explicit
    beside = os.path.join(os.path.dirname(python or ""), "py-spy")
    return beside if os.access(beside, os.X_OK) else shutil.which("py-spy")


def dump(py_spy, rank, dest):
    text = "# rank %s (local rank %s, pid %s)\n" % (rank["rank"], rank["local_rank"], rank["pid"])
    if not py_spy:
        text += "py-spy is not installed on this host; pip install py-spy to get stacks\n"
    else:
        proc = subprocess.run([py_spy, "dump", "--pid", str(rank["pid"])], capture_output=True,
                              text=True, timeout=60, check=False)
        text += proc.stdout + proc.stderr
    with open(dest, "w") as f:
        f.write(text)
    return dest


def run_state(p, pidfile):
    """The cheap part of a look: (state, async job record, exit record), from the run's files
    and /proc."""
    run_dir = p["run_dir"]
    exit_info = read_json(os.path.join(run_dir, EXITCODE))
    if not pidfile:
        job = read_json(os.path.join(p["async_dir"], p["async_jid"])) if p["async_jid"] else None
        return ("start_failed" if job and job.get("failed") else "pending"), job, None
    if exit_info:
        return "exited", None, exit_info
    if is_run_torchrun(pidfile["pid"], p["run_id"]):
        return "running", None, None
    if alive(pidfile["pid"]) and cmdline(pidfile["pid"]):
        return "pending", None, None  # forked but not yet exec'd: still the job's command line
    # torchrun ended, or is ending (an exiting process is alive for a moment after its command
    # line is gone): torchrun_job writes its exit code within a poll (0.5 s).
    deadline = time.monotonic() + 3
    while exit_info is None and time.monotonic() < deadline:
        time.sleep(0.1)
        exit_info = read_json(os.path.join(run_dir, EXITCODE))
    return ("exited" if exit_info else "vanished"), None, exit_info


def touch_lease(run_dir):
    if os.path.isdir(run_dir):
        lease = os.path.join(run_dir, LEASE)
        with open(lease, "a"):
            pass
        os.utime(lease)


def look(params):
    """The torchrun_watch module's answer (see its RETURN) for these parameters."""
    p = dict(DEFAULTS, **{k: v for k, v in params.items() if v is not None})
    p["run_dir"] = os.path.expanduser(p["run_dir"])
    p["async_dir"] = os.path.expanduser(p["async_dir"])
    run_dir = p["run_dir"]
    if p["touch_lease"]:
        touch_lease(run_dir)
    # Wait here for the state to change rather than in the controller's sleep: an exit is seen
    # within POLL_S instead of after the rest of the controller's interval.
    deadline = time.monotonic() + (0 if p["dump_stacks"] else float(p["wait_s"]))
    pidfile = read_json(os.path.join(run_dir, PIDFILE))
    state, job, exit_info = run_state(p, pidfile)
    initial = state
    while state == initial and state in ("pending", "running") and time.monotonic() < deadline:
        time.sleep(POLL_S)
        pidfile = pidfile or read_json(os.path.join(run_dir, PIDFILE))
        state, job, exit_info = run_state(p, pidfile)
    if p["touch_lease"] and p["wait_s"]:
        touch_lease(run_dir)

    now = time.time()
    result = dict(changed=False, state=state, rc=None, pid=None, elapsed_s=0.0, ranks=[],
                  root_cause=None, dumps=[], msg="")
    if state == "start_failed":
        result["msg"] = job.get("msg", "the job failed")[:1000]
    if pidfile:
        pid = pidfile["pid"]
        result.update(pid=pid, elapsed_s=round(now - pidfile["started"], 3))
        if exit_info:
            result.update(rc=exit_info["rc"],
                          elapsed_s=round(exit_info["ended"] - pidfile["started"], 3))
        workers = worker_pids(p["run_id"], pid) if state == "running" else {}
        for local_rank, rdir in rank_dirs(run_dir).items():
            logs = [os.path.join(rdir, n) for n in ("stdout.log", "stderr.log")]
            mtimes = [os.stat(f).st_mtime for f in logs if os.path.exists(f)]
            last = tail(logs[0], 1) or tail(logs[1], 1)
            pid_rank = workers.get(local_rank, (None, None))
            result["ranks"].append({
                "local_rank": local_rank, "pid": pid_rank[0], "rank": pid_rank[1],
                "alive": local_rank in workers, "last_line": last,
                "idle_s": round(now - max(mtimes), 3) if mtimes else None, "dir": rdir})
        if state == "exited" and result["rc"] != 0:
            result["root_cause"] = root_cause(tail(os.path.join(run_dir, TORCHRUN_LOG), 200,
                                                   1 << 20))
        if p["dump_stacks"]:
            py_spy = find_py_spy(p["py_spy"], pidfile["argv"][0] if pidfile.get("argv") else "")
            for rank in result["ranks"]:
                if rank["pid"]:
                    result["dumps"].append(dump(py_spy, rank,
                                                os.path.join(rank["dir"], STACK_DUMP)))
    return result
