# -*- coding: utf-8 -*-
"""Lookup plugin: a public variable's value, else its one default (plugins/module_utils/defaults.py)."""
from __future__ import annotations

DOCUMENTATION = r"""
name: default
short_description: A torchfleet variable's value, or its default from the one home of defaults
description:
  - For a public variable (nnodes, master_port, lost_after_s, ...), its value when the play has
    it (C(-e), group_vars, inventory), else its default, written once in the collection's
    C(plugins/module_utils/defaults.py).
  - For a timing of the control plane (lease_s, poll_s, stop_grace_s, ...), its value there.
  - Roles read every default through this lookup instead of writing it again.
author: torchfleet developers (@torchfleet)
options:
  _terms:
    description: One variable or timing name.
    required: true
    type: list
    elements: str
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


class LookupModule(LookupBase):

    def run(self, terms, variables=None, **kwargs):
        out = []
        for name in terms:
            if name in defaults.BY_NAME:
                if variables is not None and name in variables:
                    out.append(self._templar.template(variables[name]))
                else:
                    out.append(defaults.default(name))
            elif name in defaults.TIMINGS:
                out.append(defaults.TIMINGS[name])
            else:
                raise AnsibleError("%s is neither a public variable nor a timing of torchfleet "
                                   "(plugins/module_utils/defaults.py)" % name)
        return out
