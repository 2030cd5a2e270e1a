"""The guard of a run's ports (guard_ports): one nftables table per run and host that lets TCP
to the run's ports (on the master, torchrun's store on master_port and the control port) in only
from the run's hosts and loopback, and resets every other connection to them; and on every host
of the run the same for new connections to the kernel's ephemeral range, where gloo and NCCL
listen for their peers (connections this host opened, whose replies come to a port of that
range, are not new and pass).

torchrun's store listens on every interface without authentication for the run's lifetime;
the guard closes it to everyone but the run. The table's name carries the run id
(`torchfleet_guard_<run id>`), so a run only ever removes its own, and another tool's tables
are never touched. The ruleset goes to `nft -f -` on stdin: values are checked here and never
pass through a shell.
"""
from __future__ import annotations

import ipaddress
import re

from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import RUN_ID

PREFIX = "torchfleet_guard_"


def table_name(run_id):
    if not RUN_ID.match(run_id or ""):
        raise ValueError("run_id %r cannot name a guard table" % (run_id,))
    return PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", run_id)


def remove_argv(run_id, euid):
    """The command that removes a run's table on a host, for an agent of the run's user: nft
    itself as root, else through sudo without a password prompt (it fails, never waits)."""
    argv = ["nft", "delete", "table", "inet", table_name(run_id)]
    return argv if euid == 0 else ["sudo", "-n"] + argv


def ruleset(run_id, ports, allow, ephemeral=None):
    """The nft script of a run's guard; ValueError naming a value that makes no sense.
    ephemeral: (low, high) to guard for new connections, or None."""
    for port in ports:
        if not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError("port %r is not a TCP port" % (port,))
    if not ports and not ephemeral:
        raise ValueError("no port to guard")
    v4, v6 = ["127.0.0.0/8"], ["::1"]
    for addr in allow:
        try:
            ip = ipaddress.ip_address(str(addr))
        except ValueError:
            raise ValueError("%r is not an IP address of a host of the run" % (addr,)) from None
        (v4 if ip.version == 4 else v6).append(str(ip))
    name = table_name(run_id)
    rules = []
    if ports:
        dports = ", ".join(str(p) for p in sorted(set(ports)))
        rules += ["    tcp dport { %s } ip saddr @run_hosts_v4 accept" % dports,
                  "    tcp dport { %s } ip6 saddr @run_hosts_v6 accept" % dports,
                  "    tcp dport { %s } reject with tcp reset" % dports]
    if ephemeral:
        low, high = ephemeral
        span = "%d-%d" % (low, high)
        rules += ["    tcp dport %s ct state new ip saddr @run_hosts_v4 accept" % span,
                  "    tcp dport %s ct state new ip6 saddr @run_hosts_v6 accept" % span,
                  "    tcp dport %s ct state new reject with tcp reset" % span]
    return "\n".join([
        "table inet %s {" % name,
        "  set run_hosts_v4 { type ipv4_addr; flags interval; elements = { %s } }"
        % ", ".join(sorted(set(v4))),
        "  set run_hosts_v6 { type ipv6_addr; flags interval; elements = { %s } }"
        % ", ".join(sorted(set(v6))),
        "  chain input {",
        "    type filter hook input priority -10; policy accept;",
        *rules,
        "  }",
        "}",
    ]) + "\n"


def ours(tables_text, run_id=None):
    """Names of the guard tables in `nft list tables` output: the run's, or every run's."""
    names = re.findall(r"^table inet (%s\w+)$" % PREFIX, tables_text, re.M)
    if run_id is None:
        return names
    want = table_name(run_id)
    return [n for n in names if n == want]
