"""The run's control channel: the master's store serves, every host's agent dials in.

One TCP listener on the master, bound to the master's address on the chosen NIC only and open
for the run's lifetime only. Anyone on the network can connect to it, so every byte that
arrives is hostile until verified, and nothing that arrives can raise out of the loop that
steps the channel: each byte sequence ends as a verified message or as its connection closed
and counted in `refused`.

A connection, both ends keyed with the host's key: HMAC of the run's secret (made per run on
the controller) and the host's name. The master's agent alone holds the secret; every other
agent is handed only its own key (`host_key`, the launch role's `host_key` filter), so a host
of the run can speak only as itself:

    agent  -> master   <cnonce> <host>\\n                32 hex digits, fresh per connection, and
                                                         the name whose key the rest is signed with
    master -> agent    0 <mac> {"nonce": <snonce>}\\n    signed over the agent's cnonce: only a
                                                         holder of the key can greet, and a
                                                         recorded greeting does not verify again
    agent  -> master   1 <mac> {"t": "hello", ...}\\n     then every message, both ways:
                       <seq> <mac> <body JSON>\\n

<mac> is HMAC-SHA256 over (direction, the connection's nonce = cnonce:snonce, seq, the body's
bytes as sent). The frame is checked before the body is parsed: an outsider's bytes never
reach the JSON parser. Sequence numbers only rise, so a message cannot be replayed on its
connection, and the nonce makes it worthless on any other.

Bounds on what an outsider controls: the first line (MAX_FIRST_LINE bytes), a line of an authenticated peer
(MAX_LINE), the time from accept to a verified hello (HELLO_S), how many connections may wait
unauthenticated at once (per source address and in all; the oldest goes first, but never a
run host's to make room for another address's: an outsider's flood from many addresses
cannot push out an agent's handshake), how many connections are accepted per step. The master raises its descriptor limit to what the host
allows, so idle connections cannot starve the agents.

Single-threaded on purpose: one loop steps each end; no locks.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import selectors
import socket
import time

TO_MASTER, TO_AGENT = "agent->master", "master->agent"
MAX_LINE = 1 << 16          # an authenticated peer's line
MAX_FIRST_LINE = 300        # an unauthenticated peer's first line (nonce and name)
HELLO_S = 5.0               # accept -> verified hello, or the connection goes
MAX_PENDING = 256           # unauthenticated connections at once, in all
MAX_PENDING_PER_ADDR = 16   # ... and from one address
ACCEPT_PER_STEP = 64
MAX_DEPTH = 8               # JSON nesting of a verified body (ours are 3 deep at most)

FIRST_LINE = re.compile(rb"^([0-9a-f]{32}) (\S{1,255})$")
FRAME = re.compile(rb"^(0|[1-9][0-9]{0,17}) ([0-9a-f]{64}) (\{.*\})$", re.S)

# Why a connection was refused, counted on the master (and reported in the run's record).
REFUSALS = ("garbled", "unsigned", "replayed", "too_long", "no_hello", "over_cap")


def host_key(secret, host):
    """The key a host's agent signs with (bytes): its name under the run's secret."""
    return hmac.new(secret, b"host|" + host.encode(), hashlib.sha256).hexdigest().encode()


def _mac(secret, direction, nonce, seq, payload):
    text = "%s|%s|%d|" % (direction, nonce, seq)
    # (hmac.digest: the one-shot C HMAC, a third of hmac.new()'s cost per message)
    return hmac.digest(secret, text.encode() + payload, hashlib.sha256).hex().encode()


def encode(body):
    """A body's bytes as signed and sent."""
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def seal(secret, direction, nonce, seq, body, payload=None):
    """One signed line; payload: encode(body) when the caller has it already (a broadcast
    encodes once for every host)."""
    payload = encode(body) if payload is None else payload
    return b"%d %s %s\n" % (seq, _mac(secret, direction, nonce, seq, payload), payload)


def _depth(value, limit):
    """True when value nests no deeper than limit."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return False
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return True


def open_line(secret, direction, nonce, last_seq, line):
    """(seq, body) of a line signed with the secret on this connection after last_seq, else
    the refusal's name (REFUSALS). Never raises, whatever the bytes."""
    if len(line) > MAX_LINE:
        return "too_long"
    frame = FRAME.match(line)
    if frame is None:
        return "garbled"
    seq, mac, payload = int(frame.group(1)), frame.group(2), frame.group(3)
    if not hmac.compare_digest(mac, _mac(secret, direction, nonce, seq, payload)):
        return "unsigned"
    if seq <= last_seq:
        return "replayed"
    try:  # signed by a holder of the secret: still parsed within bounds
        body = json.loads(payload)
    except (ValueError, RecursionError):
        return "garbled"
    if not isinstance(body, dict) or not _depth(body, MAX_DEPTH):
        return "garbled"
    return seq, body


