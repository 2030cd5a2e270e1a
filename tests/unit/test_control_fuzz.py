"""Property-based tests of the control channel: whatever bytes reach either end, each ends as a
verified message or as that connection closed, never as an exception out of the loop.

The same properties run longer in bench/ (the fuzz campaign: inputs tried on each end, crashes).
"""
from __future__ import annotations

import json
import socket
import time

from ansible_collections.torchfleet.fleet.plugins.module_utils.run import control
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.control import (
    TO_AGENT, TO_MASTER, Client, Server, host_key, open_line, seal)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab.ports import free_port
from tests.conftest import examples

SECRET = b"fuzzed-run-secret"
NONCE = "a" * 32 + ":" + "b" * 32
FUZZ = settings(max_examples=examples(300), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=30)
bodies = st.dictionaries(st.text(max_size=8), json_values, max_size=5)


@FUZZ
@given(st.binary(max_size=2000), st.integers(-1, 10))
def test_arbitrary_bytes_never_raise_and_never_open(line, last_seq):
    assert isinstance(open_line(SECRET, TO_MASTER, NONCE, last_seq, line), str)


@FUZZ
@given(bodies, st.integers(1, 1 << 40), st.data())
def test_a_mutated_valid_message_never_opens(body, seq, data):
    line = seal(SECRET, TO_MASTER, NONCE, seq, body).rstrip(b"\n")
    assert open_line(SECRET, TO_MASTER, NONCE, seq - 1, line) == (seq, json.loads(
        json.dumps(body)))
    at = data.draw(st.integers(0, len(line) - 1))
    byte = data.draw(st.integers(0, 255).filter(lambda b: b != line[at]))
    mutated = line[:at] + bytes([byte]) + line[at + 1:]
    assert isinstance(open_line(SECRET, TO_MASTER, NONCE, seq - 1, mutated), str)
    assert isinstance(open_line(SECRET, TO_MASTER, NONCE, seq - 1, line[:at]), str)


@FUZZ
@given(json_values)
def test_any_signed_json_opens_to_a_bounded_dict_or_is_refused(value):
    line = seal(SECRET, TO_AGENT, NONCE, 1, value).rstrip(b"\n")
    opened = open_line(SECRET, TO_AGENT, NONCE, 0, line)
    assert isinstance(opened, str) or (isinstance(opened[1], dict)
                                       and control._depth(opened[1], control.MAX_DEPTH))


class _Master:
    def __init__(self):
        self.port = free_port()
        self.server = Server("127.0.0.1", self.port, SECRET)
        self.heard = []

    def handle(self, host, body):
        self.heard.append((host, body))


MASTER = None


def _master():
    global MASTER
    if MASTER is None:
        MASTER = _Master()
    return MASTER


@settings(max_examples=examples(120), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=6), st.booleans())
def test_the_masters_loop_survives_any_bytes_on_a_connection(chunks, say_nonce):
    """Raw bytes from the first byte on, or after a well-formed first line (nonce, name)."""
    m = _master()
    if say_nonce:
        chunks = [b"c" * 32 + b" node1\n"] + chunks
    with socket.create_connection(("127.0.0.1", m.port), timeout=5) as raw:
        for chunk in chunks:
            try:
                raw.sendall(chunk)
            except OSError:
                break  # already dropped
            m.server.step(0.01, m.handle)
        m.server.step(0.01, m.handle)
    for _ in range(5):
        m.server.step(0.01, m.handle)
    assert m.heard == [] and m.server.by_host == {}


@settings(max_examples=examples(120), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=4))
def test_an_agent_survives_any_bytes_from_a_fake_master(chunks):
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        agent = Client("127.0.0.1", listener.getsockname()[1], host_key(SECRET, "node1"),
                       "node1")
        agent.step(0)
        conn, _ = listener.accept()
        with conn:
            for chunk in chunks:
                try:
                    conn.sendall(chunk)
                except OSError:
                    break
                agent.step(0.01)
        deadline = time.monotonic() + 2
        while agent.error is None and time.monotonic() < deadline:
            agent.step(0.01)
        assert agent.last_heard is None and not agent.connected
    finally:
        listener.close()
