# -*- coding: utf-8 -*-
"""Filter plugin: the hosts of a failed attempt whose stop and gather may wait (restart.py)."""
from __future__ import annotations

DOCUMENTATION = r"""
name: gather_later
short_description: The hosts of a failed attempt whose stop and gather may wait for the run's end
description:
  - From the attempt's record on the controller (its run_state.json), the hosts whose stop and
    gather a restart need not wait for; plugins/module_utils/run/restart.py's gather_later
    decides (after a host lost, the others whose agents stopped their ranks; the master once
    the record is final).
  - A record that cannot be read names none (every host is stopped and gathered at once).
author: torchfleet developers (@torchfleet)
options:
  _input:
    description: The path of the attempt's run_state.json on the controller.
    type: str
    required: true
  hosts:
    description: The attempt's hosts in rank order (the master first).
    type: list
    elements: str
    required: true
  lost:
    description: The hosts the master judged lost (the watch's C(lost)).
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: The hosts whose stop and gather waits for the run's end
  ansible.builtin.debug:
    msg: "{{ (launch_attempt_dir ~ '/run_state.json') | torchfleet.fleet.gather_later(launch_hosts, launch_watch.lost) }}"
"""

RETURN = r"""
_value:
  description: The hosts, in rank order.
  type: list
  elements: str
"""

from ansible_collections.torchfleet.fleet.plugins.module_utils.run.restart import gather_later
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import read_json


def _gather_later(state_file, hosts, lost):
    return gather_later(read_json(state_file) if state_file else None, list(hosts), list(lost))


class FilterModule:
    def filters(self):
        return {"gather_later": _gather_later}
