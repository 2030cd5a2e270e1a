"""The control channel (control.py) over real sockets on loopback: who may talk to a run."""
from __future__ import annotations

import json
import socket
import time

import pytest
from ansible.module_utils.torchfleet.control import (
    TO_MASTER, Client, Server, seal, unseal)

from tests.unit.test_listener import free_port

SECRET = b"s3cret-of-this-run"


class Master:
    """A Server and what it was told, stepped by the test (as the agent's loop steps it)."""

    def __init__(self, addr="127.0.0.1"):
        self.port = free_port()
        self.server = Server(addr, self.port, SECRET)
        self.seen = []

    def handle(self, host, body):
        self.seen.append((host, body))
        return {"t": "ack", "phase": "running"}

    def pump(self, clients, until, timeout_s=20):
        """Step everyone until until() holds (a condition, not a guess of how long it takes)."""
        deadline = time.monotonic() + timeout_s
        got = {c.host: [] for c in clients}
        while time.monotonic() < deadline:
            self.server.step(0.02, self.handle)
            for c in clients:
                got[c.host].extend(c.step(0.02))
            if until(got):
                return got
        pytest.fail("condition not reached; master saw %s, clients got %s" % (self.seen, got))


@pytest.fixture
def master():
    m = Master()
    yield m
    m.server.close()


def test_hello_beat_and_ack_then_an_abort_reaches_every_host(master):
    a = Client("127.0.0.1", master.port, SECRET, "node1")
    b = Client("127.0.0.1", master.port, SECRET, "node2")
    master.pump([a, b], lambda got: a.connected and b.connected)
    a.send({"t": "beat", "alive": 2})
    got = master.pump([a, b], lambda got: got["node1"])
    assert ("node1", {"t": "beat", "alive": 2}) in master.seen
    assert got["node1"][-1] == {"t": "ack", "phase": "running"}
    master.pump([a, b], lambda got: len(master.server.by_host) == 2)
    master.server.broadcast({"t": "abort", "failure": {"host": "node1"}})
    got = master.pump([a, b], lambda got: got["node1"] and got["node2"])
    assert got["node1"][0]["t"] == got["node2"][0]["t"] == "abort"
    a.close()
    b.close()


def test_a_client_without_the_secret_is_cut_off_and_changes_nothing(master):
    intruder = Client("127.0.0.1", master.port, b"guessed", "node1")
    master.pump([intruder], lambda got: intruder.peer is None and intruder.error)
    assert master.seen == [] and master.server.by_host == {}
    # A raw connection that sends an abort-shaped line without a valid signature: dropped too.
    with socket.create_connection(("127.0.0.1", master.port), timeout=5) as raw:
        raw.settimeout(0.05)
        greeting, deadline = b"", time.monotonic() + 10
        while b"\n" not in greeting and time.monotonic() < deadline:
            master.server.step(0.02, master.handle)
            try:
                greeting += raw.recv(200)
            except socket.timeout:
                pass
        nonce = json.loads(greeting)["nonce"]
        raw.sendall(json.dumps({"s": 1, "b": {"t": "hello", "host": "node1"},
                                "m": "0" * 64}).encode() + b"\n")
        deadline = time.monotonic() + 10
        closed = False
        while time.monotonic() < deadline and not closed:
            master.server.step(0.02, master.handle)
            try:
                closed = raw.recv(100) == b""
            except socket.timeout:
                pass
        assert closed and nonce
    assert master.seen == []


def test_a_replayed_or_reordered_message_is_refused():
    nonce = "abcd"
    line = seal(SECRET, TO_MASTER, nonce, 5, {"t": "exit", "rc": 1})
    assert unseal(SECRET, TO_MASTER, nonce, 4, line) == (5, {"t": "exit", "rc": 1})
    assert unseal(SECRET, TO_MASTER, nonce, 5, line) is None  # replayed on its connection
    assert unseal(SECRET, TO_MASTER, "other", 0, line) is None  # replayed on another
    assert unseal(b"other key", TO_MASTER, nonce, 0, line) is None
    forged = json.loads(line)
    forged["b"]["rc"] = 0
    assert unseal(SECRET, TO_MASTER, nonce, 0, json.dumps(forged).encode()) is None


def test_the_server_listens_on_the_masters_address_only():
    m = Master("127.0.0.1")
    try:
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.2", m.port), timeout=2).close()
        socket.create_connection(("127.0.0.1", m.port), timeout=2).close()
    finally:
        m.server.close()
    # Closed with the run: nothing listens there any more.
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", m.port), timeout=2).close()


def test_a_reconnecting_host_replaces_its_old_connection(master):
    first = Client("127.0.0.1", master.port, SECRET, "node1")
    master.pump([first], lambda got: "node1" in master.server.by_host)
    old_peer = master.server.by_host["node1"]
    second = Client("127.0.0.1", master.port, SECRET, "node1")
    master.pump([first, second], lambda got: master.server.by_host.get("node1") not in
                (None, old_peer))
    assert len([p for p in master.server.peers.values() if p.host == "node1"]) == 1
    first.close()
    second.close()
