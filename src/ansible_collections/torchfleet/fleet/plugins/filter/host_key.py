# -*- coding: utf-8 -*-
"""Filter plugin: a host's key of the run's control channel, made on the controller."""
from __future__ import annotations

DOCUMENTATION = r"""
name: host_key
short_description: The key a host's agent signs the run's control messages with
description:
  - HMAC-SHA256 of the run's secret and the host's name, in hex. The master's agent holds the
    secret and derives every host's key from it; every other agent is handed only its own key,
    so a host of the run can report only as itself.
author: torchfleet developers (@torchfleet)
positional: host
options:
  _input:
    description: The run's secret.
    type: str
    required: true
  host:
    description: The host's inventory name.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: This host's key
  ansible.builtin.debug:
    msg: "{{ run_secret | torchfleet.fleet.host_key(inventory_hostname) }}"
"""

RETURN = r"""
_value:
  description: The key, 64 hex digits.
  type: str
"""

from ansible.module_utils.common.text.converters import to_bytes, to_text

from ansible_collections.torchfleet.fleet.plugins.module_utils.run.control import host_key


def _host_key(secret, host):
    return to_text(host_key(to_bytes(secret), to_text(host)))


class FilterModule:

    def filters(self):
        return {"host_key": _host_key}
