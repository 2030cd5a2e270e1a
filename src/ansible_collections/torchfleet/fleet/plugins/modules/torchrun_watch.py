#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: torchrun_watch
short_description: Look at a run on its master; the action plugin follows it to its end
description:
  - Runs on the run's master only. Reads the run's state record that the master's agent
    (M(torchfleet.fleet.torchrun_job)) keeps in O(run_dir)/control.json and answers its summary, the same few
    fields at any number of hosts; the hosts themselves stop each other on the first failure.
  - Touches the master's lease (the first look makes it), which keeps the dead-man switch of
    M(torchfleet.fleet.torchrun_job) from firing; when the controller stops looking, the run is stopped on every
    host.
  - The action plugin of the same name calls it in a loop (one look on one host every
    O(poll_s) at most, whatever the number of hosts), prints the run's progress, appends it to
    O(progress_file), and at the end copies the whole record to O(state_file).
version_added: "0.1.0"
author: torchfleet developers (@torchfleet)
options:
  run_dir:
    description: The master's directory for the run.
    type: path
    required: true
  run_id:
    description: The run's id.
    type: str
    required: true
  async_jid:
    description: Job id of the master's async M(torchfleet.fleet.torchrun_job); an agent that failed before it
      kept any state (a missing script, a control port in use) is reported at once as state
      C(start_failed) with its message, one that failed later as C(master_died).
    type: str
  async_dir:
    description: Directory of Ansible's async job files on the host.
    type: path
    default: ~/.ansible_async
  wait_s:
    description: Wait on the host up to this many seconds for the run's phase to change, looking
      every 0.2 s, and answer as soon as it does; 0 answers at once.
    type: float
    default: 0
  touch_lease:
    description: Renew the master's lease.
    type: bool
    default: true
  full:
    description: Answer the whole state record (every host), not only the summary.
    type: bool
    default: false
  start_failed:
    description: Hosts whose start task failed, each with Ansible's reason; written once into
      O(run_dir)/start_failed.json, where the master's store reads them and names them as the
      run's failures.
    type: dict
    default: {}
  stop:
    description: When set, the reason the controller is ending; written into
      O(run_dir)/stop_request.json, where the master's store reads it and stops the run on
      every host at once (C(controller_lost), with this reason). The lease is not renewed.
    type: str
    default: ""
  detach:
    description: Mark the run detached (O(run_dir)/detached) - the master's store stops awaiting
      the controller's looks (its lease is off) and judges and ends the run alone.
    type: bool
    default: false
  mode:
    description:
      - Action plugin only. C(attached) follows the run to its end; the controller's end (Ctrl-C,
        SIGTERM, ansible-playbook gone) stops the run.
      - C(detach) follows it until every rank of every host runs, then detaches it (O(detach))
        and returns with RV(outcome) C(detached); a run that fails or ends before is followed
        to its end as C(attached).
      - C(detached) follows a run detached before to its end without renewing its lease; the
        watch's end, or a cut longer than O(lease_s), fails the task and leaves the run running.
      - C(look) makes one look with O(full), renewing nothing, and answers it (status).
    type: str
    choices: [attached, detach, detached, look]
    default: attached
  stop_now:
    description: Action plugin only. Ask the master to stop the run at the first look, with
      this reason (O(stop)), then follow it to its end (stop.yml of a detached run).
    type: str
    default: ""
  attempt:
    description: Action plugin only. The run's attempt, shown by O(mode=look).
    type: int
    default: 0
  starts:
    description: Action plugin only. Each host of the run (in rank order) with its registered
      start result; the hosts whose start failed or were unreachable go to the master as
      O(start_failed). When the master's own start failed, the run's record is made on the
      controller naming it.
    type: dict
    default: {}
  nproc_per_node:
    description: Action plugin only. Processes per host (the record made on the controller).
    type: int
    default: 1
  lost_after_s:
    description: Action plugin only. The run's lost_after_s; the wait for the master's final
      record (O(settle_s)) grows by it.
    type: float
    default: 30
  lease_s:
    description: Action plugin only. A look that fails is tried again until this long has passed
      since the last good one (the master's lease, which the hosts run on); then the controller
      has lost the run (C(controller_lost)), and no host is named.
    type: float
    default: 120
  python:
    description: Action plugin only. Python on the master for the looks; each look is then this
      module's code run as a plain script (a bare interpreter start instead of an AnsiballZ
      module's).
    type: str
  poll_s:
    description: Action plugin only. Longest wait of one look (O(wait_s)).
    type: float
    default: 5
  progress_every_s:
    description: Action plugin only. Longest time between two progress lines.
    type: float
    default: 10
  settle_s:
    description: Action plugin only. After the run's phase is decided, how long to wait for the
      master's agent to close the record before taking it as it is; 120 plus O(lost_after_s)
      when unset (the master may wait for a silent host to be judged lost).
    type: float
  progress_file:
    description: Action plugin only. Controller file to which every look appends one JSON line
      (the run's summary), for callers that follow a run live (the torchfleet Python API).
    type: path
  state_file:
    description: Action plugin only. Controller file the final record is written to
      (run_state.json), which the summary, the Python API and the report read.
    type: path
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: none
    details: Each look renews the run's lease on the master, and the action plugin writes
      progress and state files on the controller; a --check run starts no run to watch.
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Look at the run once, on its master
  torchrun_watch:
    run_dir: ~/.torchfleet/runs/20261122-0301-ab12/node0
    run_id: 20261122-0301-ab12
  register: look
"""

RETURN = r"""
state:
  description: pending (no record yet), start_failed (the master's agent failed before it kept a
    record), master_died (it failed after, killed, out of memory or crashed; its last record
    comes in RV(record)), a phase of the run (running, succeeded, failed, not_started, lost,
    hung, timeout, controller_lost), or final once the master's agent closed the record.
  returned: always
  type: str
msg:
  description: Why the master's agent failed, with state start_failed or master_died.
  returned: always
  type: str
status:
  description: Action plugin only, with O(mode=look) - the run at a glance (phase, attempt,
    elapsed, first failure; per host its state, ranks alive, last line and when the master last
    heard from it).
  returned: with O(mode=look) and a record
  type: dict
table:
  description: Action plugin only, with O(mode=look) - RV(status) as a table.
  returned: with O(mode=look) and a record
  type: str
now:
  description: The host's clock (UNIX time) at the look, to read the record's times against.
  returned: always
  type: float
missing:
  description: The run's directory O(run_dir) does not exist on this host.
  returned: always
  type: bool
summary:
  description: The run at a glance; null before the master's agent kept any state.
  returned: always
  type: dict
  sample: {"phase": "running", "final": false, "failure": null, "elapsed_s": 12.4, "nranks": 16,
           "ranks_alive": 16, "hosts_running": 16, "nnodes": 16, "hosts_done": 0,
           "slowest": {"host": "node7", "idle_s": 0.8}, "last_line": "step 40/300 loss 0.21"}
record:
  description: The whole state record (plugins/module_utils/run/runstate.py), with O(full),
    once the record is final, or with state master_died (its last one).
  returned: always
  type: dict
outcome:
  description: Action plugin only. How the run ended (succeeded, failed, hung, lost, timeout,
    aborted), read from the master's record; C(detached) when O(mode=detach) detached it.
  returned: from the action plugin
  type: str
lost:
  description: Action plugin only. The hosts the master judged lost (host.lost), which the play
    leaves out of the stop and gather before a restart.
  returned: from the action plugin
  type: list
  elements: str
master_lost:
  description: Action plugin only. True when the controller could not reach the master.
  returned: from the action plugin
  type: bool
clock:
  description: Action plugin only. The master's clock offset from the controller's, measured from
    the looks (offset_s, master minus controller, 0.0 when unmeasured; rtt_s, the round trip of
    the look it was taken from, less the look's time on the master; looks, how many measured);
    also kept in O(state_file) as the record's C(clock).
  returned: from the action plugin, once the run ended
  type: dict
  sample: {"offset_s": -0.0021, "rtt_s": 0.084, "looks": 31}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.watch import ACTION_SPEC, look


def main():
    # The controller-side options (python, poll_s, ...) are accepted and unused on a host: one
    # spec for what is documented.
    module = AnsibleModule(argument_spec=ACTION_SPEC, supports_check_mode=False)
    module.exit_json(**look(module.params))


if __name__ == "__main__":
    main()
