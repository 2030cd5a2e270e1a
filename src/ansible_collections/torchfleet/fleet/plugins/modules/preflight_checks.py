#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_checks
short_description: Decide every preflight check of every host on the controller
description:
  - Takes what M(torchfleet.fleet.node_probe) and M(torchfleet.fleet.port_probe) returned on each host and decides every check
    id of torchfleet's preflight once, on the controller, comparing the hosts with each other
    (versions, environment, code) without any further round trip.
  - Returns the check records, the per-node plan (rank, address, NIC to export as
    NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME) and a summary table naming host, check and fix.
  - Meant to run on the controller; an action plugin of the same name runs it in-process there,
    which saves a Python start per run. Writes nothing unless O(run_dir) is set.
version_added: "0.1.0"
author: torchfleet developers (@torchfleet)
options:
  hosts:
    description: The selected hosts in rank order; the first is the master. Empty when nnodes is invalid.
    type: list
    elements: str
    required: true
  master:
    description: With spares, the host the ports were tested against when it is not the first
      (the ones before it were not reached); the master unless it is the one to blame.
    type: str
  nnodes:
    description: Number of nodes asked for.
    type: int
    required: true
  inventory_size:
    description: Number of hosts in group C(nodes).
    type: int
    required: true
  probes:
    description: Registered M(torchfleet.fleet.node_probe) result per host (may be unreachable or failed).
    type: dict
    default: {}
  connects:
    description: Registered M(torchfleet.fleet.port_probe) result per host.
    type: dict
    default: {}
  master_port:
    description: The rendezvous port.
    type: int
    default: 29500
  master_addr:
    description: The user's master_addr; used for the route check when the master itself was not reached.
    type: str
    default: ""
  socket_ifname:
    description: The interface the user asked for; auto-detected per host when empty.
    type: str
    default: ""
  backend:
    description: C(nccl), C(gloo) or C(auto) (nccl when every host has GPUs).
    type: str
    choices: [auto, nccl, gloo]
    default: auto
  nproc_per_node:
    description: Processes per node, or C(auto).
    type: str
    default: auto
  code_dir:
    description: The code directory compared across hosts; not compared when empty.
    type: str
    default: ""
  data_paths:
    description: Paths that must exist on every host.
    type: list
    elements: str
    default: []
  shm_min_bytes:
    description: Smallest acceptable /dev/shm.
    type: int
    default: 1073741824
  script:
    description: The training script train.yml starts; checked on every host when set.
    type: str
    default: ""
  input_errors:
    description: Bad values found before any host was touched ({id, detail, hint}); each fails as a check on the controller.
    type: list
    elements: dict
    default: []
  listener:
    description: The master's listener when the two-round port test started it in a task of its
      own (the C(listen_ports) option of M(torchfleet.fleet.port_probe)); else the one in the master's probe counts.
    type: dict
  run_id:
    description: This run's id, recorded in the report.
    type: str
    default: ""
  run_dir:
    description: When set, C(preflight.json) is written there (the controller's run directory).
    type: str
    default: ""
  runs_root:
    description: When set, C(runs_root/latest) is pointed at O(run_dir).
    type: str
    default: ""
  network:
    description:
      - The NCCL network preset asked for. With C(ib) the rdma.* checks run on every host; C(auto)
        chooses C(ib) when every host has an active RDMA port NCCL would use (else C(ethernet))
        and says which HCAs, in C(resolved.network) and C(resolved.network_why).
    type: str
    choices: [none, ethernet, ib, auto]
    default: none
  nccl_ib_hca:
    description: NCCL_IB_HCA as the run will set it (C(mlx5_0,mlx5_1:1), C(^mlx5_2), C(=mlx5_0));
      the HCAs rdma.down looks at. Empty is every device.
    type: str
    default: ""
  nccl_ib_gid_index:
    description: NCCL_IB_GID_INDEX as the run will set it; rdma.gid checks it names a RoCE v2
      IPv4 GID on every RoCE port. Empty leaves the choice to NCCL.
    type: str
    default: ""
  nccl_nsocks_perthread:
    description: NCCL_NSOCKS_PERTHREAD of the C(ethernet) preset.
    type: int
    default: 4
  nccl_socket_nthreads:
    description: NCCL_SOCKET_NTHREADS of the C(ethernet) preset.
    type: int
    default: 2
  spares:
    description: How many of O(hosts) are spares; the run uses the first O(nnodes) healthy ones
      in this order, and every other candidate gets a C(host.skipped) record. 0 uses O(hosts)
      as they are.
    type: int
    default: 0
  perf:
    description: M(torchfleet.fleet.health_perf) results per host, with O(health=full).
    type: dict
    default: {}
  health:
    description: Node health level; C(off) decides no gpu.* / host.* health check.
    type: str
    default: basic
  health_slow_pct:
    description: With O(health=full), a device this many percent below its model's fleet
      median fails.
    type: raw
    default: 10.0
  health_floors:
    description: With O(health=full), absolute floors per GPU model (C(tflops), C(gbps)).
    type: raw
    default: {}
  health_ecc_corrected_max:
    description: Corrected ECC errors of one GPU above which gpu.ecc warns.
    type: raw
    default: 10000
  health_disk_min_gb:
    description: Free GiB asked for where the run writes.
    type: raw
    default: 10.0
  health_clock_max_s:
    description: Largest clock offset from the fleet's accepted.
    type: raw
    default: 2.0
  skipped:
    description: Records of candidates a first decision left out (its RV(skipped_records)), added
      when the chosen hosts are decided again after their port test against a new master.
    type: list
    elements: dict
    default: []
  choice:
    description: The first decision's RV(choice), kept in the report of the second.
    type: dict
  quarantine:
    description: A host the fleet's ledger quarantined that the run must use (no healthy spare left) is a
      C(host.quarantined) warning with C(warn), an error with C(strict). With spares it is left out while the
      others suffice, and the spares that take the places of hosts left out are the ledger's healthiest.
    type: str
    choices: [warn, strict]
    default: warn
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
- name: Decide the checks
  preflight_checks:
    hosts: "{{ preflight_hosts }}"
    nnodes: "{{ nnodes }}"
    inventory_size: "{{ groups['nodes'] | length }}"
    probes: "{{ dict(preflight_hosts | zip(preflight_hosts | map('extract', hostvars, 'preflight_probe'))) }}"
    connects: "{{ dict(preflight_hosts | zip(preflight_hosts | map('extract', hostvars, 'preflight_connect'))) }}"
    master_port: 29500
  delegate_to: localhost
  register: preflight
"""

RETURN = r"""
ok:
  description: True when no check of severity error failed.
  returned: always
  type: bool
checks:
  description: Every check of every host.
  returned: always
  type: list
  elements: dict
  sample: [{"id": "port.blocked", "host": "node1", "ok": false, "severity": "error",
            "detail": "cannot open TCP 10.0.0.1:29500 (dropped: no answer in 3 s, a firewall?)",
            "hint": "allow TCP 29500 from the workers on the master's firewall ..."}]
nodes:
  description: Per node, in rank order, what a launch will use.
  returned: always
  type: list
  elements: dict
  sample: [{"host": "node0", "node_rank": 0, "address": "10.0.0.1", "socket_ifname": "eth0",
            "python": "/usr/bin/python3", "versions": {}, "gpus": 8}]
resolved:
  description: master_addr, backend, nproc_per_node, world_size, the ephemeral port tested, the
    network preset used (network, network_why) and its NCCL variables (nccl_env).
  returned: always
  type: dict
failures:
  description: The failed checks of severity error.
  returned: always
  type: list
  elements: dict
report:
  description: Path of preflight.json, when run_dir was set.
  returned: always
  type: str
verdict:
  description: How it ended, in one sentence (also the table's last line and the report's C(verdict)).
  returned: always
  type: str
  sample: "preflight failed: 1 problem(s) on node1 (port.blocked)"
table:
  description: The summary table, with the failed and warning checks, or one row per node when all passed.
  returned: always
  type: str
retest:
  description: With spares, when the master tested was the broken one, the hosts chosen instead,
    whose ports must be tested again against the new master before a decision (empty
    otherwise; the other return values are then empty too).
  returned: always
  type: list
  elements: str
  sample: ["node1", "node2", "node3", "node4"]
choice:
  description: With spares, the candidates, the hosts chosen and each skipped host's failed checks.
  returned: when spares is above 0
  type: dict
  sample: {"candidates": ["node0", "node1", "node2"], "chosen": ["node0", "node2"],
           "skipped": {"node1": ["port.blocked"]}}
skipped_records:
  description: With a retest, the records of the candidates left out, for the second decision.
  returned: when retest is not empty
  type: list
  elements: dict
actions:
  description: The audit of what torchfleet did on its own, or would have, as train.json's (and in
    preflight.json); each C(action) (exclude, a quarantined host left out; quarantine), C(host), C(check),
    C(at) (ISO 8601 UTC), C(why) (the evidence) and C(done) (false for what O(actions=observe) or the
    circuit breaker kept from being done).
  returned: always
  type: list
  elements: dict
quarantined:
  description: The hosts the fleet's ledger quarantined on recording this preflight (host, until in epoch
    seconds, the ledger's reason).
  returned: when the ledger quarantined a host
  type: list
  elements: dict
  sample: [{"host": "node3", "until": 1795973923.0, "reason": "score 2.93 >= quarantine_score 2.5: ..."}]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import memory
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.preflight import ARGUMENT_SPEC, decide


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    memory.mask_fleet_db(module)
    try:
        result = decide(module.params)
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