def unseal(secret, direction, nonce, last_seq, line):
    """(seq, body), or None for anything else (wrong key, replayed, garbled)."""
    opened = open_line(secret, direction, nonce, last_seq, line)
    return opened if isinstance(opened, tuple) else None


class _Peer:
    """One TCP connection's buffers, nonce and sequence numbers."""

    def __init__(self, sock, addr="", accepted_m=0.0):
        self.sock, self.addr, self.accepted_m = sock, addr, accepted_m
        self.cnonce = None   # the agent's half
        self.key = None      # the key of the host it named (master's end)
        self.claimed = None  # that host
        self.nonce = None    # cnonce:snonce once the greeting is sent (master) or verified
        self.inbuf, self.outbuf = b"", b""
        self.seq_in, self.seq_out = 0, 0
        self.host = None     # set by a verified hello (master's end)

    def read_lines(self, max_line):
        """Complete lines received so far; None when the peer closed or broke the connection,
        'too_long' when a line outgrew max_line."""
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError:
            return None
        if not data:
            return None
        self.inbuf += data
        *lines, self.inbuf = self.inbuf.split(b"\n")
        if len(self.inbuf) > max_line or any(len(line) > max_line for line in lines):
            return "too_long"
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
    """The master's end. handle(host, body) is the store's callback for every verified message
    from a host; it may return a reply body. closed(host) is called when a host's connection
    ends."""

    def __init__(self, addr, port, secret, trusted=(), hosts=None):
        self.secret = secret
        # The run's hosts: only they may connect (None: any name, keyed from the secret).
        self.hosts = None if hosts is None else frozenset(hosts)
        self.trusted = frozenset(trusted)  # the run's hosts' addresses
        raise_fd_limit()
        # The listener first: a port in use raises before anything else is opened.
        self.listener = socket.create_server((addr, port), family=_family(addr), backlog=4096,
                                             reuse_port=False)
        self.sel = selectors.DefaultSelector()
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        self.peers = {}    # socket -> _Peer
        self.by_host = {}  # host -> _Peer (the newest connection of that host)
        self.refused = dict.fromkeys(REFUSALS, 0)

    def step(self, timeout_s, handle, closed=None):
        for key, _events in self.sel.select(timeout_s):
            if key.data is None:
                self._accept()
            else:
                self._read(key.data, handle, closed)
        now = time.monotonic()
        for peer in list(self.peers.values()):
            if peer.host is None and now - peer.accepted_m > HELLO_S:
                self._drop(peer, "no_hello", closed)
            elif peer.outbuf and not peer.flush():
                self._drop(peer, None, closed)

    def _read(self, peer, handle, closed):
        lines = peer.read_lines(MAX_LINE)
        if lines is None:  # closed: an agent's ends its connection; an outsider's never spoke
            return self._drop(peer, None if peer.host else "no_hello", closed)
        if lines == "too_long" or peer.cnonce is None and not lines \
                and len(peer.inbuf) > MAX_FIRST_LINE:
            return self._drop(peer, "too_long", closed)
        for line in lines:
            if peer.sock not in self.peers:
                return None
            if peer.cnonce is None:
                if len(line) > MAX_FIRST_LINE:
                    return self._drop(peer, "too_long", closed)
                first = FIRST_LINE.match(line)
                if first is None:
                    return self._drop(peer, "garbled", closed)
                try:
                    claimed = first.group(2).decode()
                except UnicodeDecodeError:
                    return self._drop(peer, "garbled", closed)
                if self.hosts is not None and claimed not in self.hosts:
                    return self._drop(peer, "unsigned", closed)  # no key for that name
                peer.cnonce, peer.claimed = first.group(1).decode(), claimed
                peer.key = host_key(self.secret, claimed)
                snonce = os.urandom(16).hex()
                peer.outbuf += seal(peer.key, TO_AGENT, peer.cnonce, 0, {"nonce": snonce})
                peer.nonce = "%s:%s" % (peer.cnonce, snonce)
                peer.flush()
                continue
            opened = open_line(peer.key, TO_MASTER, peer.nonce, peer.seq_in, line)
            if not isinstance(opened, tuple):
                return self._drop(peer, opened, closed)
            peer.seq_in, body = opened
            if peer.host is None:
                host = body.get("host")
                if body.get("t") != "hello" or host != peer.claimed:
                    return self._drop(peer, "garbled", closed)
                old = self.by_host.get(host)
                peer.host = host
                self.by_host[host] = peer
                if old is not None and old is not peer:
                    self._drop(old, None, None)  # replaced, not closed: the host is here
            reply = handle(peer.host, body)
            if reply is not None:
                self._send(peer, reply)
        return None

    def broadcast(self, body):
        payload = encode(body)
        for peer in list(self.by_host.values()):
            self._send(peer, body, payload)
            if not peer.flush():
                self._drop(peer, None, None)

    def close(self):
        for peer in list(self.peers.values()):
            peer.flush()
            self._drop(peer, None, None)
        self.sel.unregister(self.listener)
        self.listener.close()
        self.sel.close()

    def _accept(self):
        for _attempt in range(ACCEPT_PER_STEP):
            try:
                sock, address = self.listener.accept()
            except OSError:  # nothing waiting, or out of descriptors: next step
                return
            sock.setblocking(False)
            peer = _Peer(sock, address[0], time.monotonic())
            self._make_room(peer.addr)
            self.peers[sock] = peer
            self.sel.register(sock, selectors.EVENT_READ, peer)

    def _make_room(self, addr):
        """Drop the oldest unauthenticated connections over the caps: an outsider's flood
        pushes out its own connections, not the agents' (one each, from their own address).
        The cap over all addresses never drops a run host's pending handshake: a flood from
        many addresses would otherwise push out an agent in its first moments."""
        pending = [p for p in self.peers.values() if p.host is None]
        mine = [p for p in pending if p.addr == addr]
        for peer in mine[:max(0, len(mine) + 1 - MAX_PENDING_PER_ADDR)]:
            self._drop(peer, "over_cap", None)
            pending.remove(peer)
        others = [p for p in pending if p.addr not in self.trusted]
        for peer in others[:max(0, len(pending) + 1 - MAX_PENDING)]:
            self._drop(peer, "over_cap", None)

    def _send(self, peer, body, payload=None):
        peer.seq_out += 1
        peer.outbuf += seal(peer.key, TO_AGENT, peer.nonce, peer.seq_out, body, payload)

    def _drop(self, peer, why, closed):
        if self.peers.pop(peer.sock, None) is None:
            return None
        if why is not None:
            self.refused[why] += 1
        if peer.host is not None and self.by_host.get(peer.host) is peer:
            del self.by_host[peer.host]
            if closed is not None:
                closed(peer.host)
        try:
            self.sel.unregister(peer.sock)
        except (KeyError, ValueError):
            pass
        peer.sock.close()
        return None


