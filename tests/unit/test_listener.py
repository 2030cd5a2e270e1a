"""The master's short-lived listener: real sockets on loopback."""
from __future__ import annotations

import multiprocessing
import os
import socket
import time

from ansible_collections.torchfleet.fleet.plugins.module_utils.host.listener import _is_listener, start_listener, stop_listener

from lab.ports import free_port



def wait_gone(pid, timeout_s=5):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and _is_listener(pid):
        time.sleep(0.05)
    return not _is_listener(pid)


def test_listener_accepts_then_exits_after_expected_peers():
    port = free_port()
    started = start_listener([port], expect=2, idle_s=30)
    assert started["ports"] == [{"port": port, "bound": True, "error": None}]
    with open("/proc/%d/cmdline" % started["pid"], "rb") as f:  # named by its ports
        assert b"torchfleet-port-listener\0%d\0" % port in f.read()
    for _ in range(2):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert wait_gone(started["pid"])
    assert stop_listener(started["pid"], 0.1) == "gone"


def test_a_bound_port_is_reported_not_raised():
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        started = start_listener([port], expect=1, idle_s=5)
    assert started["pid"] is None
    assert started["ports"][0]["bound"] is False and started["ports"][0]["error"]


def test_stop_listener_ends_a_listener_nobody_reached():
    started = start_listener([free_port()], expect=1, idle_s=60)
    assert _is_listener(started["pid"])
    assert stop_listener(started["pid"], 0.2) == "stopped"
    assert wait_gone(started["pid"])


def test_stop_listener_never_signals_a_foreign_pid():
    assert stop_listener(os.getpid(), 0.1) == "gone"
    assert _is_listener(os.getpid()) is False



def _burn(stop):
    while not stop.is_set():
        pass


def test_a_listener_stopped_right_after_it_started_is_stopped_even_under_load():
    """start_listener returns only once the child runs the accept loop, so the stop that follows
    finds it (CI once saw 'gone' here while /proc still showed the parent's command line)."""
    stop = multiprocessing.Event()
    burners = [multiprocessing.Process(target=_burn, args=(stop,)) for _ in range(4)]
    for b in burners:
        b.start()
    try:
        for _ in range(10):
            started = start_listener([free_port()], expect=1, idle_s=60)
            assert _is_listener(started["pid"])
            assert stop_listener(started["pid"], 0) == "stopped"
            assert wait_gone(started["pid"])
    finally:
        stop.set()
        for b in burners:
            b.join()


def test_the_listener_lives_while_connections_keep_arriving():
    """Its life counts from the last connection: hosts that arrive in fork batches, each within
    idle_s of the one before, all find it, however long all of them take."""
    port = free_port()
    started = start_listener([port], expect=6, idle_s=3)
    try:
        for _ in range(5):  # 5 s in all, longer than idle_s, one connection per second
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            time.sleep(1.0)
            assert _is_listener(started["pid"])
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # the sixth: done
        assert wait_gone(started["pid"])
    finally:
        stop_listener(started["pid"], 0)


def test_a_listener_nobody_reaches_ends_after_idle_s():
    started = start_listener([free_port()], expect=1, idle_s=0.5)
    assert wait_gone(started["pid"], timeout_s=30)
