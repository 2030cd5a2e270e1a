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
    M(torchfleet.fleet.torchrun_job) that started the run (what C(async_status mode=cleanup) does), in the same
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
    description: Job id of the async M(torchfleet.fleet.torchrun_job) whose record to remove once the run is
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
guarded:
  description: The C(guarded) markers in the runs' host directories - a guard_ports table an agent
    did not remove itself (killed, or without root or passwordless sudo); stop.yml then removes
    the guard tables with become, and the markers.
  returned: always
  type: list
  elements: str
  sample: [/home/u/.torchfleet/runs/20261122-0301-ab12/node0/guarded]
async_removed:
  description: The async job record removed, with O(async_jid); null when there was none.
  returned: always
  type: str
  sample: /root/.ansible_async/j123456789.4242
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import STOP_SPEC
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.stop import stop_checked


def main():
    module = AnsibleModule(argument_spec=STOP_SPEC, supports_check_mode=True)
    module.exit_json(**stop_checked(module, module.params))


if __name__ == "__main__":
    main()
