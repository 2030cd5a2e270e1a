#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: restart_plan
short_description: Decide whether a failed torchfleet attempt is started again, and on which hosts
description:
  - After an attempt ended (its record, O(state_file), is the master's judgement of how it
    ended), says whether the remaining candidates are re-checked for a restart - a host lost
    or whose start failed is left out of every later attempt, a host whose rank failed is
    re-checked with the others - or why not (no failure, O(max_restarts) used, a failure no
    host explains without O(restart_on=any), the controller lost).
  - With O(plan) (its own first answer) and O(recheck) (preflight_checks' answer over the
    re-checked hosts), decides the restart - the hosts the re-check chose, each replaced host
    with why and by whom - or why not.
  - Meant to run on the controller; an action plugin of the same name runs it in-process there.
version_added: "0.3.0"
author: torchfleet developers (@torchfleet)
options:
  attempt:
    description: The attempt that ended, 0 for the first.
    type: int
    required: true
  max_restarts:
    description: How many restarts the run may make.
    type: int
    default: 0
  restart_on:
    description: C(host) restarts only a failure a host explains; C(any) every failure but a
      lost controller.
    type: str
    default: host
    choices: [host, any]
  state_file:
    description: The attempt's run_state.json on the controller.
    type: str
    default: ""
  candidates:
    description: Preflight's candidate hosts in inventory order.
    type: list
    elements: str
    default: []
  excluded:
    description: Hosts earlier attempts left out.
    type: list
    elements: str
    default: []
  gathered:
    description: Each host's registered M(torchfleet.fleet.rank_results) result of the attempt; an unreachable
      one is left out.
    type: dict
    default: {}
  hosts:
    description: The attempt's hosts in rank order.
    type: list
    elements: str
    default: []
  probed:
    description: The candidates whose last probe the controller holds; only those may keep it
      (see RV(probe)).
    type: list
    elements: str
    default: []
  actions:
    description: C(observe) decides no re-check and no restart, and says what it would have
      done (RV(would)); C(enforce) restarts as asked.
    type: str
    choices: [enforce, observe]
    default: enforce
  plan:
    description: This module's first answer; with it the module decides the restart.
    type: dict
  recheck:
    description: The M(torchfleet.fleet.preflight_checks) answer over the re-checked hosts.
    type: dict
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Decides only; writes nothing.
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Re-check for a restart or not
  restart_plan:
    attempt: 0
    max_restarts: 1
    state_file: runs/20261124-120000-ab12/attempt_0/run_state.json
    candidates: [node0, node1, node2, node3, node4, node5]
    hosts: [node0, node1, node2, node3]
  register: first

- name: Decide the restart with the re-check
  restart_plan:
    attempt: 0
    plan: "{{ first }}"
    recheck: "{{ recheck }}"
    hosts: [node0, node1, node2, node3]
"""

RETURN = r"""
recheck:
  description: Whether the candidates in RV(hosts) are re-checked for a restart.
  returned: without plan
  type: bool
probe:
  description: The candidates of RV(hosts) to probe again. After a host lost or never started,
    with every other host of the attempt stopped by its own agent and the same master, only the
    master (its port) and the candidates the attempt did not use; the others keep their last
    probe (one of O(probed)). Otherwise every candidate of RV(hosts).
  returned: without plan
  type: list
  elements: str
exclude:
  description: Every host left out so far (lost, not started, unreachable).
  returned: without plan
  type: list
  elements: str
would:
  description: With O(actions=observe), true where a re-check for a restart would have been
    made (RV(why) says it).
  returned: without plan when O(actions=observe) kept a restart from being considered; with
    plan when there was no re-check
  type: bool
left_out:
  description: The hosts this attempt left out, each with why (host.lost, host.not_started,
    host.unreachable).
  returned: without plan
  type: dict
suspect:
  description: The host whose rank failed; the re-check decides whether it explains the failure.
  returned: without plan
  type: str
cause:
  description: The failure a restart answers (host, reason, id).
  returned: without plan
  type: dict
restart:
  description: Whether the run starts again.
  returned: with plan
  type: bool
hosts:
  description: Without plan the candidates to re-check; with plan the next attempt's hosts in
    rank order.
  returned: always
  type: list
  elements: str
next_attempt:
  description: The number of the attempt that starts (O(attempt) + 1) when RV(restart) is true.
  returned: with plan
  type: int
replaced:
  description: Each host of the attempt not in the next one, with reason and the host that
    replaces it (by).
  returned: with plan
  type: list
  elements: dict
why:
  description: The decision in words (empty when no restart was asked for).
  returned: always
  type: str
  sample: "node2 host.lost, replaced by node4"
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.restart import ARGUMENT_SPEC, decide


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.exit_json(changed=False, **decide(module.params))


if __name__ == "__main__":
    main()