class Client:
    """A host's end: dials the master, checks its signed greeting, says hello, sends reports,
    hands back what the master sent. `key` is this host's (host_key). last_heard is when the
    master last sent a verified message (monotonic); nothing else counts."""

    def __init__(self, addr, port, key, host, connect_timeout_s=2.0):
        self.addr, self.port, self.key, self.host = addr, port, key, host
        self.connect_timeout_s = connect_timeout_s
        self.peer, self.last_heard, self.error = None, None, None
        self.source = None  # the local address to dial from (None: the kernel's choice)

    @property
    def connected(self):
        return self.peer is not None and self.peer.nonce is not None

    def step(self, timeout_s):
        """Connect when needed, flush what is queued, return the verified bodies received."""
        if self.peer is None:
            try:
                sock = socket.create_connection(
                    (self.addr, self.port), timeout=self.connect_timeout_s,
                    source_address=None if self.source is None else (self.source, 0))
            except OSError as exc:
                self.error = exc.strerror or str(exc)
                time.sleep(timeout_s)
                return []
            sock.setblocking(False)
            self.peer = _Peer(sock)
            self.peer.cnonce = os.urandom(16).hex()
            self.peer.outbuf = ("%s %s\n" % (self.peer.cnonce, self.host)).encode()
        sel = selectors.DefaultSelector()
        try:
            sel.register(self.peer.sock, selectors.EVENT_READ)
            ready = sel.select(timeout_s)
        finally:
            sel.close()
        bodies = []
        if ready:
            lines = self.peer.read_lines(MAX_LINE)
            if lines is None or lines == "too_long":
                self._reset("the master closed the connection" if lines is None
                            else "the master sent a line over %d bytes" % MAX_LINE)
                return []
            for line in lines:
                if self.peer.nonce is None:
                    greeting = unseal(self.key, TO_AGENT, self.peer.cnonce, -1, line)
                    snonce = (greeting or (0, {}))[1].get("nonce")
                    if greeting is None or greeting[0] != 0 or not isinstance(snonce, str):
                        self._reset("the greeting on %s:%d is not signed with the run's secret"
                                    % (self.addr, self.port))
                        return []
                    self.peer.nonce = "%s:%s" % (self.peer.cnonce, snonce)
                    self.last_heard = time.monotonic()
                    self.send({"t": "hello", "host": self.host})
                    continue
                opened = unseal(self.key, TO_AGENT, self.peer.nonce, self.peer.seq_in, line)
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
        self.peer.outbuf += seal(self.key, TO_MASTER, self.peer.nonce, self.peer.seq_out,
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


def raise_fd_limit():
    """The soft descriptor limit up to the hard one: a flood of idle connections must meet the
    pending caps above, not the process's 1024 descriptors."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY
                                                        else max(soft, 65536), hard))
    except (ImportError, ValueError, OSError):
        pass


def _family(addr):
    return socket.AF_INET6 if ":" in addr else socket.AF_INET
