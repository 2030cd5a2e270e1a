#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: port_guard
short_description: Let a torchfleet run's ports in only from the run's hosts (nftables)
description:
  - With O(state=present), adds one nftables table, C(inet torchfleet_guard_<run_id>), whose
    input chain accepts TCP to O(ports) from O(allow) and loopback only and resets every other
    connection to them. torchrun's rendezvous store on C(master_port) listens on every
    interface without authentication for the run's lifetime; the guard closes it, and the
    run's control port, to everyone but the run.
  - With O(ephemeral), also new TCP connections to this host's ephemeral port range (where
    gloo and NCCL listen for their peers) from anyone but the run's hosts are reset;
    connections this host opened are not new and pass.
  - With O(state=absent), removes the run's table (every torchfleet guard table when
    O(run_id) is unset); another tool's tables are never touched.
  - Needs root (C(become)) and the C(nft) command. Without them, absent says what it could not
    look at and changes nothing; present fails in one sentence.
  - The ruleset is given to C(nft -f -) on stdin; no value reaches a shell.
version_added: "0.1.0"
author: torchfleet developers (@torchfleet)
options:
  state:
    description: Whether the run's guard is in place.
    type: str
    choices: [present, absent]
    default: present
  run_id:
    description: The run's id; required with O(state=present).
    type: str
  ports:
    description: TCP ports to guard (master_port and the control port).
    type: list
    elements: int
    default: []
  allow:
    description: Addresses of the run's hosts on the chosen NIC.
    type: list
    elements: str
    default: []
  ephemeral:
    description: Guard this host's ephemeral port range (read from the kernel) too.
    type: bool
    default: false
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: linux
"""

EXAMPLES = r"""
- name: Guard the run's ports on the master
  port_guard:
    run_id: 20261122-0301-ab12
    ports: [29500, 51234]
    allow: [10.0.0.1, 10.0.0.2]
  become: true

- name: Guard the ephemeral ports of every host of the run
  port_guard:
    run_id: 20261122-0301-ab12
    ephemeral: true
    allow: [10.0.0.1, 10.0.0.2]
  become: true
- name: Remove every torchfleet guard on this host
  port_guard:
    state: absent
  become: true
"""

RETURN = r"""
table:
  description: The run's table, with O(state=present).
  returned: always
  type: str
  sample: torchfleet_guard_20261122_0301_ab12
removed:
  description: Tables removed, with O(state=absent).
  returned: always
  type: list
  elements: str
msg:
  description: What could not be looked at (absent without root or nft); empty otherwise.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.command import bounded
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import guard
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.net import ephemeral_range

ARGUMENT_SPEC = dict(
    state=dict(type="str", choices=["present", "absent"], default="present"),
    run_id=dict(type="str"),
    ports=dict(type="list", elements="int", default=[]),
    allow=dict(type="list", elements="str", default=[]),
    ephemeral=dict(type="bool", default=False),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True,
                           required_if=[("state", "present", ("run_id",))])
    p = module.params
    result = dict(changed=False, table="", removed=[])  # and msg, added as each path exits
    nft = module.get_bin_path("nft")
    try:
        name = guard.table_name(p["run_id"]) if p["run_id"] is not None else None
        ephemeral = ephemeral_range() if p["ephemeral"] else None
        if p["ephemeral"] and ephemeral is None:
            raise ValueError("this host's ephemeral port range cannot be read "
                             "(/proc/sys/net/ipv4/ip_local_port_range)")
        script = guard.ruleset(p["run_id"], p["ports"], p["allow"], ephemeral) \
            if p["state"] == "present" else None
    except ValueError as exc:
        module.fail_json(msg="guard_ports: %s; nothing was changed" % exc, **result)
    if nft is None:
        if p["state"] == "absent":
            module.exit_json(**dict(result, msg="no nft on this host: no guard to remove"))
        module.fail_json(msg="guard_ports needs nft (nftables) on every host of the run; "
                             "install nftables there or leave guard_ports false", **result)
    run = bounded(module)
    out, err = run([nft, "list", "tables"])
    if out is None:
        if p["state"] == "absent":
            module.exit_json(**dict(result, msg="cannot list nftables tables (%s): run as root "
                                                "(-e guard_ports=true uses sudo)" % err))
        module.fail_json(msg="guard_ports: nft cannot list tables here (%s); the guard needs root"
                             " (become)" % err, **result)
    present = guard.ours(out, p["run_id"])
    if p["state"] == "present":
        result.update(table=name, changed=name not in present)
        if result["changed"] and not module.check_mode:
            _out, err = run([nft, "-f", "-"], data=script)
            if err is not None:
                module.fail_json(msg="guard_ports: nft refused the guard of run %s (%s)"
                                     % (p["run_id"], err), **result)
        module.exit_json(msg="", **result)
    for table in present:
        if not module.check_mode:
            _out, err = run([nft, "delete", "table", "inet", table])
            if err is not None:
                module.fail_json(msg="cannot remove nftables table %s (%s)" % (table, err),
                                 **result)
        result["removed"].append(table)
    result["changed"] = bool(result["removed"])
    module.exit_json(msg="", **result)


if __name__ == "__main__":
    main()
