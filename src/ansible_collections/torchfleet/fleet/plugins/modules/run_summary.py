#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: run_summary
short_description: Decide how a launched torchrun run ended and write train.json or collective.json
description:
  - Takes the run's state record (what the master's agent decided, O(run_dir)/run_state.json)
    and what M(torchfleet.fleet.rank_results) returned on every host and decides, on the controller, each host's
    outcome with its node rank and ranks, missing ranks, the first failure (host, rank, reason
    and the tail of that rank's log) and, for the collective test, per op and size the busbw
    minimum, median and maximum across ranks with the slowest rank and host.
  - Writes O(kind).json into O(run_dir) and returns the tables printed at the end of the play.
  - An action plugin of the same name runs it in the controller's process.
version_added: "0.1.0"
author: torchfleet developers (@torchfleet)
options:
  kind:
    description: Which workload ran.
    type: str
    required: true
    choices: [train, collective]
  run_id:
    description: The run's id.
    type: str
    required: true
  hosts:
    description: The run's hosts in rank order.
    type: list
    elements: str
    required: true
  state:
    description: The run's state record (run_state.json, written by the M(torchfleet.fleet.torchrun_watch) action
      plugin from the master's record); read from O(run_dir) when unset.
    type: dict
  ranks:
    description: Registered M(torchfleet.fleet.rank_results) result per host.
    type: dict
    default: {}
  world_size:
    description: nnodes x nproc_per_node.
    type: int
    required: true
  settings:
    description: What the run used (recorded in the report).
    type: dict
    default: {}
  run_dir:
    description: The controller's run directory; the report is written there when set.
    type: str
    default: ""
  attempt_dir:
    description: Where the last attempt's logs and run_state.json are when the run could
      restart (O(run_dir)/attempt_<n>); O(run_dir)/logs is then pointed at its logs. Unset,
      O(run_dir).
    type: str
    default: ""
  attempts:
    description: Every attempt of a run with max_restarts (attempt, hosts, dir), in order.
    type: list
    elements: dict
    default: []
  restarts:
    description: The M(torchfleet.fleet.restart_plan) decision after each attempt (attempt, restart, why, hosts,
      replaced).
    type: list
    elements: dict
    default: []
  times:
    description: The controller's clock (epoch seconds) for RV(goodput) - started (the run's first
      play), launched (attempt number as a string to its launch play's start) and attempts (every
      attempt, attempt and dir, with or without max_restarts).
    type: dict
    default: {}
  runs_root:
    description: When set, runs_root/latest is pointed at O(run_dir).
    type: str
    default: ""
  keep_runs:
    description: With O(runs_root), keep only this many newest run directories there.
    type: int
    default: 20
  expect_results:
    description: Every rank must write a result (the built-in workloads do; a user's script may not).
    type: bool
    default: true
  tail_lines:
    description: Lines of the failing rank's log to show.
    type: int
    default: 15
  isolate:
    description: How the pair rounds of the collective test (collective_isolate) are judged.
    type: dict
    default: {}
    suboptions:
      threshold:
        description: A pair is slow below this fraction of the reference (the median over
          hosts of each host's best pair).
        type: float
        default: 0.5
      floor_gbs:
        description: An absolute busbw floor in GB/s; 0 for none.
        type: float
        default: 0.0
      nics:
        description: Each host's NIC (NCCL_SOCKET_IFNAME), named in the fix of node.slow.
        type: dict
        default: {}
  slurm_drain:
    description: Whether to drain in Slurm the hosts in RV(drain) (C(scontrol update nodename=NODE state=drain
      reason="torchfleet RUN_ID ..."), on the controller, before the report is written); the audit lists each
      drain, done only where scontrol succeeded.
    type: bool
    default: false
  slurm_nodes:
    description: Each host's Slurm node name, by host (the inventory plugin's C(slurm_node)); a host not named,
      or named C(""), is drained by its own name.
    type: dict
    default: {}
  slurm_scontrol:
    description: The C(scontrol) command that drains a host not in O(slurm_scontrols).
    type: str
    default: scontrol
  slurm_scontrols:
    description: Each host's C(scontrol) command, by host (the inventory plugin's C(slurm_scontrol)); hosts with
      one command and one reason are drained by one call, their nodes as one hostlist.
    type: dict
    default: {}
  ledger_said:
    description: The C(fleet.ledger) warnings preflight gave (its report's details); when there is one, the run's
      end does not warn about the ledger again.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - torchfleet.fleet.ledger
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: partial
    details: Decides and writes the JSON report into O(run_dir) in check mode too (the
      verdict is what a --check run is for); in a --check play it neither points
      runs_root/latest at the run nor prunes old runs.
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Summarise the run
  run_summary:
    kind: collective
    run_id: "{{ launch_run_id }}"
    hosts: "{{ launch_hosts }}"
    ranks: "{{ dict(launch_hosts | zip(launch_hosts | map('extract', hostvars, 'launch_ranks'))) }}"
    world_size: 4
    run_dir: runs/20261122-0301-ab12
  register: summary
"""

RETURN = r"""
ok:
  description: True when every host succeeded and every rank reported a correct result.
  returned: always
  type: bool
checks:
  description: run.exit per host, host.lost, run.restart per replaced host, run.hang, run.timeout, run.controller_lost,
    rank.missing, collective.wrong or train.checksum; with the pair rounds, node.slow per
    host and link.slow per slow pair.
  returned: always
  type: list
  elements: dict
failures:
  description: The failed checks.
  returned: always
  type: list
  elements: dict
first_failure:
  description: Host, rank, reason and log tail of the failure to look at first; C(event), the
    hardware event of a run.hardware or run.oom cause (source, kind, code, gpu, pci_bus,
    rank, pid, line, fatal, at).
  returned: always
  type: dict
drain:
  description: Each host with a fatal hardware event during the run, as host, reason (the
    check id) and evidence (the event's line); and each host the fleet's ledger quarantined on
    recording this run (reason C(host.quarantined), the ledger's reason as evidence), which
    train.json keeps as RV(quarantined) instead. They are drained in Slurm with
    O(slurm_drain), unless the circuit breaker (C(fleet.breaker), which counts this run's drains
    with those torchfleet did within O(quarantine_h)) or O(actions=observe) keeps it from doing
    so (then empty).
  returned: always
  type: list
  elements: dict
actions:
  description: The audit of what torchfleet did on its own, or would have, in the JSON report
    too; each C(action) (stop, drain, quarantine, exclude, restart), C(host) (none for the
    whole run), C(check), C(at) (ISO 8601 UTC), C(why) (the evidence) and C(done) (false for
    what O(actions=observe), the circuit breaker or a failure kept from being done). A drain is
    listed with O(slurm_drain) only, done when scontrol drained the node; one Slurm refused
    says why in its C(why) (scontrol's exit status and words, and the command to run).
  returned: always
  type: list
  elements: dict
quarantined:
  description: The hosts the fleet's ledger quarantined on recording this run (host, until in
    epoch seconds, the ledger's reason); in the JSON report too.
  returned: when the ledger quarantined a host
  type: list
  elements: dict
hardware:
  description: Every hardware event the hosts reported during the run (kernel log, NVML,
    RDMA ports), dated on the master's clock, fatal or a warning.
  returned: always
  type: list
  elements: dict
hardware_dropped:
  description: The warnings each host's watch or the master did not keep (past 64 a host or
    512 a run; a fatal event is never dropped), host to count, said as "and N more warnings".
  returned: when some warnings were not kept
  type: dict
stragglers:
  description: Each rank or host the others waited for, as the master named it during the
    run, host, ranks, late_ms_mean (the others' mean wait for it at a sampled collective, what
    named it), interval_ms (the interval its mean lateness is a share of, the mean interval
    between the collectives of its own process groups), share_last (the fraction
    of sampled collectives it was late at beyond the clocks' uncertainties), late_ms_median
    (the others' median wait for it), first_seen and last_seen (ISO 8601 UTC).
  returned: always
  type: list
  elements: dict
straggle:
  description: How stragglers were watched, watched (false with the Flight Recorder off, or
    NCCL collectives not timed), why (when not), signal (durations with NCCL, calls with
    gloo), started and ended (ISO 8601 UTC, the timeline's ends).
  returned: always
  type: dict
hosts:
  description: Per host in rank order, host, node_rank, ranks, outcome, rc, duration_s,
    reported_ranks and logs; for the collective test also busbw_gbs (the host's ranks' busbw
    min / median / max at the sweep's largest all_reduce size).
  returned: always
  type: list
  elements: dict
ranks:
  description: Every rank's end, rank, host, local_rank, ok, exit_code and state (succeeded,
    failed, killed or stopped).
  returned: always
  type: list
  elements: dict
busbw:
  description: Per op and size, busbw min / median / max across ranks, slowest rank and host.
  returned: for kind collective
  type: list
  elements: dict
isolate:
  description: The pair rounds' verdict (schedule, rounds, passes and pass_rounds (the rounds
    of each pass; after the first, only the suspects'), time_s, threshold, floor_gbs,
    reference_gbs, pairs with a, b, busbw_gbs, latency_us, error, slow, unsettled and passes, slow_nodes,
    slow_links).
  returned: for kind collective with collective_isolate
  type: dict
table_collective:
  description: The collective test's busbw tables (and the pair rounds' verdict) as text.
  returned: for kind collective
  type: str
attempts:
  description: With max_restarts, every attempt - attempt, hosts, dir, logs, phase, ok,
    outcomes (host to outcome), first_failure (in words), failure (the record's), restart (why
    the next attempt was started, else empty), not_restarted (why not) and replaced (host,
    reason, by).
  returned: when the run could restart
  type: list
  elements: dict
goodput:
  description: The share of the run's wall time that became training that was kept, and where the
    rest went (module_utils/reports/goodput.py) - ratio, wall_s, buckets (preflight, launch, init,
    kept_training, checkpoint_stall, lost_work (null when unknown), detection, teardown, restart,
    in seconds), unknown, attempts, checkpoints, checkpoints_folded, failures, advice, mtbf_s, nnodes. Every time of the master's record is put on
    the controller's clock first, with the offset the watch measured (the record's clock).
  returned: for kind train, and for kind collective when the run could restart; null without O(times)
  type: dict
verdict:
  description: How it ended, in one sentence (also the table's last line and the report's C(verdict)).
  returned: always
  type: str
  sample: "train failed: first failure on node1, rank 1: rank 1 exited with 3"
table:
  description: The summary tables.
  returned: always
  type: str
report:
  description: Path of the JSON report.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import memory
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.summary import ARGUMENT_SPEC, decide


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    memory.mask_fleet_db(module)
    try:
        result = decide(module.params)
    except ValueError as exc:  # a report that cannot be written, named in one sentence
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
