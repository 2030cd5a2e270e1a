#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: torchrun_watch
short_description: Report the state of this host's torchrun and of each of its ranks
description:
  - Reads the run directory M(torchrun_job) keeps; says whether torchrun runs, how it ended,
    and for each local rank its last log line and how long its logs have been silent.
  - Touches the run's lease, which keeps the dead-man switch of M(torchrun_job) from firing.
  - With O(dump_stacks), writes every live rank's Python stack (C(py-spy dump)) into that rank's
    log directory, so a hang is diagnosed before it is stopped.
  - The action plugin of the same name calls this module in a loop on every host and stops
    all hosts as soon as one fails or hangs (fail-fast).
version_added: "0.1.0"
author: torchfleet developers
options:
  run_dir:
    description: This host's directory for the run.
    type: path
    required: true
  run_id:
    description: The run's id.
    type: str
    required: true
  async_jid:
    description: Job id of the async M(torchrun_job); a job that failed before starting torchrun
      (a missing script, say) is reported at once as state C(start_failed) with its message.
    type: str
  async_dir:
    description: Directory of Ansible's async job files on the host.
    type: path
    default: ~/.ansible_async
  wait_s:
    description: Wait on the host up to this many seconds for the state to change (pending to
      running, running to exited), looking every 0.2 s, and answer as soon as it does; 0 answers
      at once. The action plugin passes O(poll_s), so an exit is seen within 0.2 s.
    type: float
    default: 0
  touch_lease:
    description: Renew the lease.
    type: bool
    default: true
  dump_stacks:
    description: Dump every live rank's Python stack with py-spy first.
    type: bool
    default: false
  py_spy:
    description: Path of py-spy; looked up beside the run's Python and on PATH when unset.
    type: str
  python:
    description: Action plugin only. Python on the host for the looks. When set, each look is
      the same code as this module run as a plain script (module_utils/torchfleet/watch.py
      piped to this interpreter), a bare interpreter start instead of an AnsiballZ module's;
      the role passes the interpreter that runs torchrun.
    type: str
  abort_file:
    description: Action plugin only. Controller file shared by every host's watcher; the first
      failure is written there and makes every other watcher return.
    type: path
  poll_s:
    description: Action plugin only. Longest wait of one look (O(wait_s)); also how often each
      watcher reads the abort file.
    type: float
    default: 2
  hang_timeout_s:
    description: Action plugin only. Every rank silent this long is a hang.
    type: float
    default: 300
  job_timeout_s:
    description: Action plugin only. Longest run.
    type: float
    default: 86400
  start_grace_s:
    description: Action plugin only. Time torchrun has to start.
    type: float
    default: 60
  progress:
    description: Action plugin only. Print a progress line per look.
    type: bool
    default: false
  nranks_total:
    description: Action plugin only. World size, for the progress line.
    type: int
  progress_file:
    description: Action plugin only. Controller file to which every look appends one JSON line
      (host, elapsed_s, state, rc, outcome, ranks), for callers that follow a run live
      (the torchfleet Python API).
    type: path
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Look at the run once
  torchrun_watch:
    run_dir: ~/.torchfleet/runs/20261122-0301-ab12/node0
    run_id: 20261122-0301-ab12
  register: state
"""

RETURN = r"""
state:
  description: pending (not started yet), start_failed, running, exited, or vanished (no process,
    no exit code).
  returned: always
  type: str
rc:
  description: torchrun's exit code once it exited.
  returned: always
  type: int
pid:
  description: torchrun's PID.
  returned: always
  type: int
elapsed_s:
  description: Seconds since torchrun started.
  returned: always
  type: float
ranks:
  description: One entry per local rank of the latest attempt.
  returned: always
  type: list
  elements: dict
  sample: [{"local_rank": 0, "pid": 4242, "rank": 8, "alive": true, "last_line": "step 20/300 loss 0.3",
            "idle_s": 0.4, "dir": "/root/.torchfleet/runs/x/node0/logs/x_ab/attempt_0/0"}]
root_cause:
  description: The failed rank torchrun names as the first observed failure, once it exited.
  returned: always
  type: dict
  sample: {"rank": 1, "local_rank": 1, "exitcode": 3}
msg:
  description: Why the job failed to start, with state start_failed.
  returned: always
  type: str
dumps:
  description: Files written by py-spy, with O(dump_stacks).
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.torchfleet.watch import DEFAULTS, look


def main():
    module = AnsibleModule(
        argument_spec=dict(
            run_dir=dict(type="path", required=True),
            run_id=dict(type="str", required=True),
            # Defaults from watch.DEFAULTS, which the action plugin's plain-script looks use.
            touch_lease=dict(type="bool", default=DEFAULTS["touch_lease"]),
            async_jid=dict(type="str"),
            async_dir=dict(type="path", default=DEFAULTS["async_dir"]),
            wait_s=dict(type="float", default=DEFAULTS["wait_s"]),
            dump_stacks=dict(type="bool", default=DEFAULTS["dump_stacks"]),
            py_spy=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    module.exit_json(**look(module.params))


if __name__ == "__main__":
    main()
