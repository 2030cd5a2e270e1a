"""The control channel (control.py) over real sockets on loopback: who may talk to a run."""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import agent, control
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.control import (
    TO_AGENT, TO_MASTER, Client, Server, seal, unseal)

from lab.ports import free_port

SECRET = b"s3cret-of-this-run"


def key(host):
    return control.host_key(SECRET, host)


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
    a = Client("127.0.0.1", master.port, key("node1"), "node1")
    b = Client("127.0.0.1", master.port, key("node2"), "node2")
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


def _raw_greeting(master, raw, cnonce=b"0" * 32, host=b"node1"):
    """Say a nonce and a name on a raw connection and read the master's greeting line."""
    raw.settimeout(0.05)
    raw.sendall(cnonce + b" " + host + b"\n")
    greeting, deadline = b"", time.monotonic() + 10
    while b"\n" not in greeting and time.monotonic() < deadline:
        master.server.step(0.02, master.handle)
        try:
            greeting += raw.recv(400)
        except socket.timeout:
            pass
    return greeting.rstrip(b"\n")


def _closed_by_master(master, raw, timeout_s=10):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        master.server.step(0.02, master.handle)
        try:
            if raw.recv(100) == b"":
                return True
        except socket.timeout:
            pass
        except OSError:
            return True
    return False


def test_a_client_without_the_secret_is_cut_off_and_changes_nothing(master):
    intruder = Client("127.0.0.1", master.port, b"guessed", "node1")
    master.pump([intruder], lambda got: intruder.peer is None and intruder.error)
    assert "not signed with the run's secret" in intruder.error and intruder.last_heard is None
    assert master.seen == [] and master.server.by_host == {}
    # A raw connection gets a greeting signed over its own nonce; an abort-shaped line without
    # a valid signature after it is dropped and counted.
    with socket.create_connection(("127.0.0.1", master.port), timeout=5) as raw:
        greeting = _raw_greeting(master, raw)
        seq, body = unseal(key("node1"), TO_AGENT, "0" * 32, -1, greeting)
        assert seq == 0 and set(body) == {"nonce"}
        nonce = "0" * 32 + ":" + body["nonce"]
        forged = seal(b"guessed", TO_MASTER, nonce, 1, {"t": "hello", "host": "node1"})
        raw.sendall(forged)
        assert _closed_by_master(master, raw)
    assert master.seen == [] and master.server.refused["unsigned"] == 1


def test_the_lines_that_killed_the_master_before_are_refused_and_counted(master):
    """A non-ASCII MAC (hmac.compare_digest raised TypeError) and a deeply nested line (json
    raised RecursionError) ended the master's agent; now each closes its own connection."""
    lines = [json.dumps({"s": 1, "b": {"t": "beat"}, "m": "\u00e9"}, ensure_ascii=False).encode(),
             b"[" * 50000 + b"]" * 50000, b"1 " + b"\xe9" * 64 + b" {}", b"\xff\xfe\x00"]
    for line in lines:
        with socket.create_connection(("127.0.0.1", master.port), timeout=5) as raw:
            _raw_greeting(master, raw)
            raw.sendall(line + b"\n")
            assert _closed_by_master(master, raw)
    assert master.seen == []
    assert sum(master.server.refused.values()) == len(lines)
    # And the channel still serves the run.
    agent = Client("127.0.0.1", master.port, key("node1"), "node1")
    master.pump([agent], lambda got: "node1" in master.server.by_host)
    agent.close()


