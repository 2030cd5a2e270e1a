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
version_added: "0.1.0"
author: torchfleet developers
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
  listener_pid:
    description:
      - On the master, the PID of the listener M(node_probe) left. After its own connections this
        host waits up to O(listener_wait_s) for the listener to end (every host connected),
        then stops it, so no listener outlives the preflight.
    type: int
  listener_wait_s:
    description: How long to wait for the listener before stopping it.
    type: float
    default: 5
attributes:
  check_mode:
    support: full
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
  description: What became of the listener (exited, stopped, gone); only with listener_pid.
  returned: when listener_pid is set
  type: str
ports:
  description: One entry per port.
  returned: always
  type: list
  elements: dict
  sample: [{"port": 29500, "ok": false, "error": "timed out", "elapsed_s": 3.0}]
"""

import errno
import socket
import subprocess
import threading
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.torchfleet.listener import stop_listener
from ansible.module_utils.torchfleet.net import nic_holding, parse_ip_addr, parse_ip_route_get

RETRY_INTERVAL_S = 0.1


def connect(addr, port, timeout_s):
    """{port, ok, error, elapsed_s}: a TCP handshake with addr:port within timeout_s."""
    start = time.monotonic()
    error = None
    while True:
        left = timeout_s - (time.monotonic() - start)
        if left <= 0:
            error = error or "timed out"
            break
        try:
            with socket.create_connection((addr, port), timeout=left):
                error = None
                break
        except socket.timeout:
            error = "timed out"
            break
        except OSError as exc:
            error = "refused" if exc.errno == errno.ECONNREFUSED else (exc.strerror or str(exc))
            if exc.errno != errno.ECONNREFUSED:
                break
            time.sleep(min(RETRY_INTERVAL_S, max(0.0, left)))
    return {"port": port, "ok": error is None, "error": error,
            "elapsed_s": round(time.monotonic() - start, 3)}


def connect_all(addr, ports, timeout_s):
    results = {}

    def one(port):
        results[port] = connect(addr, port, timeout_s)

    threads = [threading.Thread(target=one, args=(port,)) for port in ports]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [results[p] for p in ports]


def route_to(addr):
    proc = subprocess.run(["ip", "-j", "route", "get", addr], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        return None, proc.stderr.strip() or "no route"
    route = parse_ip_route_get(proc.stdout)
    if route is None:
        return None, "no route"
    route["nic"] = route["dev"]
    if route["local"]:
        addrs = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=False)
        route["nic"] = nic_holding(parse_ip_addr(addrs.stdout), addr) or route["dev"]
    return route, None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            master_addr=dict(type="str", required=True),
            ports=dict(type="list", elements="int", default=[]),
            timeout_s=dict(type="float", default=3),
            listener_pid=dict(type="int"),
            listener_wait_s=dict(type="float", default=5),
        ),
        supports_check_mode=True,
    )
    p = module.params
    route, route_error = route_to(p["master_addr"])
    ports = connect_all(p["master_addr"], p["ports"], p["timeout_s"])
    result = dict(changed=False, route=route, route_error=route_error, ports=ports)
    if p["listener_pid"]:
        result["listener"] = stop_listener(p["listener_pid"], p["listener_wait_s"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
