#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: port_probe
short_description: From this host, find the route to the master and open TCP connections to its ports
description:
  - Looks up the route to O(master_addr) with C(ip -j route get) and names the interface it
    leaves by (for the master's own address, the interface that holds it).
  - Opens a TCP connection to each port in O(ports), all at once, retrying "connection refused"
    until O(timeout_s) so that a listener started a moment later is still found. A firewall that
    drops packets shows as a timeout, one that rejects them as refused.
  - This is the C(nc -zv MASTER PORT) of the hand-written guides, from every host at once.
  - On the master, O(listen_ports) starts the listener the other hosts' connections reach (the
    two-round test, where it starts after every host's probe and so does not wait through the
    probes' fork batches).
version_added: "0.1.0"
author: torchfleet developers (@torchfleet)
options:
  master_addr:
    description: Address of the master.
    type: str
    required: true
  ports:
    description: TCP ports to connect to.
    type: list
    elements: int
    default: []
  timeout_s:
    description: Time allowed for each port.
    type: float
    default: 3
  listen_ports:
    description: Ports to bind and leave a detached listener on, before any connection (see
      the listener of M(torchfleet.fleet.node_probe)).
    type: list
    elements: int
    default: []
  expect_peers:
    description: Connections per port after which the listener of O(listen_ports) ends.
    type: int
    default: 1
  listen_idle_s:
    description: The listener of O(listen_ports) ends when no connection arrived for this long.
    type: float
    default: 60
  listener_pid:
    description:
      - On the master, the PID of the listener M(torchfleet.fleet.node_probe) left. After its own connections this
        host waits up to O(listener_wait_s) for the listener to end (every host connected),
        then stops it, so no listener outlives the preflight.
    type: int
  listener_wait_s:
    description: How long to wait for the listener before stopping it.
    type: float
    default: 5
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Only connects (and on the master runs the port test's listener, a process that
      writes nothing and is gone when preflight ends).
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Reach the master port and one ephemeral port
  port_probe:
    master_addr: 10.0.0.1
    ports: [29500, 51234]
    timeout_s: 3
"""

RETURN = r"""
route:
  description: How traffic to master_addr leaves this host; null when there is no route.
  returned: always
  type: dict
  sample: {"dev": "eth0", "src": "10.0.0.2", "local": false, "nic": "eth0"}
route_error:
  description: Why the route lookup failed.
  returned: always
  type: str
listener:
  description: What became of the listener (exited, stopped, gone) with O(listener_pid); with
    O(listen_ports), the listener started, as M(torchfleet.fleet.node_probe) returns it in C(master.listener).
  returned: when listener_pid or listen_ports is set
  type: raw
  sample: {"pid": 4242, "ports": [{"port": 29500, "bound": true, "error": null}]}
ports:
  description: One entry per port.
  returned: always
  type: list
  elements: dict
  sample: [{"port": 29500, "ok": false, "error": "timed out", "elapsed_s": 3.0,
            "dialled_at": 1795000000.123}]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.command import bounded
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.connect import connect_all, route_to
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.listener import start_listener, stop_listener


def main():
    module = AnsibleModule(
        argument_spec=dict(
            master_addr=dict(type="str", required=True),
            ports=dict(type="list", elements="int", default=[]),
            timeout_s=dict(type="float", default=3),
            listen_ports=dict(type="list", elements="int", default=[]),
            expect_peers=dict(type="int", default=1),
            listen_idle_s=dict(type="float", default=60),
            listener_pid=dict(type="int"),
            listener_wait_s=dict(type="float", default=5),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["listen_ports"]:
        module.exit_json(changed=False, listener=start_listener(
            p["listen_ports"], p["expect_peers"], p["listen_idle_s"]))
    route, route_error = route_to(p["master_addr"], bounded(module))
    ports = connect_all(p["master_addr"], p["ports"], p["timeout_s"])
    result = dict(changed=False, route=route, route_error=route_error, ports=ports)
    if p["listener_pid"]:
        result["listener"] = stop_listener(p["listener_pid"], p["listener_wait_s"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