def test_idle_connections_are_capped_and_dropped_while_an_agent_keeps_reporting(master):
    agent = Client("127.0.0.1", master.port, key("node1"), "node1")
    master.pump([agent], lambda got: "node1" in master.server.by_host)
    idle = []
    try:
        for _ in range(control.MAX_PENDING_PER_ADDR * 3):
            idle.append(socket.create_connection(("127.0.0.1", master.port), timeout=5))
            master.server.step(0, master.handle)
        agent.send({"t": "beat", "alive": 1})
        master.pump([agent], lambda got: got["node1"])
        pending = [p for p in master.server.peers.values() if p.host is None]
        assert len(pending) <= control.MAX_PENDING_PER_ADDR
        assert master.server.refused["over_cap"] >= control.MAX_PENDING_PER_ADDR * 2
        # Past the hello deadline none is left, and the agent is still heard.
        master.pump([agent], lambda got: not any(p.host is None
                                                 for p in master.server.peers.values()))
        assert master.server.refused["no_hello"] >= 1
        agent.send({"t": "beat", "alive": 2})
        master.pump([agent], lambda got: ("node1", {"t": "beat", "alive": 2}) in master.seen)
    finally:
        for s in idle:
            s.close()
        agent.close()


def test_a_flood_from_many_addresses_cannot_push_out_a_run_hosts_handshake():
    """An agent's connection in its first moments (connected, no hello yet), then more
    unauthenticated connections than the global cap from 20 other loopback addresses: the
    agent's stays, because its address is a run host's, and it then says hello."""
    master = Master()
    master.server.trusted = frozenset({"127.0.0.1"})
    flood = []
    try:
        agent_sock = socket.create_connection(("127.0.0.1", master.port), timeout=5)
        master.pump([], lambda got: any(p.addr == "127.0.0.1"
                                        for p in master.server.peers.values()))
        per_addr = control.MAX_PENDING_PER_ADDR - 1
        for i in range(control.MAX_PENDING // per_addr + 2):
            for _ in range(per_addr):
                flood.append(socket.create_connection(("127.0.0.1", master.port), timeout=5,
                                                      source_address=("127.0.1.%d" % (i + 1), 0)))
                master.server.step(0, master.handle)
        master.pump([], lambda got: master.server.refused["over_cap"] > 0)
        assert any(p.addr == "127.0.0.1" for p in master.server.peers.values())
        agent_sock.close()
        agent = Client("127.0.0.1", master.port, key("node1"), "node1")
        master.pump([agent], lambda got: "node1" in master.server.by_host)
        agent.close()
    finally:
        for s in flood:
            s.close()
        master.server.close()


def test_a_replayed_or_reordered_message_is_refused():
    nonce = "abcd"
    line = seal(SECRET, TO_MASTER, nonce, 5, {"t": "exit", "rc": 1})
    assert unseal(SECRET, TO_MASTER, nonce, 4, line) == (5, {"t": "exit", "rc": 1})
    assert unseal(SECRET, TO_MASTER, nonce, 5, line) is None  # replayed on its connection
    assert unseal(SECRET, TO_MASTER, "other", 0, line) is None  # replayed on another
    assert unseal(b"other key", TO_MASTER, nonce, 0, line) is None
    assert unseal(SECRET, TO_AGENT, nonce, 0, line) is None  # reflected back to its sender
    forged = line.replace(b'"rc":1', b'"rc":0')
    assert forged != line and unseal(SECRET, TO_MASTER, nonce, 0, forged) is None


def test_a_fake_master_cannot_greet_an_agent_or_keep_it_from_deciding_the_master_is_lost():
    """Anything that answers on the port without the secret (an old greeting replayed, a
    greeting signed with another key, garbage) is not the master: last_heard stays unset."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    old = seal(key("node1"), TO_AGENT, "1" * 32, 0, {"nonce": "2" * 32})  # recorded elsewhere
    try:
        for answer in (old, seal(b"guessed", TO_AGENT, "x", 0, {"nonce": "y"}),
                       b'{"nonce": "abc"}\n', b"\x00" * 100 + b"\n"):
            agent = Client("127.0.0.1", port, key("node1"), "node1")
            agent.step(0.01)  # connects and queues its nonce
            conn, _ = listener.accept()
            conn.sendall(answer)
            deadline = time.monotonic() + 10
            while agent.peer is not None and time.monotonic() < deadline:
                agent.step(0.02)
            conn.close()
            assert agent.peer is None and agent.last_heard is None
            assert "not signed with the run's secret" in agent.error
    finally:
        listener.close()


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
    first = Client("127.0.0.1", master.port, key("node1"), "node1")
    master.pump([first], lambda got: "node1" in master.server.by_host)
    old_peer = master.server.by_host["node1"]
    second = Client("127.0.0.1", master.port, key("node1"), "node1")
    master.pump([first, second], lambda got: master.server.by_host.get("node1") not in
                (None, old_peer))
    assert len([p for p in master.server.peers.values() if p.host == "node1"]) == 1
    first.close()
    second.close()


def test_the_master_waits_out_a_control_port_held_for_a_moment(monkeypatch):
    # Preflight tested the port; an outgoing connection may take it for a while before the run.
    port = free_port()
    holder = socket.create_server(("127.0.0.1", port))
    monkeypatch.setattr(agent, "BIND_RETRY_S", 30.0)
    threading.Timer(0.5, holder.close).start()
    server = agent.bind_control("127.0.0.1", port, b"k" * 32)
    assert server.listener.getsockname()[1] == port
    server.listener.close()


def test_a_control_port_held_for_good_is_named(monkeypatch):
    port = free_port()
    monkeypatch.setattr(agent, "BIND_RETRY_S", 0.5)
    with socket.create_server(("127.0.0.1", port)):
        with pytest.raises(OSError) as err:
            agent.bind_control("127.0.0.1", port, b"k" * 32)
    assert err.value.errno == 98


def test_a_host_of_the_run_can_speak_only_as_itself():
    """node1's agent holds node1's key only: naming itself node2 (or the master) in its first
    line or its hello gets it nowhere, and a name outside the run is refused at once."""
    m = Master()
    m.server.close()
    m.server = Server("127.0.0.1", m.port, SECRET, hosts=["node0", "node1", "node2"])
    try:
        for claimed in ("node2", "node0"):
            posing = Client("127.0.0.1", m.port, key("node1"), claimed)
            m.pump([posing], lambda got, c=posing: c.peer is None and c.error)
            assert "not signed" in posing.error and posing.last_heard is None
        with socket.create_connection(("127.0.0.1", m.port), timeout=5) as raw:
            # Greeted as node1, then a hello signed with node1's key that says node2.
            greeting = _raw_greeting(m, raw, host=b"node1")
            _seq, body = unseal(key("node1"), TO_AGENT, "0" * 32, -1, greeting)
            nonce = "0" * 32 + ":" + body["nonce"]
            raw.sendall(seal(key("node1"), TO_MASTER, nonce, 1, {"t": "hello", "host": "node2"}))
            assert _closed_by_master(m, raw)
        with socket.create_connection(("127.0.0.1", m.port), timeout=5) as raw:
            raw.settimeout(0.05)
            raw.sendall(b"0" * 32 + b" outsider\n")
            assert _closed_by_master(m, raw)
        assert m.seen == [] and m.server.by_host == {}
        # The posers hung up on a greeting they could not verify; the hello naming another
        # host is garbled; the outsider's name has no key.
        assert (m.server.refused["no_hello"], m.server.refused["garbled"],
                m.server.refused["unsigned"]) == (2, 1, 1)
        honest = Client("127.0.0.1", m.port, key("node1"), "node1")
        m.pump([honest], lambda got: "node1" in m.server.by_host)
        honest.close()
    finally:
        m.server.close()


def test_the_launch_roles_filter_makes_the_key_the_master_derives():
    from ansible_collections.torchfleet.fleet.plugins.filter.host_key import FilterModule

    made = FilterModule().filters()["host_key"]("s3cret-of-this-run", "node7")
    assert made.encode() == key("node7") and len(made) == 64 and made != key("node1").decode()
