#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: torchrun_job
short_description: Run torchrun on this host for one torchfleet run, as an async task
description:
  - Starts C(python -m torch.distributed.run) with c10d rendezvous at O(master_addr):O(master_port),
    the run's id as rendezvous id, O(local_addr) as C(--local-addr), per-rank log files under
    O(run_dir)/logs and the given environment, then waits for it and records its exit code.
  - The command is built as an argument list; no value is ever interpolated into a shell.
  - torchrun's PID is written to O(run_dir)/torchrun.pid and its exit to O(run_dir)/exitcode.json.
  - Meant to run with C(async) longer than the job and C(poll: 0); M(torchrun_watch) follows it.
  - Dead-man switch; when nothing has touched O(run_dir)/lease for O(lease_s) seconds (the
    controller was interrupted or lost this host), the run is stopped, so no torchrun outlives
    the play that started it.
version_added: "0.1.0"
author: torchfleet developers
options:
  run_dir:
    description: This host's directory for the run; created with mode 0700.
    type: path
    required: true
  run_id:
    description: The run's id; rendezvous id and TORCHFLEET_RUN_ID of every process.
    type: str
    required: true
  python:
    description: Interpreter with torch.
    type: str
    required: true
  script:
    description: The training script; relative paths are taken from O(run_dir) (for shipped O(files)).
    type: str
    required: true
  script_args:
    description: Arguments for the script, passed verbatim.
    type: list
    elements: str
    default: []
  files:
    description: Files to write into O(run_dir) first (name to content), such as a built-in workload.
    type: dict
    default: {}
  chdir:
    description: Working directory of torchrun; O(run_dir) when unset.
    type: path
  nnodes:
    description: Number of nodes.
    type: int
    required: true
  nproc_per_node:
    description: Processes on this node.
    type: int
    required: true
  master_addr:
    description: Rendezvous host.
    type: str
    required: true
  master_port:
    description: Rendezvous port.
    type: int
    required: true
  local_addr:
    description: This host's address on the chosen NIC, never a name that may resolve to loopback.
    type: str
    required: true
  join_timeout_s:
    description: How long the rendezvous waits for every node.
    type: int
    default: 60
  max_restarts:
    description: torchrun C(--max-restarts).
    type: int
    default: 0
  env:
    description: Environment for torchrun and every rank (NCCL_SOCKET_IFNAME, the user's env, ...).
    type: dict
    default: {}
  lease_s:
    description: Stop the run when O(run_dir)/lease is older than this. 0 turns the switch off.
    type: float
    default: 30
attributes:
  check_mode:
    support: none
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Start torchrun
  torchrun_job:
    run_dir: ~/.torchfleet/runs/20261122-0301-ab12/node0
    run_id: 20261122-0301-ab12
    python: /opt/venv/bin/python
    script: /srv/code/train.py
    script_args: [--epochs, "3"]
    nnodes: 2
    nproc_per_node: 8
    master_addr: 10.0.0.1
    master_port: 29500
    local_addr: 10.0.0.1
    env:
      NCCL_SOCKET_IFNAME: eth0
  async: 86400
  poll: 0
  register: job
"""

RETURN = r"""
rc:
  description: torchrun's exit code (negative for a signal).
  returned: always
  type: int
pid:
  description: torchrun's PID.
  returned: always
  type: int
reason:
  description: Why it ended; exited, or lease when the dead-man switch stopped it.
  returned: always
  type: str
duration_s:
  description: Seconds torchrun ran.
  returned: always
  type: float
argv:
  description: The command that ran.
  returned: always
  type: list
  elements: str
"""

import os
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.torchfleet.procs import HOST_ENV, RUN_ID_ENV, stop_run
from ansible.module_utils.torchfleet.rundir import (
    EXITCODE, LEASE, LOGS, PIDFILE, RESULTS, TORCHRUN_LOG, write_json)

POLL_S = 0.5


def torchrun_argv(p, script):
    return [
        p["python"], "-m", "torch.distributed.run",
        "--nnodes", str(p["nnodes"]),
        "--nproc-per-node", str(p["nproc_per_node"]),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "%s:%d" % (p["master_addr"], p["master_port"]),
        "--rdzv-id", p["run_id"],
        "--rdzv-conf", "join_timeout=%d" % p["join_timeout_s"],
        "--local-addr", p["local_addr"],
        "--max-restarts", str(p["max_restarts"]),
        "--log-dir", os.path.join(p["run_dir"], LOGS),
        "--redirects", "3",
        script, *p["script_args"],
    ]


def main():
    module = AnsibleModule(
        argument_spec=dict(
            run_dir=dict(type="path", required=True),
            run_id=dict(type="str", required=True),
            python=dict(type="str", required=True),
            script=dict(type="str", required=True),
            script_args=dict(type="list", elements="str", default=[]),
            files=dict(type="dict", default={}),
            chdir=dict(type="path"),
            nnodes=dict(type="int", required=True),
            nproc_per_node=dict(type="int", required=True),
            master_addr=dict(type="str", required=True),
            master_port=dict(type="int", required=True),
            local_addr=dict(type="str", required=True),
            join_timeout_s=dict(type="int", default=60),
            max_restarts=dict(type="int", default=0),
            env=dict(type="dict", default={}),
            lease_s=dict(type="float", default=30),
        ),
        supports_check_mode=False,
    )
    p = module.params
    run_dir = p["run_dir"]
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    os.chmod(run_dir, 0o700)
    for name, content in p["files"].items():
        if os.sep in name or name.startswith("."):
            module.fail_json(msg="file name %r must be a plain name" % name)
        fd = os.open(os.path.join(run_dir, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(content)
    script = p["script"] if os.path.isabs(p["script"]) else os.path.join(run_dir, p["script"])
    if not os.path.isfile(script):
        module.fail_json(msg="script %s does not exist on this host; copy it there or fix "
                             "`script`" % script)
    env = dict(os.environ)
    env.update({k: str(v) for k, v in p["env"].items()})
    env.update({RUN_ID_ENV: p["run_id"], "TORCHFLEET_OUT_DIR": os.path.join(run_dir, RESULTS),
                "PYTHONUNBUFFERED": "1"})
    argv = torchrun_argv(p, script)
    open(os.path.join(run_dir, LEASE), "a").close()
    started = time.time()
    with open(os.path.join(run_dir, TORCHRUN_LOG), "ab") as log:
        # Own session: Ansible's async timeout kills the wrapper's process group, not the run;
        # the run is stopped by its recorded PID (torchrun_stop) or the lease below.
        proc = subprocess.Popen(argv, cwd=p["chdir"] or run_dir, env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    host = env.get(HOST_ENV)
    write_json(os.path.join(run_dir, PIDFILE), {"pid": proc.pid, "run_id": p["run_id"],
                                                "host": host, "argv": argv, "started": started})
    reason = "exited"
    while proc.poll() is None:
        time.sleep(POLL_S)
        if p["lease_s"] > 0:
            try:
                age = time.time() - os.stat(os.path.join(run_dir, LEASE)).st_mtime
            except OSError:
                age = 0.0
            if age > p["lease_s"]:
                reason = "lease"
                stop_run(p["run_id"], proc.pid, grace_s=10, host=host)
    rc = proc.wait()
    ended = time.time()
    write_json(os.path.join(run_dir, EXITCODE), {"rc": rc, "reason": reason, "ended": ended})
    module.exit_json(changed=True, rc=rc, pid=proc.pid, reason=reason,
                     duration_s=round(ended - started, 3), argv=argv)


if __name__ == "__main__":
    main()
