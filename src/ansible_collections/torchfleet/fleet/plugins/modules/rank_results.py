#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: rank_results
short_description: Read every rank's result and logs of one run on this host
description:
  - Returns the JSON result each rank wrote (C(results/rank-*.json)), and the run's log files
    (torchrun's own log, each rank's stdout/stderr, py-spy stack dumps) with their contents.
  - The action plugin of the same name writes those files under O(dest)/<host>/ on the
    controller and returns the results without the file contents.
  - A rank that wrote no result is not invented; the aggregation names it as missing.
  - With O(stop), first stops what is left of the run on this host exactly as M(torchfleet.fleet.torchrun_stop)
    does with the same arguments, so the play's end costs one module run per host, not two.
    A stop argument that could reach beyond the run fails the task before anything is
    signalled or read.
version_added: "0.1.0"
author: torchfleet developers (@torchfleet)
options:
  run_dir:
    description: This host's directory for the run.
    type: path
    required: true
  max_log_bytes:
    description: Keep at most the last this many bytes of each log file.
    type: int
    default: 1048576
  dest:
    description: Controller directory for the files (used by the action plugin).
    type: str
  stop:
    description: Stop the run on this host first; the options of M(torchfleet.fleet.torchrun_stop).
    type: dict
    suboptions:
      runs_root:
        description: Directory holding this host's run directories (C(<run_id>/<host>/)).
        type: path
        required: true
      run_id:
        description: Stop only this run; every run under O(stop.runs_root) when unset.
        type: str
      host_dir:
        description: Only run directories of this inventory host.
        type: str
      grace_s:
        description: Seconds between SIGTERM and SIGKILL.
        type: float
        default: 10
      async_jid:
        description: Job id of the async M(torchfleet.fleet.torchrun_job) whose record to remove once the run
          is stopped.
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
    details: Without O(stop) it only reads the host. In check mode O(stop) signals nothing (it
      lists what it would stop) and the action plugin writes no file on the controller.
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Bring every rank's results and logs back
  rank_results:
    run_dir: ~/.torchfleet/runs/20261122-0301-ab12/node0
    dest: runs/20261122-0301-ab12/logs
  register: ranks

- name: Stop what is left of this host's part of a run, then bring its results and logs back
  rank_results:
    run_dir: "~/.torchfleet/runs/{{ run_id }}/{{ inventory_hostname }}"
    dest: "runs/{{ run_id }}/logs"
    stop:
      runs_root: ~/.torchfleet/runs
      run_id: "{{ run_id }}"
      host_dir: "{{ inventory_hostname }}"
      async_jid: "{{ launch_job.ansible_job_id }}"
"""

RETURN = r"""
results:
  description: Each rank's JSON result, ordered by rank.
  returned: always
  type: list
  elements: dict
files:
  description: Log files (path relative to the run directory, base64 content, size, truncated).
  returned: always
  type: list
  elements: dict
stopped:
  description: With O(stop), what was stopped (M(torchfleet.fleet.torchrun_stop)'s C(stopped)).
  returned: when stop is given
  type: list
  elements: dict
  sample: [{"run_id": "20261122-0301-ab12", "pid": 4242, "signalled": [4242], "killed": []}]
async_removed:
  description: With O(stop) and its async_jid, the async job record removed; null when none.
  returned: when stop is given
  type: str
guarded:
  description: With O(stop), the markers of guard tables still up (M(torchfleet.fleet.torchrun_stop)'s
    C(guarded)).
  returned: when stop is given
  type: list
  elements: str
"""

import base64
import glob
import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import (
    EXITCODE, LOGS, RANK_RESULTS_SPEC, RESULTS, TORCHRUN_LOG, tail_bytes)
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.stop import stop_checked


def main():
    module = AnsibleModule(argument_spec=RANK_RESULTS_SPEC, supports_check_mode=True)
    p = module.params
    run_dir = p["run_dir"]
    # Stopped before reading: a rank still writing would leave a cut log behind.
    done = stop_checked(module, p["stop"]) if p["stop"] else {"changed": False}
    results = []
    for path in sorted(glob.glob(os.path.join(run_dir, RESULTS, "rank-*.json"))):
        try:
            with open(path) as f:
                results.append(json.load(f))
        except (OSError, ValueError) as exc:
            module.warn("unreadable result %s: %s" % (path, exc))
    files = []
    logs = [os.path.join(run_dir, TORCHRUN_LOG), os.path.join(run_dir, EXITCODE)]
    logs += sorted(glob.glob(os.path.join(run_dir, LOGS, "**", "*"), recursive=True))
    for path in logs:
        if not os.path.isfile(path):
            continue
        data, size = tail_bytes(path, p["max_log_bytes"])
        rel = os.path.relpath(path, run_dir)
        if rel.startswith(LOGS + os.sep):  # logs/<rdzv id>_<suffix>/attempt_0/0/stdout.log
            rel = rel.split(os.sep, 2)[2]  # -> attempt_0/0/stdout.log
        files.append({"path": rel,
                      "content": base64.b64encode(data).decode("ascii"),
                      "size": size, "truncated": size > len(data)})
    results.sort(key=lambda r: r.get("rank", 0))
    module.exit_json(results=results, files=files, **done)


if __name__ == "__main__":
    main()
