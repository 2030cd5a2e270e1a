#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: torchrun_stop
short_description: Stop torchfleet runs on this host by their recorded PIDs
description:
  - For each run directory under O(runs_root) (or only O(run_id)'s), signals the recorded
    torchrun PID with SIGTERM (torchrun forwards it to its workers), waits O(grace_s), then
    SIGKILLs whatever of the run is left, workers orphaned by a killed torchrun included.
  - Signals only processes that belong to the run; its torchrun's command line carries the run
    id and every worker's environment carries TORCHFLEET_RUN_ID, so a recycled PID or another
    user's job is never touched. Never C(pkill -f) by name.
  - With O(async_jid), then removes the record Ansible's async wrapper keeps of the
    M(torchrun_job) that started the run (what C(async_status mode=cleanup) does), in the same
    call.
  - Stopping a run that is not running changes nothing.
version_added: "0.1.0"
author: torchfleet developers (@torchfleet)
options:
  runs_root:
    description: Directory holding this host's run directories (C(<run_id>/<host>/)).
    type: path
    required: true
  run_id:
    description: Stop only this run; every run under O(runs_root) when unset.
    type: str
  host_dir:
    description: Only run directories of this inventory host (several inventory hosts may share a machine).
    type: str
  grace_s:
    description: Seconds between SIGTERM and SIGKILL.
    type: float
    default: 10
  async_jid:
    description: Job id of the async M(torchrun_job) whose record to remove once the run is
      stopped. The record is removed after the async wrapper wrote its final result (waiting up
      to 5 s for it), so it is not written again afterwards.
    type: str
  async_dir:
    description: Directory of Ansible's async job records on the host.
    type: path
    default: ~/.ansible_async
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Stop every run of torchfleet on this host
  torchrun_stop:
    runs_root: ~/.torchfleet/runs

- name: Stop one run
  torchrun_stop:
    runs_root: ~/.torchfleet/runs
    run_id: 20261122-0301-ab12
    grace_s: 5

- name: Stop what is left of this host's part of a run, then remove its async job record
  torchrun_stop:
    runs_root: ~/.torchfleet/runs
    run_id: "{{ run_id }}"
    host_dir: "{{ inventory_hostname }}"
    async_jid: "{{ launch_job.ansible_job_id }}"
"""

RETURN = r"""
stopped:
  description: One entry per run that had live processes.
  returned: always
  type: list
  elements: dict
  sample: [{"run_id": "20261122-0301-ab12", "pid": 4242, "signalled": [4242], "killed": [4250]}]
async_removed:
  description: The async job record removed, with O(async_jid); null when there was none.
  returned: always
  type: str
  sample: /root/.ansible_async/j123456789.4242
"""

import glob
import os
import re
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.torchfleet.procs import run_processes, stop_run
from ansible.module_utils.torchfleet.rundir import PIDFILE, RUN_ID, read_json


# Ansible's job ids: "j" + digits + "." + PID; never a path.
JID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def argument_error(p):
    """One sentence for the first argument that could reach beyond this run, or None. Checked
    before anything is signalled: a pattern or a path here would widen what is stopped."""
    if p["run_id"] is not None and not RUN_ID.match(p["run_id"]):
        return ("run_id %r is not a torchfleet run id (letters, digits, '.', '_', '-'); nothing "
                "was stopped" % p["run_id"])
    if p["host_dir"] is not None and (p["host_dir"] in ("", ".", "..") or "/" in p["host_dir"]):
        return ("host_dir %r is not an inventory host's directory name; nothing was stopped"
                % p["host_dir"])
    if p["grace_s"] < 0:
        return "grace_s must be 0 or more seconds, not %s; nothing was stopped" % p["grace_s"]
    if p["async_jid"] and not JID.match(p["async_jid"]):
        return ("async_jid %r is not an Ansible async job id (like j123456789.4242); nothing "
                "was stopped" % p["async_jid"])
    return None


def remove_async_record(path, wait_s=5.0):
    """Remove the async wrapper's record once it holds the job's final result: the wrapper
    rewrites it when torchrun_job returns, which is just after torchrun ended or was stopped."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        record = read_json(path)
        if record is None and not os.path.exists(path):
            return None
        if record is not None and record.get("finished") is not False:
            break
        time.sleep(0.1)
    try:
        os.unlink(path)
    except FileNotFoundError:
        return None
    return path


def main():
    module = AnsibleModule(
        argument_spec=dict(
            runs_root=dict(type="path", required=True),
            run_id=dict(type="str"),
            host_dir=dict(type="str"),
            grace_s=dict(type="float", default=10),
            async_jid=dict(type="str"),
            async_dir=dict(type="path", default="~/.ansible_async"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    error = argument_error(p)
    if error:
        module.fail_json(msg=error)
    pattern = os.path.join(glob.escape(p["runs_root"]), p["run_id"] or "*",
                           glob.escape(p["host_dir"]) if p["host_dir"] else "*", PIDFILE)
    stopped = []
    for pidfile in sorted(glob.glob(pattern)):
        record = read_json(pidfile)
        if not record:
            continue
        live = run_processes(record["run_id"], record["pid"], record.get("host"))
        if not live:
            continue
        entry = {"run_id": record["run_id"], "pid": record["pid"], "processes": live}
        if not module.check_mode:
            entry.update(stop_run(record["run_id"], record["pid"], p["grace_s"],
                                  record.get("host")))
        stopped.append(entry)
    removed = None
    if p["async_jid"] and not module.check_mode:
        removed = remove_async_record(os.path.join(p["async_dir"], p["async_jid"]))
    module.exit_json(changed=bool(stopped) or bool(removed), stopped=stopped,
                     async_removed=removed)


if __name__ == "__main__":
    main()
