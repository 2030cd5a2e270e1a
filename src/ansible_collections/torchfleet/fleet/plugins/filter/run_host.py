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
    ansible_ssh_private_key_file, ansible_ssh_common_args, ... and python; never a password),
    and the public variables the host has (C(settings)); a restart started from the record
    (attach.yml) resolves the run's settings from them as the launch did.
author: torchfleet developers (@torchfleet)
options:
  _input:
    description: The host's variables.
    type: dict
    required: true
  run_settings:
    description:
      - The run's settings (the controller's); the host's C(settings) then keep only what differs.
    type: dict
"""

EXAMPLES = r"""
- name: The record of every host of the run
  ansible.builtin.debug:
    msg: "{{ dict(launch_hosts | zip(launch_hosts | map('extract', hostvars) | map('torchfleet.fleet.run_host'))) }}"
"""

RETURN = r"""
_value:
  description: remote_dir, async_jid (empty when the start left none), connection and settings.
  type: dict
"""

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.detach import CONNECTION, SETTINGS


def _run_host(hostvars, run_settings=None):
    job = hostvars.get("launch_job") or {}
    connection = {}
    for name in CONNECTION:
        if name in hostvars and hostvars[name] is not None:
            connection[name] = hostvars[name]
    # The interpreter Ansible found there, where none was set: a later play's inventory (a host
    # of the same name in ansible.cfg's default) must not choose it.
    facts = hostvars.get("ansible_facts")
    found = facts.get("discovered_interpreter_python") if isinstance(facts, dict) else None
    if "ansible_python_interpreter" not in connection and isinstance(found, str) and found:
        connection["ansible_python_interpreter"] = found
    # The public variables this host has; in a play that continues the run from its record (an
    # attach's restart), the recorded ones first.
    recorded = hostvars.get(SETTINGS)
    recorded = recorded if isinstance(recorded, dict) else {}
    settings = {name: recorded[name] if name in recorded else hostvars[name]
                for name in defaults.BY_NAME if name in recorded or name in hostvars}
    if isinstance(run_settings, dict):  # a host keeps what differs from the run's
        settings = {k: v for k, v in settings.items() if run_settings.get(k) != v}
    else:  # the run's: every variable, defaults included, so that nothing of the inventory a
        # later play loads (ansible.cfg's default may name the same hosts) stands in for one
        settings = {name: settings.get(name, defaults.default(name)) for name in defaults.BY_NAME}
    return {"remote_dir": hostvars.get("launch_remote_dir", ""),
            "async_jid": job.get("ansible_job_id", "") if isinstance(job, dict) else "",
            "connection": connection, "settings": settings}


class FilterModule:

    def filters(self):
        return {"run_host": _run_host}
