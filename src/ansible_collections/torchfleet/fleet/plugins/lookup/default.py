# -*- coding: utf-8 -*-
"""Lookup plugin: a public variable's value, else its one default (plugins/module_utils/defaults.py)."""
from __future__ import annotations

DOCUMENTATION = r"""
name: default
short_description: A torchfleet variable's value, or its default from the one home of defaults
description:
  - For a public variable (nnodes, master_port, lost_after_s, ...) in a play that continues a
    detached run from its record (C(torchfleet_run_settings), set by attach.yml for a restart),
    the value the run was started with; else its value when the play has it (C(-e),
    group_vars, inventory), else its default, written once in the collection's
    C(plugins/module_utils/defaults.py), else the O(default) given here (a default computed
    where the variable is used).
  - For a timing of the control plane (lease_s, poll_s, stop_grace_s, ...), its value there.
  - Roles read every default through this lookup instead of writing it again.
author: torchfleet developers (@torchfleet)
options:
  _terms:
    description: One variable or timing name.
    required: true
    type: list
    elements: str
  default:
    description: The value of a variable with no default of its own (nnodes, join_timeout_s, control_port) when it is unset.
    type: raw
"""

EXAMPLES = r"""
- name: The master port asked for, or 29500
  ansible.builtin.debug:
    msg: "{{ lookup('torchfleet.fleet.default', 'master_port') }}"
"""

RETURN = r"""
_raw:
  description: The value (one per term).
  type: list
  elements: raw
"""

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.detach import SETTINGS


class LookupModule(LookupBase):

    def run(self, terms, variables=None, **kwargs):
        variables = variables or {}
        # attach.yml restarting a detached run: the settings its launch resolved (run.json).
        recorded = self._templar.template(variables[SETTINGS]) if SETTINGS in variables else {}
        if not isinstance(recorded, dict):
            recorded = {}
        out = []
        for name in terms:
            if name in defaults.BY_NAME:
                if name in recorded:  # the run's own settings, whatever the play has now
                    value = recorded[name]
                elif name in variables:
                    value = self._templar.template(variables[name])
                else:
                    value = defaults.default(name)
                out.append(kwargs.get("default") if value is None else value)
            elif name in defaults.TIMINGS:
                out.append(defaults.TIMINGS[name])
            else:
                raise AnsibleError("%s is neither a public variable nor a timing of torchfleet "
                                   "(plugins/module_utils/defaults.py)" % name)
        return out
