#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: torchrun_watch
short_description: Report the state of this host's torchrun and of each of its ranks
description:
  - Reads the run directory M(torchrun_job) keeps; says whether torchrun runs, how it ended,
    and for each local rank its last log line and how long its logs have been silent.
  - Touches the run's lease, which keeps the dead-man switch of M(torchrun_job) from firing.
  - With O(dump_stacks), writes every live rank's Python stack (C(py-spy dump)) into that rank's
    log directory, so a hang is diagnosed before it is stopped.
  - The action plugin of the same name calls this module in a loop on every host and stops
    all hosts as soon as one fails or hangs (fail-fast).
version_added: "0.1.0"
author: torchfleet developers
options:
  run_dir:
    description: This host's directory for the run.
    type: path
    required: true
  run_id:
    description: The run's id.
    type: str
    required: true
  async_jid:
    description: Job id of the async M(torchrun_job); a job that failed before starting torchrun
      (a missing script, say) is reported at once as state C(start_failed) with its message.
    type: str
  async_dir:
    description: Directory of Ansible's async job files on the host.
    type: path
    default: ~/.ansible_async
  wait_s:
    description: Wait on the host up to this many seconds for the state to change (pending to
      running, running to exited), looking every 0.2 s, and answer as soon as it does; 0 answers
      at once. The action plugin passes O(poll_s), so an exit is seen within 0.2 s.
    type: float
    default: 0
  touch_lease:
    description: Renew the lease.
    type: bool
    default: true
  dump_stacks:
    description: Dump every live rank's Python stack with py-spy first.
    type: bool
    default: false
  py_spy:
    description: Path of py-spy; looked up beside the run's Python and on PATH when unset.
    type: str
  abort_file:
    description: Action plugin only. Controller file shared by every host's watcher; the first
      failure is written there and makes every other watcher return.
    type: path
  poll_s:
    description: Action plugin only. Longest wait of one look (O(wait_s)); also how often each
      watcher reads the abort file.
    type: float
    default: 2
  hang_timeout_s:
    description: Action plugin only. Every rank silent this long is a hang.
    type: float
    default: 300
  job_timeout_s:
    description: Action plugin only. Longest run.
    type: float
    default: 86400
  start_grace_s:
    description: Action plugin only. Time torchrun has to start.
    type: float
    default: 60
  progress:
    description: Action plugin only. Print a progress line per look.
    type: bool
    default: false
  nranks_total:
    description: Action plugin only. World size, for the progress line.
    type: int
  progress_file:
    description: Action plugin only. Controller file to which every look appends one JSON line
      (host, elapsed_s, state, rc, outcome, ranks), for callers that follow a run live
      (the torchfleet Python API).
    type: path
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Look at the run once
  torchrun_watch:
    run_dir: ~/.torchfleet/runs/20261122-0301-ab12/node0
    run_id: 20261122-0301-ab12
  register: state
"""

RETURN = r"""
state:
  description: pending (not started yet), start_failed, running, exited, or vanished (no process,
    no exit code).
  returned: always
  type: str
rc:
  description: torchrun's exit code once it exited.
  returned: always
  type: int
pid:
  description: torchrun's PID.
  returned: always
  type: int
elapsed_s:
  description: Seconds since torchrun started.
  returned: always
  type: float
ranks:
  description: One entry per local rank of the latest attempt.
  returned: always
  type: list
  elements: dict
  sample: [{"local_rank": 0, "pid": 4242, "rank": 8, "alive": true, "last_line": "step 20/300 loss 0.3",
            "idle_s": 0.4, "dir": "/root/.torchfleet/runs/x/node0/logs/x_ab/attempt_0/0"}]
root_cause:
  description: The failed rank torchrun names as the first observed failure, once it exited.
  returned: always
  type: dict
  sample: {"rank": 1, "local_rank": 1, "exitcode": 3}
msg:
  description: Why the job failed to start, with state start_failed.
  returned: always
  type: str
dumps:
  description: Files written by py-spy, with O(dump_stacks).
  returned: always
  type: list
  elements: str
"""

import os
import shutil
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.torchfleet.procs import (
    alive, cmdline, is_run_torchrun, run_processes)
from ansible.module_utils.torchfleet.rundir import (
    EXITCODE, LEASE, PIDFILE, STACK_DUMP, TORCHRUN_LOG, rank_dirs, read_json, root_cause, tail)


# Seconds between two looks while the module waits for the state to change (wait_s).
POLL_S = 0.2


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


def main():
    module = AnsibleModule(
        argument_spec=dict(
            run_dir=dict(type="path", required=True),
            run_id=dict(type="str", required=True),
            touch_lease=dict(type="bool", default=True),
            async_jid=dict(type="str"),
            async_dir=dict(type="path", default="~/.ansible_async"),
            wait_s=dict(type="float", default=0),
            dump_stacks=dict(type="bool", default=False),
            py_spy=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    run_dir = p["run_dir"]
    if p["touch_lease"]:
        touch_lease(run_dir)
    # Wait here for the state to change rather than in the controller's sleep: an exit is seen
    # within POLL_S instead of after the rest of the controller's interval.
    deadline = time.monotonic() + (0 if p["dump_stacks"] else p["wait_s"])
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
    module.exit_json(**result)


if __name__ == "__main__":
    main()
