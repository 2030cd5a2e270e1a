#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: run_record
short_description: The record of a detached torchfleet run on the controller, and its attach lock
description:
  - With O(state=present), writes O(runs_root)/O(run_id)/run.json (mode 0600) from O(record) - what
    the controller knew when the run was detached (its hosts with their directories, async jobs
    and connection variables, its master, settings, attempts and preflight result) - so that
    attach, status, logs and stop find the run by its id alone.
  - With O(state=attached), reads and checks that record and takes the attach lock
    (run.json's directory, attach.lock, holding the PID of the ansible-playbook that owns the
    run's gather, restarts and report); it fails with one sentence for an id that names no run,
    a run that was not detached, a record torchfleet did not write, or a run whose hosts
    O(inventory_hosts) does not hold. Where another live process holds the lock, RV(followed_by)
    names it. A run gathered already is answered with its report (RV(reported)) and no lock.
  - With O(state=followed), follows a run whose lock another live process holds - showing that
    owner's progress (runs/ID/progress.jsonl, from now on) - until the owner has written the
    run's report (RV(reported), RV(report)), or is gone - then the lock is taken here and the
    record read again (RV(followed_by) is 0), and the caller carries on as the owner.
  - With O(state=read), reads and checks the record without a lock, and answers where the log
    of O(rank) (or of O(host)'s first rank; rank 0 when neither is given) is - status and logs.
  - With O(state=released), removes the attach lock if this ansible-playbook holds it.
  - Meant to run on the controller; an action plugin of the same name runs it in-process there.
version_added: "0.1.0"
author: torchfleet developers (@torchfleet)
options:
  state:
    description: What to do with the record.
    type: str
    choices: [present, attached, followed, read, released]
    default: attached
  run_id:
    description: The run's id.
    type: str
    required: true
  runs_root:
    description: The controller's directory of runs (runs/).
    type: path
    required: true
  record:
    description: With O(state=present), the record to write.
    type: dict
    default: {}
  inventory_hosts:
    description: With O(state=attached), the hosts of the inventory the user gave; every host of
      the run must be among them. Empty when no inventory was given (the record's hosts are used).
    type: list
    elements: str
    default: []
  stop:
    description: With O(state=attached), the caller stops the run (stop.yml); where a live attach
      holds the lock (RV(followed_by)), that attach gathers the run.
    type: bool
    default: false
  rank:
    description: With O(state=read), the rank whose log is asked for.
    type: int
  host:
    description: With O(state=read), the host whose log is asked for (its first rank unless
      O(rank) is given too).
    type: str
  owner_pid:
    description: The process holding the lock; ansible-playbook's (the action's parent) when unset.
    type: int
attributes:
  check_mode:
    support: none
    details: It writes on the controller.
  diff_mode:
    support: none
  platform:
    platforms: posix
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: Read the run's record and take the attach lock
  torchfleet.fleet.run_record:
    run_id: 20261126-101500-ab12
    runs_root: runs
  register: attached

- name: Let the next attach in
  torchfleet.fleet.run_record:
    state: released
    run_id: 20261126-101500-ab12
    runs_root: runs
"""

RETURN = r"""
file:
  description: The record's path (the lock's with O(state=released)).
  returned: always
  type: str
  sample: runs/20261126-101500-ab12/run.json
record:
  description: The run's record, with O(state=attached) or O(state=read); empty otherwise.
  returned: always
  type: dict
  sample: {"version": 1, "run_id": "20261126-101500-ab12", "kind": "train", "master": "node0",
           "hosts": {"node0": {"remote_dir": "~/.torchfleet/runs/20261126-101500-ab12/node0",
                               "async_jid": "j1234.42", "connection": {"ansible_host": "10.0.0.1"}}}}
reported:
  description: With O(state=attached) or O(state=read), the run's report (train.json or
    collective.json) when the run was gathered already (no lock is taken then); empty otherwise.
  returned: with O(state=attached), O(state=followed) or O(state=read)
  type: str
followed_by:
  description: The PID of the live attach that holds the lock (it gathers and reports the
    run); 0 when the lock was taken here.
  returned: with O(state=attached) or O(state=followed)
  type: int
report:
  description: With O(state=followed), the report the owner wrote - whether the run succeeded
    and its verdict.
  returned: with O(state=followed) when RV(reported) is set
  type: dict
  sample: {"ok": false, "verdict": "train failed: first failure on node2, rank 4: ..."}
place:
  description: With O(state=read), where the rank's log is.
  returned: with O(state=read)
  type: dict
  sample: {"host": "node1", "local_rank": 0, "rank": 2}
released:
  description: Whether the lock was removed, with O(state=released).
  returned: with O(state=released)
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.detach import ARGUMENT_SPEC, decide


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=False)
    try:
        module.exit_json(changed=False, **decide(module.params))
    except ValueError as exc:
        module.fail_json(msg=str(exc))


if __name__ == "__main__":
    main()
