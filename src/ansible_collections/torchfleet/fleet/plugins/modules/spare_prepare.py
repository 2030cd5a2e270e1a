#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: spare_prepare
short_description: Import torch on a spare host while the run trains, so a restart that takes it starts warm
description:
  - Starts one Python process on the host, detached from the task, at the lowest CPU priority
    and in the idle I/O class (C(ionice -c 3) where it exists), in C(/) with the run's O(env),
    that imports O(imports) and exits; the module returns at once. A spare's
    first import of torch is cold (preflight reads torch's version from its files and never
    imports it, and on a GPU host torch is several GB of CUDA libraries), while every survivor of a failed
    attempt has torch in its page cache, so without this the replacement's import would set the
    pace of the restarted rendezvous.
  - The process writes what it did to O(path) (JSON, replaced atomically) - its PID when it
    starts, then whether the imports succeeded, the error when not, and the seconds they took -
    and bounds itself with O(timeout_s) (SIGALRM, whose default action ends it).
  - Best effort, never a failure of the run; a missing interpreter or a directory that cannot be
    made is RV(prepared=false) with a message, and the restart's re-check probes the spare anyway.
version_added: "0.1.0"
author: torchfleet developers (@torchfleet)
options:
  python:
    description: The interpreter the run's ranks use on this host (its preflight probe's).
    type: path
    required: true
  path:
    description: Where the process writes its record (the spare's directory of the run).
    type: path
    required: true
  imports:
    description: Modules to import, in order.
    type: list
    elements: str
    default: [torch, torch.distributed]
  env:
    description: The environment the run's ranks get on top of the host's (the public variable
      C(env)), so the imports find what the ranks will (PYTHONPATH, LD_LIBRARY_PATH).
    type: dict
    default: {}
  timeout_s:
    description: The process ends itself after this many seconds, done or not.
    type: int
    default: 300
attributes:
  check_mode:
    support: full
    details: In check mode nothing is started.
  diff_mode:
    support: none
  platform:
    platforms: posix
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: Import torch on the spare, detached
  torchfleet.fleet.spare_prepare:
    python: /opt/venv/bin/python
    path: ~/.torchfleet/runs/20261128-101500-ab12/node5/spare_prepare_0.json
"""

RETURN = r"""
prepared:
  description: Whether the process was started.
  returned: always
  type: bool
  sample: true
pid:
  description: The process's PID; null when none was started.
  returned: always
  type: int
  sample: 4242
record:
  description: Its record's path, O(path) expanded.
  returned: always
  type: str
  sample: /home/u/.torchfleet/runs/20261128-101500-ab12/node5/spare_prepare_0.json
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.spare import prepare


def main():
    module = AnsibleModule(argument_spec=dict(
        python=dict(type="path", required=True),
        path=dict(type="path", required=True),
        imports=dict(type="list", elements="str", default=["torch", "torch.distributed"]),
        env=dict(type="dict", default={}),
        timeout_s=dict(type="int", default=300),
    ), supports_check_mode=True)
    p = module.params
    path = os.path.abspath(p["path"])
    if p["timeout_s"] < 1:
        module.fail_json(msg="timeout_s must be at least 1 (it is %s)" % p["timeout_s"])
    if module.check_mode:
        module.exit_json(changed=False, prepared=False, pid=None, record=path)
    pid, why = prepare(p["python"], path, p["imports"], p["timeout_s"], p["env"])
    if pid is None:
        module.exit_json(changed=False, prepared=False, pid=None, record=path, msg=why)
    module.exit_json(changed=True, prepared=True, pid=pid, record=path)


if __name__ == "__main__":
    main()
