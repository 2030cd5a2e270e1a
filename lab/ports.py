"""Free ports for the tests' and benchmarks' runs.

A port the kernel hands out for bind(0) lies in the ephemeral range, which the kernel also draws
from for every outgoing connection and every gloo/TCPStore listener of other runs on this
machine (tests run in parallel): between our check and torchrun's bind such a port can be taken.
Ports are drawn below that range instead, where the kernel never hands one out on its own, and a
process never gets the same one twice."""
from __future__ import annotations

import random
import socket

from ansible_collections.torchfleet.fleet.plugins.module_utils.host.net import ephemeral_range

_given: set[int] = set()


def _bindable(port):
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_port():
    low = (ephemeral_range() or (32768, 60999))[0]
    if low > 11000:
        for _ in range(200):
            port = random.randrange(10000, low)
            if port not in _given and _bindable(port):
                _given.add(port)
                return port
    with socket.socket() as s:  # a machine whose ephemeral range starts low: the kernel's pick
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]
