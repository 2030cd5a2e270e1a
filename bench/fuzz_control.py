"""Hostile bytes on the control channel: the fuzz campaign (many inputs at each end, crashes
counted) and a flood (Flood: garbage lines and idle connections at a bounded rate) for the
flooded-run measure.

The master's end gets arbitrary bytes, arbitrary JSON bodies and mutated valid messages through
the frame reader, and raw byte streams over real connections to a Server; the agent's end gets
the same as greetings and messages from a fake master over real connections. A crash is any
exception out of the code under test. Seeded: the same inputs every run.
"""
from __future__ import annotations

import json
import random
import socket
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _control():
    from ansible_collections.torchfleet.fleet.plugins.module_utils.run import control

    return control


def _random_json(rng, depth=0):
    kind = rng.randrange(7 if depth < 12 else 4)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() * 10 ** rng.randrange(-3, 20)
    if kind == 2:
        return "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(12)))
    if kind == 3:
        return rng.randrange(-(1 << 70), 1 << 70)
    if kind in (4, 5):
        return {str(rng.randrange(100)): _random_json(rng, depth + 1)
                for _ in range(rng.randrange(4))}
    return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]


def inputs(rng, control, secret, direction, nonce, n):
    """n lines: a third raw bytes, a third signed JSON of any shape, a third mutated valid."""
    for i in range(n):
        if i % 3 == 0:
            yield bytes(rng.randrange(256) for _ in range(rng.randrange(300)))
        elif i % 3 == 1:
            yield control.seal(secret, direction, nonce, rng.randrange(1, 99),
                               _random_json(rng)).rstrip(b"\n")
        else:
            line = bytearray(control.seal(secret, direction, nonce, 5, {"t": "beat", "alive": 1})
                             .rstrip(b"\n"))
            for _ in range(rng.randrange(1, 4)):
                line[rng.randrange(len(line))] = rng.randrange(256)
            yield bytes(line)


def campaign(lines=20000, connections=300, seed=1):
    control = _control()
    rng = random.Random(seed)
    secret, nonce = b"bench-secret", "a" * 32 + ":" + "b" * 32
    tried = {"master": 0, "agent": 0}
    crashes = {"master": 0, "agent": 0}
    for end, direction in (("master", control.TO_MASTER), ("agent", control.TO_AGENT)):
        for line in inputs(rng, control, secret, direction, nonce, lines):
            tried[end] += 1
            try:
                control.open_line(secret, direction, nonce, 0, line)
            except Exception:  # noqa: BLE001 - counting crashes is the point
                crashes[end] += 1
    # Over real connections: a Server fed byte streams, a Client fed by a fake master.
    server = control.Server("127.0.0.1", 0, secret)
    port = server.listener.getsockname()[1]
    heard = []
    for i in range(connections):
        stream = list(inputs(rng, control, secret, control.TO_MASTER, nonce, 3))
        if i % 2:
            stream.insert(0, b"c" * 32 + b" node1")
        tried["master"] += 1
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
                raw.sendall(b"\n".join(stream) + b"\n")
                for _ in range(3):
                    server.step(0.01, lambda host, body: heard.append(body))
            server.step(0.01, lambda host, body: heard.append(body))
        except OSError:
            pass  # dropped by the master mid-send: a refusal, not a crash
        except Exception:  # noqa: BLE001
            crashes["master"] += 1
    server.close()
    listener = socket.create_server(("127.0.0.1", 0))
    for _ in range(connections):
        tried["agent"] += 1
        try:
            agent = control.Client("127.0.0.1", listener.getsockname()[1],
                                   control.host_key(secret, "node1"), "node1")
            agent.step(0)
            conn, _ = listener.accept()
            with conn:
                for line in inputs(rng, control, secret, control.TO_AGENT,
                                   "x" * 32 + ":" + "y" * 32, 3):
                    try:
                        conn.sendall(line + b"\n")
                    except OSError:
                        break  # the agent hung up on the fake master: a refusal
                    agent.step(0.005)
            agent.step(0.005)
            if agent.last_heard is not None:
                crashes["agent"] += 1  # heard something unverified: as bad as a crash
            agent.close()
        except Exception:  # noqa: BLE001
            crashes["agent"] += 1
    listener.close()
    return {"inputs_master": tried["master"], "inputs_agent": tried["agent"],
            "crashes_master": crashes["master"], "crashes_agent": crashes["agent"],
            "verified_from_outsiders": len(heard)}


class Flood(threading.Thread):
    """Another process on the network: garbage lines on fresh connections at about rate_hz,
    and up to `idle` connections held open without a word, until done is set."""

    # The third: a well-formed first line naming a host of the run (node0), then a forged
    # frame, which is refused as unsigned.
    GARBAGE = [b'{"s": 1, "b": {"t": "beat"}, "m": "\xc3\xa9"}', b"[" * 60000,
               b"0" * 32 + b" node0\n1 " + b"f" * 64 + b' {"t": "abort"}', bytes(range(256))]

    def __init__(self, addr, port, rate_hz=200.0, idle=300):
        super().__init__(daemon=True)
        self.addr, self.port, self.rate_hz, self.idle = addr, port, rate_hz, idle
        self.done, self.sent = threading.Event(), 0

    def run(self):
        held = []
        try:
            while not self.done.wait(1.0 / self.rate_hz):
                try:
                    if len(held) < self.idle:
                        held.append(socket.create_connection((self.addr, self.port), 2))
                    with socket.create_connection((self.addr, self.port), 2) as s:
                        s.sendall(self.GARBAGE[self.sent % len(self.GARBAGE)] + b"\n")
                        self.sent += 1
                except OSError:
                    time.sleep(0.05)  # not listening yet, or the master dropped it
        finally:
            for s in held:
                s.close()


if __name__ == "__main__":
    print(json.dumps(campaign(int(sys.argv[1]) if len(sys.argv) > 1 else 20000)))
