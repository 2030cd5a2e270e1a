"""The run's control channel: the master's agent serves, every other host's agent dials in.

One TCP listener on the master, bound to the master's address on the chosen NIC only and open
for the run's lifetime only. Messages are JSON lines; each carries an HMAC-SHA256 over
(direction, the connection's nonce, a sequence number, the body) keyed with the run's secret,
which the controller makes per run and hands to the agents as a module argument. A process
without the secret can neither report for a host, nor abort a run, nor fake progress; a
captured message cannot be replayed on another connection (new nonce) or on the same one (its
sequence number has passed). No message carries a rank's environment.

Messages from an agent: hello {host}, beat {alive, progress_ts, last_line, pid},
exit {rc, stopped, vanished, root_cause, last_line}, not_started {detail}.
From the master: ack {phase} after each beat, abort {failure, dump} to every host at once.

Single-threaded on purpose: the agent's one loop calls step(); no locks, one owner of the
state (runstate.RunState on the master).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import selectors
import socket
import time

TO_MASTER, TO_AGENT = "agent->master", "master->agent"
MAX_LINE = 1 << 16


def _mac(secret, direction, nonce, seq, payload):
    text = "%s|%s|%d|" % (direction, nonce, seq)
    return hmac.new(secret, text.encode() + payload, hashlib.sha256).hexdigest()


def _canonical(body):
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def seal(secret, direction, nonce, seq, body):
    """One signed line."""
    return json.dumps({"s": seq, "b": body, "m": _mac(secret, direction, nonce, seq,
                                                      _canonical(body))}).encode() + b"\n"


def unseal(secret, direction, nonce, last_seq, line):
    """(seq, body) of a line signed with the secret on this connection, after last_seq; None
    for anything else (wrong key, replayed, garbled)."""
    try:
        msg = json.loads(line)
        seq, body, mac = int(msg["s"]), msg["b"], str(msg["m"])
    except (ValueError, KeyError, TypeError):
        return None
    if seq <= last_seq or not isinstance(body, dict):
        return None
    if not hmac.compare_digest(mac, _mac(secret, direction, nonce, seq, _canonical(body))):
        return None
    return seq, body


class _Peer:
    """One TCP connection's buffers, nonce and sequence numbers."""

    def __init__(self, sock, nonce=None):
        self.sock, self.nonce = sock, nonce
        self.inbuf, self.outbuf = b"", b""
        self.seq_in, self.seq_out = 0, 0
        self.host = None

    def read_lines(self):
        """Lines received so far; None when the peer closed or broke the connection."""
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError:
            return None
        if not data:
            return None
        self.inbuf += data
        if len(self.inbuf) > MAX_LINE and b"\n" not in self.inbuf:
            return None
        *lines, self.inbuf = self.inbuf.split(b"\n")
        return lines

    def flush(self):
        try:
            sent = self.sock.send(self.outbuf) if self.outbuf else 0
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        self.outbuf = self.outbuf[sent:]
        return True


