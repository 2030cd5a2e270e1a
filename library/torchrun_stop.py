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
  - Stopping a run that is not running changes nothing.
version_added: "0.1.0"
author: torchfleet developers
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
"""

RETURN = r"""
stopped:
  description: One entry per run that had live processes.
  returned: always
  type: list
  elements: dict
  sample: [{"run_id": "20261122-0301-ab12", "pid": 4242, "signalled": [4242], "killed": [4250]}]
"""

import glob
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.torchfleet.procs import run_processes, stop_run
from ansible.module_utils.torchfleet.rundir import PIDFILE, read_json


def main():
    module = AnsibleModule(
        argument_spec=dict(
            runs_root=dict(type="path", required=True),
            run_id=dict(type="str"),
            host_dir=dict(type="str"),
            grace_s=dict(type="float", default=10),
        ),
        supports_check_mode=True,
    )
    p = module.params
    pattern = os.path.join(p["runs_root"], p["run_id"] or "*", p["host_dir"] or "*", PIDFILE)
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
    module.exit_json(changed=bool(stopped), stopped=stopped)


if __name__ == "__main__":
    main()
