# -*- coding: utf-8 -*-
"""Filter plugin: what attach needs of one host of a detached run."""
from __future__ import annotations

DOCUMENTATION = r"""
name: run_host
short_description: A host of a detached run as its record keeps it
description:
  - From one host's variables (C(hostvars[host])), its part of the record of a detached run
    (runs/<id>/run.json, M(torchfleet.fleet.run_record)) - the host's run directory, the job id
    of its agent's async task, and the variables that connect to it (ansible_host, ansible_user,
    ansible_ssh_private_key_file, ansible_ssh_common_args, ... and python; never a password).
author: torchfleet developers (@torchfleet)
options:
  _input:
    description: The host's variables.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: The record of every host of the run
  ansible.builtin.debug:
    msg: "{{ dict(launch_hosts | zip(launch_hosts | map('extract', hostvars) | map('torchfleet.fleet.run_host'))) }}"
"""

RETURN = r"""
_value:
  description: remote_dir, async_jid (empty when the start left none) and connection.
  type: dict
"""

from ansible_collections.torchfleet.fleet.plugins.module_utils.detach import CONNECTION


def _run_host(hostvars):
    job = hostvars.get("launch_job") or {}
    connection = {}
    for name in CONNECTION:
        if name in hostvars and hostvars[name] is not None:
            connection[name] = hostvars[name]
    return {"remote_dir": hostvars.get("launch_remote_dir", ""),
            "async_jid": job.get("ansible_job_id", "") if isinstance(job, dict) else "",
            "connection": connection}


class FilterModule:

    def filters(self):
        return {"run_host": _run_host}