class Server:
    """The master's end. handle(host, body) is the agent loop's callback for every verified
    message from a host; it may return a reply body."""

    def __init__(self, addr, port, secret):
        self.secret = secret
        self.sel = selectors.DefaultSelector()
        self.listener = socket.create_server((addr, port), family=_family(addr), backlog=4096,
                                             reuse_port=False)
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        self.peers = {}  # socket -> _Peer
        self.by_host = {}  # host -> _Peer (the newest connection of that host)

    def step(self, timeout_s, handle):
        for key, _events in self.sel.select(timeout_s):
            if key.data is None:
                self._accept()
                continue
            peer = key.data
            lines = peer.read_lines()
            if lines is None:
                self._drop(peer)
                continue
            for line in lines:
                opened = unseal(self.secret, TO_MASTER, peer.nonce, peer.seq_in, line)
                if opened is None:  # not signed with the run's secret: the peer goes
                    self._drop(peer)
                    break
                peer.seq_in, body = opened
                if peer.host is None:
                    if body.get("t") != "hello" or not isinstance(body.get("host"), str):
                        self._drop(peer)
                        break
                    peer.host = body["host"]
                    old = self.by_host.get(peer.host)
                    if old is not None and old is not peer:
                        self._drop(old)
                    self.by_host[peer.host] = peer
                reply = handle(peer.host, body)
                if reply is not None:
                    self._send(peer, reply)
        for peer in list(self.peers.values()):
            if peer.outbuf and not peer.flush():
                self._drop(peer)

    def broadcast(self, body):
        for peer in list(self.by_host.values()):
            self._send(peer, body)
            if not peer.flush():
                self._drop(peer)

    def close(self):
        for peer in list(self.peers.values()):
            peer.flush()
            self._drop(peer)
        self.sel.unregister(self.listener)
        self.listener.close()
        self.sel.close()

    def _accept(self):
        for _attempt in range(256):
            try:
                sock, _peer = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            sock.setblocking(False)
            peer = _Peer(sock, nonce=os.urandom(16).hex())
            self.peers[sock] = peer
            self.sel.register(sock, selectors.EVENT_READ, peer)
            peer.outbuf = json.dumps({"nonce": peer.nonce}).encode() + b"\n"
            peer.flush()

    def _send(self, peer, body):
        peer.seq_out += 1
        peer.outbuf += seal(self.secret, TO_AGENT, peer.nonce, peer.seq_out, body)

    def _drop(self, peer):
        if self.peers.pop(peer.sock, None) is None:
            return
        if peer.host is not None and self.by_host.get(peer.host) is peer:
            del self.by_host[peer.host]
        try:
            self.sel.unregister(peer.sock)
        except (KeyError, ValueError):
            pass
        peer.sock.close()


class Client:
    """A host's end: dials the master, says hello, sends reports, hands back what the master
    sent. last_heard is when the master last answered (monotonic)."""

    def __init__(self, addr, port, secret, host, connect_timeout_s=2.0):
        self.addr, self.port, self.secret, self.host = addr, port, secret, host
        self.connect_timeout_s = connect_timeout_s
        self.peer, self.last_heard, self.error = None, None, None

    @property
    def connected(self):
        return self.peer is not None and self.peer.nonce is not None

    def step(self, timeout_s):
        """Connect when needed, flush what is queued, return the verified bodies received."""
        if self.peer is None:
            try:
                sock = socket.create_connection((self.addr, self.port),
                                                timeout=self.connect_timeout_s)
            except OSError as exc:
                self.error = exc.strerror or str(exc)
                time.sleep(timeout_s)
                return []
            sock.setblocking(False)
            self.peer = _Peer(sock)
        sel = selectors.DefaultSelector()
        try:
            sel.register(self.peer.sock, selectors.EVENT_READ)
            ready = sel.select(timeout_s)
        finally:
            sel.close()
        bodies = []
        if ready:
            lines = self.peer.read_lines()
            if lines is None:
                self._reset("the master closed the connection")
                return []
            for line in lines:
                if self.peer.nonce is None:
                    try:
                        self.peer.nonce = str(json.loads(line)["nonce"])
                    except (ValueError, KeyError, TypeError):
                        self._reset("the master's greeting was garbled")
                        return []
                    self.last_heard = time.monotonic()
                    self.send({"t": "hello", "host": self.host})
                    continue
                opened = unseal(self.secret, TO_AGENT, self.peer.nonce, self.peer.seq_in, line)
                if opened is None:
                    self._reset("a message not signed with the run's secret")
                    return []
                self.peer.seq_in, body = opened
                self.last_heard = time.monotonic()
                bodies.append(body)
        if self.peer is not None and not self.peer.flush():
            self._reset("the connection to the master broke")
        return bodies

    def send(self, body):
        """Queue a report; dropped when not connected (the next beat says it again)."""
        if not self.connected:
            return False
        self.peer.seq_out += 1
        self.peer.outbuf += seal(self.secret, TO_MASTER, self.peer.nonce, self.peer.seq_out,
                                 body)
        return self.peer.flush() or self._reset("the connection to the master broke")

    def close(self):
        if self.peer is not None:
            self.peer.flush()
            self.peer.sock.close()
            self.peer = None

    def _reset(self, why):
        self.error = why
        if self.peer is not None:
            self.peer.sock.close()
        self.peer = None
        return False


def _family(addr):
    return socket.AF_INET6 if ":" in addr else socket.AF_INET
