"""A short-lived TCP listener on the master, so workers can test reachability of its ports.

The module binds the ports itself (so "address in use" is reported at once), then hands the
sockets to a detached child that accepts connections until each port has seen `expect`
peers, or until `idle_s` pass without a new connection, and exits. Each connection gets one line,
the master's wall clock (`TFCLK <epoch seconds>`), from which a worker measures its clock's
offset (host.clock) with no NTP server. Its life is counted from
the last connection, not from its start, so however many fork batches the hosts come in, a
listener that keeps being reached stays up. The master's port_probe stops it as soon as the
workers are done (stop_listener), so it never outlives the preflight and never holds the port
when torchrun starts.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from ansible_collections.torchfleet.fleet.plugins.module_utils.run import procs

MARKER = "torchfleet-port-listener"

# Runs in a fresh interpreter: argv = [marker, ports, expect, idle_s, fd, fd, ...]; the ports
# (29500,29501) only name it, for whoever reads the process table.
ACCEPT_LOOP = r"""
import select, socket, sys, time
expect, idle_s = int(sys.argv[3]), float(sys.argv[4])
socks = {socket.socket(fileno=int(fd)): 0 for fd in sys.argv[5:]}
end = time.monotonic() + idle_s
while socks and time.monotonic() < end:
    ready, _, _ = select.select(list(socks), [], [], max(0.0, end - time.monotonic()))
    for s in ready:
        conn, _ = s.accept()
        try:  # the master's clock, for the workers' host.clock (connect.read_clock)
            conn.sendall(b"TFCLK %.6f\n" % time.time())
        except OSError:
            pass
        conn.close()
        end = time.monotonic() + idle_s
        socks[s] += 1
        if socks[s] >= expect:
            del socks[s]
            s.close()
"""


def bind_ports(ports, address="0.0.0.0"):
    """Bind and listen on each port: ({port: socket}, {port: error})."""
    bound, errors = {}, {}
    for port in ports:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
            sock.listen(512)
        except OSError as exc:
            errors[port] = exc.strerror or str(exc)
            sock.close()
            continue
        bound[port] = sock
    return bound, errors


def start_listener(ports, expect, idle_s, address="0.0.0.0"):
    """{pid, ports: [{port, bound, error}]}; pid is None when nothing could be bound.

    Returns once the child runs the accept loop: until it has exec'd, /proc shows the parent's
    command line, and a stop_listener that came right after would take it for gone.
    """
    bound, errors = bind_ports(ports, address)
    status = [{"port": p, "bound": p in bound, "error": errors.get(p)} for p in ports]
    if not bound:
        return {"pid": None, "ports": status}
    fds = [s.fileno() for s in bound.values()]
    try:
        # Detached and with no inherited stdio: Ansible must not wait for it to close pipes.
        child = subprocess.Popen(
            [sys.executable, "-c", ACCEPT_LOOP, MARKER, ",".join(map(str, bound)), str(expect),
             str(idle_s)]
            + [str(fd) for fd in fds],
            pass_fds=fds, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
    finally:
        for sock in bound.values():
            sock.close()
    while child.poll() is None and not _is_listener(child.pid):
        time.sleep(0.01)  # exec is a matter of milliseconds; a child that died ends the wait
    return {"pid": child.pid, "ports": status}


def _is_listener(pid):
    return MARKER in procs.cmdline(pid) and procs.alive(pid)


def stop_listener(pid, wait_s):
    """Wait up to wait_s for the listener to finish by itself, then end it.

    Signals only a process whose command line carries MARKER, so a recycled PID is never hit.
    Returns "exited", "stopped" or "gone".
    """
    if not pid or not _is_listener(pid):
        return "gone"
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        if not _is_listener(pid):
            return "exited"
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        return "gone"
    return "stopped"
