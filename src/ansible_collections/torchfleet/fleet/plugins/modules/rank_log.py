#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: rank_log
short_description: Read one rank's log on its host while the run goes on, in bounded chunks
description:
  - Reads torchrun's per-rank C(stdout.log) and C(stderr.log) of local rank O(local_rank) in the
    host's run directory O(run_dir) (its latest torchrun attempt), or in a gathered copy
    (runs/<id>/logs/<host>), from the byte offsets given, else their last O(tail) lines; at
    most O(max_bytes) per stream, whole lines only while the rank runs.
  - With O(wait_s), waits on the host up to that long for new bytes or the end of the host's
    part of the run, and answers as soon as either comes.
  - The action plugin of the same name follows the log (O(follow)) until the host's part of the
    run ends, printing each chunk and appending it to O(dest) on the controller.
version_added: "0.1.0"
author: torchfleet developers (@torchfleet)
options:
  run_dir:
    description: The host's directory of the run (remote_runs_root/<run_id>/<host>), or a gathered
      copy.
    type: path
    required: true
  local_rank:
    description: The rank's local rank on this host (rank modulo nproc_per_node).
    type: int
    required: true
  offsets:
    description: Byte offset of each stream (C(stdout), C(stderr)) to read on from, as the last
      answer gave them; a stream without one starts at its last O(tail) lines.
    type: dict
    default: {}
  tail:
    description: Lines to start with where no offset is given.
    type: int
    default: 50
  max_bytes:
    description: The most bytes read of one stream in one answer (at most 1 MiB).
    type: int
    default: 1048576
  wait_s:
    description: Wait up to this long for new bytes or the end; 0 answers at once.
    type: float
    default: 0
  follow:
    description: Action plugin only. Read on until the host's part of the run ends.
    type: bool
    default: false
  poll_s:
    description: Action plugin only. The wait of each read while following (O(wait_s)).
    type: float
    default: 5
  dest:
    description: Action plugin only. Controller file every chunk is appended to (the
      C(torchfleet logs) command follows it).
    type: path
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: The last 100 lines of local rank 2's log
  torchfleet.fleet.rank_log:
    run_dir: ~/.torchfleet/runs/20261126-101500-ab12/node0
    local_rank: 2
    tail: 100
  register: log
"""

RETURN = r"""
found:
  description: Whether the rank's log directory exists (torchrun made it).
  returned: always
  type: bool
ended:
  description: Whether the host's part of the run has ended (its exitcode.json is there).
  returned: always
  type: bool
missing:
  description: Whether O(run_dir) itself is missing (no such run on this host).
  returned: always
  type: bool
dir:
  description: The rank's log directory read.
  returned: always
  type: str
streams:
  description: Per stream (stdout, stderr), the text read and the offset to read on from.
  returned: always
  type: dict
  sample: {"stdout": {"text": "step 10/300 loss 0.2\n", "offset": 4096},
           "stderr": {"text": "", "offset": 0}}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.ranklog import ARGUMENT_SPEC, read


def main():
    spec = dict(ARGUMENT_SPEC, follow=dict(type="bool", default=False),
                poll_s=dict(type="float", default=5.0), dest=dict(type="path"))
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    module.exit_json(changed=False, **read(module.params))


if __name__ == "__main__":
    main()
