#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: run_plan
short_description: Name a torchfleet run and check the values asked for, before any host
description:
  - Decides on the controller, from variables alone, what preflight needs before it touches a
    host - the run's id (the one given, else UTC time and 16 random bits), the plan of the
    master-port test, and every input check (C(input.*)) whose answer no host could change.
  - The master's address is taken up front when it is known there - O(master_addr), or
    O(master_host) when it is an IPv4 literal and no O(socket_ifname) is set - in the same
    order the master itself uses to choose it; otherwise the master decides in its probe and
    the port test takes a second round.
  - Meant to run on the controller; an action plugin of the same name runs it in-process there.
version_added: "0.2.0"
author: torchfleet developers (@torchfleet)
options:
  nnodes:
    description: Number of nodes asked for, as given.
    type: raw
    required: true
  forks:
    description: Ansible's forks; more nodes than forks means the hosts are probed in several batches.
    type: int
    required: true
  run_id:
    description: The run id asked for; a new one is made when unset.
    type: raw
  master_port:
    description: Rendezvous port on the master, as given.
    type: raw
    default: 29500
  master_addr:
    description: The user's master_addr; empty when unset.
    type: str
    default: ""
  socket_ifname:
    description: The user's socket_ifname; empty when unset.
    type: str
    default: ""
  master_host:
    description: The first node's C(ansible_host).
    type: str
    default: ""
  master_hosts:
    description: The C(ansible_host) of each host that may become the master when the first is
      not reached (with spares, the first spares + 1), by inventory name; C(port_plan.addrs)
      gives their up-front addresses.
    type: dict
    default: {}
  nproc_per_node:
    description: Processes per node, as given (a positive number or C(auto)).
    type: raw
    default: auto
  data_paths:
    description: Paths that must exist on every host, as given; must be a list of absolute paths.
    type: raw
    default: []
  collective_isolate:
    description: Whether the collective test pairs hosts; needs two nodes or more.
    type: bool
    default: false
  collective_isolate_schedule:
    description: Pair schedule of the isolation rounds, C(ring) or C(full).
    type: raw
    default: ring
  nccl_ib_hca:
    description: NCCL_IB_HCA as asked for; anything but NCCL's form (names with an optional
      C(:port), comma separated, behind an optional C(^) or C(=)) is C(input.nccl_ib_hca).
    type: raw
    default: ""
  nccl_ib_gid_index:
    description: NCCL_IB_GID_INDEX as asked for; anything but an integer 0-255 is
      C(input.nccl_ib_gid_index).
    type: raw
    default: ""
  spares:
    description: Extra hosts of group C(nodes) checked beside the first O(nnodes), as asked for;
      the run uses the first O(nnodes) healthy ones. Anything but a whole number >= 0, or more
      hosts than the group has, is C(input.spares).
    type: raw
    default: 0
  max_restarts:
    description: Restarts asked for, as given; anything but a whole number from 0 to 5 is
      C(input.max_restarts).
    type: raw
    default: 0
  restart_on:
    description: C(host) or C(any), as given; anything else is C(input.restart_on).
    type: raw
    default: host
  inventory_size:
    description: How many hosts group C(nodes) has; 0 when unknown (not compared).
    type: int
    default: 0
  health:
    description: Health level asked for (C(off), C(basic) or C(full)); anything else is
      C(input.health).
    type: raw
    default: basic
  health_slow_pct:
    description: As asked for; anything but a number >= 0 is C(input.health).
    type: raw
    default: 10.0
  health_floors:
    description: As asked for; anything but a mapping of GPU model to C(tflops) / C(gbps)
      numbers is C(input.health).
    type: raw
    default: {}
  health_ecc_corrected_max:
    description: As asked for; anything but a whole number >= 0 is C(input.health).
    type: raw
    default: 10000
  health_xid_window_s:
    description: As asked for; anything but a whole number >= 0 is C(input.health).
    type: raw
    default: 7200
  health_disk_min_gb:
    description: As asked for; anything but a number >= 0 is C(input.health).
    type: raw
    default: 10.0
  health_clock_max_s:
    description: As asked for; anything but a number >= 0 is C(input.health).
    type: raw
    default: 2.0
  container_image:
    description: As asked for; an image reference that cannot be one is C(input.container).
    type: raw
    default: ""
  container_runtime:
    description: As asked for; anything but auto, podman, docker, apptainer or enroot is
      C(input.container).
    type: raw
    default: auto
  container_mounts:
    description: As asked for; an entry that is not an absolute path or an absolute
      host:container pair is C(input.container).
    type: raw
    default: []
  container_options:
    description: As asked for; anything but a list of strings is C(input.container).
    type: raw
    default: []
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Decides only; writes nothing anywhere.
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Name this run and check the values asked for
  run_plan:
    nnodes: "{{ nnodes | default(groups['nodes'] | length) }}"
    forks: "{{ ansible_forks }}"
    run_id: "{{ run_id | default(omit) }}"
    master_host: "{{ hostvars[groups['nodes'][0]]['ansible_host'] | default('') }}"
  run_once: true
  register: plan
"""

RETURN = r"""
run_id:
  description: The run's id, naming its directory on the controller and on every host.
  returned: always
  type: str
  sample: 20261124-031502-9c2e
port_plan:
  description: >-
    How the preflight tests the master port - inline (the address is known up front, one round),
    batched (more nodes than forks), addr (the address known up front, else empty),
    ephemeral_port (a high port tested beside the master port) and addrs (the address known up
    front of each host of O(master_hosts), else empty).
  returned: always
  type: dict
  sample: {"inline": true, "batched": false, "addr": "10.0.0.1", "ephemeral_port": 55123,
           "addrs": {"node0": "10.0.0.1", "node1": "10.0.0.2"}}
candidates:
  description: How many hosts of group nodes the preflight checks, nnodes + spares.
  returned: always
  type: int
  sample: 40
spares:
  description: How many of the candidates are spares (0 when spares is refused).
  returned: always
  type: int
  sample: 2
input_errors:
  description: One record (id, detail, hint) per value refused; empty when all are fine.
  returned: always
  type: list
  elements: dict
  sample: [{"id": "input.master_port", "detail": "master_port=70000 is not a TCP port",
            "hint": "set -e master_port=N with 1024 <= N <= 65535 (29500 is torchrun's default)"}]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.plan import ARGUMENT_SPEC, decide


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.exit_json(changed=False, **decide(module.params))


if __name__ == "__main__":
    main()
