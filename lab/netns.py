"""A multi-host test lab on one Linux machine: network namespaces with sshd, no Docker.

Each node is a network namespace with an `eth0` veth into one bridge, its own IPv4 address in
the lab's 10.77.<16 x tag>.0/20 (used by nothing but the lab; node i is
10.77.<16 x tag + i / 250>.<i % 250 + 1>, up to MAX_NODES), its own hostname (UTS namespace),
its own /etc/hosts and resolv.conf (in /etc/netns/<ns>/, which `ip netns exec` binds over /etc/), a node-local
directory mounted at <lab>/local (so code_dir and data_paths can differ per node), and its own
sshd with a lab-only host key; Ansible reaches it over real SSH with a lab-only client key and
a known_hosts file the lab writes, host key checking on.

Everything lab N makes carries the prefix `tflab<N>-`: `down` finds and removes it all by that
prefix (also after a crash), and never touches anything else; `down --all` removes every lab.

With `--user`, the lab also has a non-root login, `tflab<N>-user`, on every node (real clusters
log in as ordinary users): its own home under the lab, the lab's client key, and a venv it can
execute, made from the system's python of the controller's minor version with the
controller's site-packages bound read-only under the lab (the controller's own interpreter
may live where other users cannot reach it). `user_inventory` is the lab as that user.

    python -m lab up --nodes 4          # prints the inventory path
    python -m lab up --nodes 3 --slurm  # and a Slurm cluster of them (lab/slurm.py)
    python -m lab fault block_port node0 --port 29500
    python -m lab heal                   # undo every fault
    python -m lab down

Needs root, iproute2, nftables and openssh-server.
"""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ansible_collections.torchfleet.fleet.plugins.module_utils.run import procs  # the one /proc reader

SLOW_CPU_PCT = 10  # a throttled node in the lab: a tenth of one CPU (below its share of one)
SLOW_RATE = "400mbit"  # a slowed NIC or link in the lab: ~10x below what a lab pair carries
PREFIX = "tflab"  # every lab: tflab<N>-node0 (netns), tflab<N>-v0 (veth), tflab<N>-br
MAX_LABS = 16  # lab N uses 10.77.16N.0/20, so several labs (tests, molecule) can coexist
MAX_NODES = 1000  # a bridge takes 1024 ports
PREFIX_LEN = 20
# The kernel's neighbour table (ARP) is one for every namespace: each node's entries (the
# gateway, the master, a few peers) and the machine's for each node count against its hard
# limit (gc_thresh3, 1024 by default), raised for a lab past this many nodes and put back by
# down() (the values it found are kept in <lab>/neigh.json).
NEIGH_NODES = 200
NEIGH_SYSCTL = "/proc/sys/net/ipv4/neigh/default/gc_thresh%d"
DEFAULT_DIR = Path("/tmp/torchfleet-lab")
SSHD = "/usr/sbin/sshd"
NFT_TABLE = PREFIX
DAEMONS = "daemons"  # <lab>/daemons/*.pid: what the lab runs outside its namespaces
SAMPLE_CODE = {"train.py": "print('torchfleet lab')\n", "model/net.py": "LAYERS = 4\n"}
OCCUPY = ("import socket, sys, time\n"
          "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
          "s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(); time.sleep(3600)\n")


class LabError(RuntimeError):
    """A lab operation failed; the message names the step and the fix."""


def sh(*argv: str, check: bool = True, ns: str | None = None) -> subprocess.CompletedProcess:
    if ns is not None:
        argv = ("ip", "netns", "exec", ns) + argv
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise LabError("`%s` failed: %s" % (" ".join(argv), proc.stderr.strip()))
    return proc


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, bridges, sshd); run it with sudo")
    missing = [tool for tool in ("ip", "nft", "unshare", "ssh-keygen")
               if shutil.which(tool) is None] + ([] if os.path.exists(SSHD) else ["sshd"])
    if missing:
        raise LabError("the lab needs %s; install iproute2, nftables, util-linux and "
                       "openssh-server" % ", ".join(missing))


def lab_prefix(tag: int | None) -> str:
    """Name prefix of lab `tag`, or of every lab when tag is None."""
    return PREFIX if tag is None else "%s%d-" % (PREFIX, tag)


def user_name(tag: int) -> str:
    return lab_prefix(tag) + "user"


def our_users(tag: int | None = None) -> list[str]:
    """The labs' non-root users on this machine (tflab<N>-user)."""
    with open("/etc/passwd") as f:
        names = [line.split(":", 1)[0] for line in f]
    return [n for n in names if n.startswith(lab_prefix(tag)) and n.endswith("-user")]


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below root in this mount namespace, deepest first."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point == str(root) or point.startswith(str(root) + "/"):
                points.append(point)
    return sorted(points, key=len, reverse=True)


def our_namespaces(tag: int | None = None) -> list[str]:
    out = sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines()
            if line.split() and line.split()[0].startswith(lab_prefix(tag))]


def our_links(tag: int | None = None) -> list[str]:
    out = sh("ip", "-j", "link", "show", check=False).stdout or "[]"
    return [link["ifname"] for link in json.loads(out)
            if link["ifname"].startswith(lab_prefix(tag))]


@dataclass
class Node:
    name: str
    index: int
    tag: int = 0

    @property
    def ns(self) -> str:
        return "%s%s" % (lab_prefix(self.tag), self.name)

    @property
    def address(self) -> str:
        return "10.77.%d.%d" % (16 * self.tag + self.index // 250, self.index % 250 + 1)

    @property
    def veth(self) -> str:
        return "%sv%d" % (lab_prefix(self.tag), self.index)


@dataclass
class Lab:
    """A lab rooted at `root`; `up` builds it, `down` removes it and every leftover."""

    root: Path = DEFAULT_DIR
    nodes: list[Node] = field(default_factory=list)
    tag: int = 0
    user: bool = False
    # Where the root login's runs live on the nodes (remote_runs_root in the inventory), when
    # not ~/.torchfleet/runs: the nodes share this machine's filesystem with other labs.
    runs_root: Path | None = None

    @property
    def bridge(self) -> str:
        return lab_prefix(self.tag) + "br"

    @property
    def gateway(self) -> str:
        return "10.77.%d.254" % (16 * self.tag + 15)

    # ---- paths -----------------------------------------------------------------------------
    @property
    def inventory(self) -> Path:
        return self.root / "inventory.yml"

    @property
    def local(self) -> Path:
        """Same path on every node, a different directory behind it on each."""
        return self.root / "local"

    @property
    def code_dir(self) -> Path:
        return self.local / "code"

    @property
    def data_dir(self) -> Path:
        return self.local / "data"

    @property
    def user_dir(self) -> Path:
        return self.root / "user"

    @property
    def user_inventory(self) -> Path:
        return self.root / "inventory-user.yml"

    @property
    def user_python(self) -> Path:
        return self.user_dir / "venv" / "bin" / "python"

    def node_dir(self, node: Node) -> Path:
        return self.root / "nodes" / node.name

    def node_local(self, node: Node) -> Path:
        """What `node` sees at self.local, seen from the controller."""
        return self.node_dir(node) / "local"

    def hosts_file(self, node: Node) -> Path:
        return Path("/etc/netns") / node.ns / "hosts"

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise LabError("no node %s in the lab at %s (nodes: %s)"
                       % (name, self.root, ", ".join(n.name for n in self.nodes)))

    # ---- up / down -------------------------------------------------------------------------
    @classmethod
    def load(cls, root: Path = DEFAULT_DIR) -> "Lab":
        state = root / "state.json"
        if not state.exists():
            raise LabError("no lab at %s; start one with `python -m lab up`" % root)
        saved = json.loads(state.read_text())
        tag = saved.get("tag", 0)
        runs = saved.get("runs_root")
        return cls(root, [Node(name, i, tag) for i, name in enumerate(saved["nodes"])], tag,
                   saved.get("user", False), Path(runs) if runs else None)

    @classmethod
    def up(cls, nodes: int, root: Path = DEFAULT_DIR, tag: int = 0,
           user: bool = False, runs_root: Path | None = None) -> "Lab":
        require_root()
        if not 1 <= nodes <= MAX_NODES:
            raise LabError("--nodes must be between 1 and %d, not %d" % (MAX_NODES, nodes))
        if not 0 <= tag < MAX_LABS:
            raise LabError("--tag must be between 0 and %d, not %d" % (MAX_LABS - 1, tag))
        down(root, tag)  # a crashed earlier lab with this tag must not be in the way
        lab = cls(root, [Node("node%d" % i, i, tag) for i in range(nodes)], tag, user, runs_root)
        try:
            lab._build()
        except BaseException:
            down(root, tag)
            raise
        return lab

    def _build(self) -> None:
        (self.root / "keys").mkdir(parents=True, mode=0o700)
        (self.root / "cp").mkdir(mode=0o700)
        self.local.mkdir()
        keys = self.root / "keys"
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "tflab-client", "-f",
           str(keys / "id_lab"))
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "tflab-host", "-f",
           str(keys / "host_ed25519"))
        shutil.copy(keys / "id_lab.pub", keys / "authorized_keys")
        host_key = (keys / "host_ed25519.pub").read_text().split()[:2]
        (self.root / "known_hosts").write_text("".join(
            "%s %s %s\n" % (node.address, *host_key) for node in self.nodes))
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
        if self.user:  # before the nodes: their mount namespaces copy the lab's mounts
            self._add_user()

        sh("ip", "link", "add", self.bridge, "type", "bridge")
        if len(self.nodes) > NEIGH_NODES:
            raise_neighbour_table(self.root, len(self.nodes))
        sh("ip", "addr", "add", "%s/%d" % (self.gateway, PREFIX_LEN), "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for node in self.nodes:
            self._add_node(node)
        (self.root / "state.json").write_text(json.dumps(
            {"nodes": [n.name for n in self.nodes], "tag": self.tag, "user": self.user,
             "runs_root": str(self.runs_root) if self.runs_root else None}))
        self._write_inventory()
        self.wait_for_ssh()

    def _add_node(self, node: Node) -> None:
        sh("ip", "netns", "add", node.ns)
        sh("ip", "link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", node.ns)
        sh("ip", "link", "set", node.veth, "master", self.bridge, "up")
        sh("ip", "-n", node.ns, "addr", "add", "%s/%d" % (node.address, PREFIX_LEN), "dev",
           "eth0")
        sh("ip", "-n", node.ns, "link", "set", "eth0", "up")
        sh("ip", "-n", node.ns, "link", "set", "lo", "up")
        sh("ip", "-n", node.ns, "route", "add", "default", "via", self.gateway)
        self.node_dir(node).mkdir(parents=True)
        self._seed_local(node)
        self.hosts_file(node).parent.mkdir(parents=True, exist_ok=True)
        self.write_hosts(node, node.address)
        # The machine's DNS server is not reachable from the lab's subnet: a name or address
        # not in /etc/hosts would wait out the resolver's timeouts (10 s in torch's c10d
        # store connect). Nothing listens on the lab's loopback: lookups fail at once, as
        # NXDOMAIN would on a cluster.
        (self.hosts_file(node).parent / "resolv.conf").write_text(
            "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        self._start_sshd(node)

    def _add_user(self) -> None:
        name = user_name(self.tag)
        system_python = "/usr/bin/python%d.%d" % sys.version_info[:2]
        if not os.access(system_python, os.X_OK):
            raise LabError("the lab's non-root user needs %s (the controller's minor version, "
                           "for torch's extensions); apt-get install python3" % system_python)
        udir = self.user_dir
        udir.mkdir(mode=0o755)
        sh("useradd", "--home-dir", str(udir / "home"), "--create-home", "--shell", "/bin/sh",
           "--password", "*", name)  # '*': no password, not locked (sshd without PAM checks)
        shutil.copy(self.root / "keys" / "id_lab.pub", udir / "authorized_keys")
        (udir / "authorized_keys").chmod(0o644)
        site = udir / "site"
        site.mkdir(mode=0o755)
        sh("mount", "--bind", sysconfig.get_paths()["purelib"], str(site))
        sh("mount", "-o", "remount,bind,ro", str(site))  # down's rmtree can never reach into it
        venv = udir / "venv"
        sh(system_python, "-m", "venv", "--without-pip", str(venv))
        (venv / "lib" / ("python%d.%d" % sys.version_info[:2]) / "site-packages" /
         "torchfleet-lab.pth").write_text(str(site) + "\n")
        py_spy = Path(sys.executable).parent / "py-spy"
        if py_spy.exists():
            shutil.copy(py_spy, venv / "bin" / "py-spy")

    def _seed_local(self, node: Node) -> None:
        # Only the contents are replaced: the node's mount namespace holds this directory
        # itself, so removing it would leave the node looking at a deleted one.
        local = self.node_local(node)
        local.mkdir(exist_ok=True)
        for entry in local.iterdir():
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        for rel, text in SAMPLE_CODE.items():
            path = local / "code" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        (local / "data").mkdir(parents=True)
        (local / "data" / "shard-000.bin").write_bytes(b"\0" * 1024)

    def write_hosts(self, node: Node, own_address: str) -> None:
        # Rewritten in place: `ip netns exec` bind-mounted this very file over /etc/hosts.
        lines = ["127.0.0.1 localhost"] + ["%s %s" % (
            own_address if n is node else n.address, n.name) for n in self.nodes]
        with open(self.hosts_file(node), "w") as f:
            f.write("\n".join(lines) + "\n")

    def _start_sshd(self, node: Node, extra: list[str] | None = None,
                    cgroups: bool = False) -> None:
        ndir = self.node_dir(node)
        keys = self.root / "keys"
        config = ndir / "sshd_config"
        config.write_text("\n".join([
            "Port 22", "ListenAddress %s" % node.address,
            "HostKey %s" % (keys / "host_ed25519"), "PidFile %s" % (ndir / "sshd.pid"),
            "AuthorizedKeysFile %s %s" % (keys / "authorized_keys",
                                          self.user_dir / "authorized_keys"),
            "PermitRootLogin prohibit-password", "PubkeyAuthentication yes",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
            "StrictModes no", "MaxStartups 500", "MaxSessions 100",
            "Subsystem sftp internal-sftp", *(extra or []), ""]))
        (ndir / "sshd.pid").unlink(missing_ok=True)
        # Own UTS namespace for the hostname; the mount namespace `ip netns exec` makes is
        # where the node-local directory is bound. No variable reaches the shell's text.
        # cgroups: `ip netns exec` mounts a sysfs of the namespace's own, without the
        # machine's cgroup hierarchies; a container runtime in the node needs them (the same
        # hierarchies mounted again: lab/podman.py).
        sh("ip", "netns", "exec", node.ns, "unshare", "--uts", "sh", "-c",
           'mount --bind "$1" "$2" && hostname "$3" || exit 1; sshd=$4; config=$5; shift 5; '
           'while [ $# -gt 0 ]; do mkdir -p "$2" && mount -t "$1" -o "$3" "$1" "$2" || exit 1; '
           'shift 3; done; exec "$sshd" -f "$config"', "sh",
           str(self.node_local(node)), str(self.local), node.name, SSHD, str(config),
           *(cgroup_mounts() if cgroups else []))

    def sshd_pid(self, node: Node) -> int | None:
        try:
            return int((self.node_dir(node) / "sshd.pid").read_text())
        except (OSError, ValueError):
            return None

    def wait_for_ssh(self, timeout_s: float = 30) -> None:
        end = time.monotonic() + timeout_s
        pending = list(self.nodes)
        while pending and time.monotonic() < end:
            for node in list(pending):
                try:
                    socket.create_connection((node.address, 22), timeout=0.5).close()
                    pending.remove(node)
                except OSError:
                    pass
            if pending:
                time.sleep(0.05)
        if pending:
            raise LabError("sshd did not answer on %s within %.0f s"
                           % (", ".join(n.name for n in pending), timeout_s))

    def node_vars(self) -> dict:
        """The variables every node of the lab needs: how Ansible reaches it and where its
        code, data and python are."""
        keys = self.root / "keys"
        ssh_args = " ".join([
            "-o UserKnownHostsFile=%s" % (self.root / "known_hosts"),
            "-o StrictHostKeyChecking=yes", "-o IdentitiesOnly=yes",
            "-o ControlPath=%s" % (self.root / "cp" / "%C")])
        return {
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(keys / "id_lab"),
            "ansible_ssh_common_args": ssh_args,
            # Every node shares this machine's filesystem, so the controller's venv is there.
            "ansible_python_interpreter": sys.executable,
            "python": sys.executable,
            "backend": "gloo",
            "code_dir": str(self.code_dir),
            "data_paths": [str(self.data_dir)],
            **({"remote_runs_root": str(self.runs_root)} if self.runs_root else {}),
        }

    def _write_inventory(self) -> None:
        inventory = {"all": {"children": {"nodes": {
            "hosts": {n.name: {"ansible_host": n.address} for n in self.nodes},
            "vars": self.node_vars()}}}}
        self.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
        if self.user:
            # Its runs stay under its own home (the default), where it may write.
            user_vars = dict({k: v for k, v in self.node_vars().items()
                              if k != "remote_runs_root"}, ansible_user=user_name(self.tag),
                             ansible_python_interpreter=str(self.user_python),
                             python=str(self.user_python))
            inventory["all"]["children"]["nodes"]["vars"] = user_vars
            self.user_inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))

    # ---- faults (each undone by heal() and by down()) --------------------------------------
    def block_port(self, name: str, port: int, last: int | None = None) -> None:
        """Drop TCP to `port` (or the range port-last) arriving on the node's eth0, as a host
        firewall would; the node's own loopback traffic still passes."""
        ports = str(port) if last is None else "%d-%d" % (port, last)
        self._drop(self.node(name), "input", "iifname", "eth0", "tcp", "dport", ports)

    def block_egress(self, name: str, port: int) -> None:
        """Drop TCP the node sends to `port` anywhere, as an egress firewall would."""
        self._drop(self.node(name), "output", "tcp", "dport", str(port))

    def cut_link(self, a: str, b: str) -> None:
        """A dead cable between two nodes only: each drops what it sends to the other; their
        traffic with every other node passes."""
        for src, dst in ((self.node(a), self.node(b)), (self.node(b), self.node(a))):
            self._drop(src, "output", "ip", "daddr", dst.address)

    def cut_controller(self, *names: str) -> None:
        """The controller (this machine, the bridge's gateway address) cut off from the nodes,
        both ways, as when a laptop's VPN reconnects: the nodes still reach each other."""
        for name in names:
            node = self.node(name)
            self._drop(node, "output", "ip", "daddr", self.gateway)
            self._drop(node, "input", "ip", "saddr", self.gateway)

    def mend_controller(self, *names: str) -> None:
        """Undo cut_controller (the lab's nftables table of each node; nothing else of heal)."""
        for name in names:
            sh("nft", "delete", "table", "inet", NFT_TABLE, ns=self.node(name).ns, check=False)

    @staticmethod
    def _drop(node: Node, hook: str, *match: str) -> None:
        """A rule dropping what matches, in the lab's own nftables table of the node (heal
        deletes that table)."""
        sh("nft", "add", "table", "inet", NFT_TABLE, ns=node.ns)
        sh("nft", "add", "chain", "inet", NFT_TABLE, hook,
           "{ type filter hook %s priority 0 ; }" % hook, ns=node.ns)
        sh("nft", "add", "rule", "inet", NFT_TABLE, hook, *match, "drop", ns=node.ns)

    def occupy_port(self, name: str, port: int) -> int:
        """Hold `port` on the node with a listening process; returns its PID."""
        node = self.node(name)
        proc = subprocess.Popen(
            ["ip", "netns", "exec", node.ns, sys.executable, "-c", OCCUPY, str(port)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                socket.create_connection((node.address, port), timeout=0.5).close()
                return proc.pid
            except OSError:
                time.sleep(0.05)
        raise LabError("the port holder on %s did not start listening on %d" % (name, port))

    def set_env(self, name: str, *assignments: str, cgroups: bool = False) -> None:
        """Give every SSH session on the node extra environment variables (sshd SetEnv), as
        a per-host profile or container image would; cgroups: and the machine's cgroup
        hierarchies under /sys/fs/cgroup (a container runtime's), until heal()."""
        node = self.node(name)
        for assignment in assignments:
            key, _, value = assignment.partition("=")
            if not key or not key.replace("_", "").isalnum() or any(c.isspace() for c in value):
                raise LabError("set_env takes NAME=VALUE (no spaces), not %r" % assignment)
        self._stop_sshd(node)
        self._start_sshd(node, extra=["SetEnv %s" % " ".join(assignments)], cgroups=cgroups)
        self.wait_for_ssh()

    def hide_ip(self, name: str, before_json: bool = False) -> None:
        """A node whose SSH sessions cannot run iproute2's `ip` (a GPU container or a minimal
        image without it): their PATH is a folder of the lab's with every command of the
        system's PATH but `ip`. before_json: an `ip` is there, but one from before `-j`
        (iproute2 3.10-4.11, RHEL / CentOS 7): it refuses `-j` in that version's words and
        exit status, and runs everything else. heal() gives the node its sshd without it."""
        node = self.node(name)
        folder = self.node_dir(node) / "bin-without-ip"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for where in ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin",
                      "/bin"):
            for tool in sorted(os.listdir(where)) if os.path.isdir(where) else []:
                if tool != "ip" and not (folder / tool).exists():
                    (folder / tool).symlink_to(os.path.join(where, tool))
        if before_json:
            real = shutil.which("ip")
            if real is None:
                raise LabError("iproute2's ip is not installed here")
            old = folder / "ip"
            old.write_text('#!/bin/sh\nfor a in "$@"; do case "$a" in -j|-json) echo \'Option '
                           '"\'"$a"\'" is unknown, try "ip -help".\' >&2; exit 255;; esac; done\n'
                           'exec %s "$@"\n' % shlex.quote(real))
            old.chmod(0o755)
        self.set_env(name, "PATH=%s" % folder)

    def _stop_sshd(self, node: Node) -> None:
        kill_namespace_processes(node.ns, only_sshd=True)
        close_control_masters(self.root)

    def rename_nic(self, name: str, new: str = "ens5") -> None:
        node = self.node(name)
        for argv in (("link", "set", "eth0", "down"), ("link", "set", "eth0", "name", new),
                     ("link", "set", new, "up"),
                     ("route", "replace", "default", "via", self.gateway, "dev", new)):
            sh("ip", "-n", node.ns, *argv)

    def desync_code(self, name: str) -> None:
        """One changed file and one extra file in the node's code_dir."""
        code = self.node_local(self.node(name)) / "code"
        (code / "train.py").write_text("print('edited on one node only')\n")
        (code / "scratch.py").write_text("# left behind on one node\n")

    def remove_data(self, name: str) -> None:
        shutil.rmtree(self.node_local(self.node(name)) / "data")

    def restore_data(self, name: str) -> None:
        """remove_data undone on one node while runs go on elsewhere (heal() ends them)."""
        self._seed_local(self.node(name))

    def hostname_loopback(self, name: str) -> None:
        """Make the node's own name resolve to 127.0.1.1, as Debian's installer writes it."""
        self.write_hosts(self.node(name), "127.0.1.1")

    def unreachable(self, name: str) -> None:
        """Kill the node's sshd and every session it serves (Ansible's control masters too)."""
        self._stop_sshd(self.node(name))

    def cut_network(self, name: str) -> None:
        """Take the node's cable out: its veth goes down on the bridge side."""
        sh("ip", "link", "set", self.node(name).veth, "down")

    def slow_nic(self, name: str, rate: str = SLOW_RATE) -> None:
        """A NIC that negotiated a low speed: a token bucket on the node's link, both ways
        (its eth0 sends, its veth on the bridge side delivers)."""
        node = self.node(name)
        for dev, ns in (("eth0", node.ns), (node.veth, None)):
            sh("tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
               "burst", "64kb", "latency", "400ms", ns=ns)

    def slow_link(self, a: str, b: str, rate: str = SLOW_RATE) -> None:
        """A bad cable between two nodes only: each node's eth0 holds what it sends to the
        other to the rate (an htb class chosen by destination address); their other traffic
        runs free."""
        for src, dst in ((self.node(a), self.node(b)), (self.node(b), self.node(a))):
            tc = ("tc", "-n", src.ns)
            sh(*tc, "qdisc", "replace", "dev", "eth0", "root", "handle", "1:", "htb",
               "default", "10")
            sh(*tc, "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:10", "htb",
               "rate", "100gbit")
            sh(*tc, "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:20", "htb",
               "rate", rate)
            sh(*tc, "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio",
               "1", "u32", "match", "ip", "dst", dst.address + "/32", "flowid", "1:20")

    def limit_cpu(self, name: str, pct: int = SLOW_CPU_PCT) -> None:
        """A host whose CPU is throttled (a noisy neighbour, a wrong quota): the node's sshd,
        every session it serves and every process already running there go into a cgroup of
        their own capped at pct % of one CPU."""
        period = 100000
        self._confine(name, "cpu", {1: {"cpu.cfs_period_us": str(period),
                                        "cpu.cfs_quota_us": str(period * pct // 100)},
                                    2: {"cpu.max": "%d %d" % (period * pct // 100, period)}})

    def limit_memory(self, name: str, mib: int) -> None:
        """A host whose memory is capped (a container's or a Slurm job's memory cgroup): its
        sshd and every session go into a memory cgroup of mib MiB without swap, so a rank that
        allocates past it is ended by the kernel's OOM killer, which says so in the kernel
        log with the rank's PID."""
        limit = str(mib << 20)
        self._confine(name, "memory", {1: {"memory.limit_in_bytes": limit,
                                           "memory.memsw.limit_in_bytes?": limit},
                                       2: {"memory.max": limit, "memory.swap.max": "0"}})

    def _confine(self, name: str, controller: str, settings: dict) -> None:
        """The node's sshd and its sessions into a cgroup of their own of `controller`, with
        the settings of that hierarchy's version (a name ending in ? is set where it exists)."""
        node = self.node(name)
        close_control_masters(self.root)  # new sessions fork from sshd, inside the cgroup
        root, version = cgroup_root(controller)
        group = root / ("%s%s-%s" % (lab_prefix(self.tag), node.name, controller))
        group.mkdir(exist_ok=True)
        for key, value in settings[version].items():
            if key.endswith("?"):
                with contextlib.suppress(OSError):
                    (group / key[:-1]).write_text(value)
            else:
                (group / key).write_text(value)
        pid = self.sshd_pid(node)
        # Every process of the node's namespace too: a run already going (its agent and ranks
        # were detached from sshd by Ansible's async wrapper) slows down from now on.
        members = {int(p) for p in sh("ip", "netns", "pids", node.ns, check=False).stdout.split()}
        if pid:
            members |= {pid} | procs.descendants(procs.table(), [pid])
        for member in sorted(members):
            with contextlib.suppress(OSError):  # a session that ended meanwhile
                (group / "cgroup.procs").write_text(str(member))

    def heal(self) -> None:
        """Undo every fault above on every node, so one lab serves many tests."""
        close_control_masters(self.root)
        release_groups(self.tag)
        for node in self.nodes:
            # No qdisc of ours left: deleting the root one restores the kernel's default.
            sh("tc", "-n", node.ns, "qdisc", "del", "dev", "eth0", "root", check=False)
            sh("tc", "qdisc", "del", "dev", node.veth, "root", check=False)
            kill_namespace_processes(node.ns, keep=self.sshd_pid(node))
            sh("nft", "delete", "table", "inet", NFT_TABLE, ns=node.ns, check=False)
            links = json.loads(sh("ip", "-n", node.ns, "-j", "link", "show").stdout)
            for link in links:
                if link["ifname"] not in ("lo", "eth0"):
                    sh("ip", "-n", node.ns, "link", "set", link["ifname"], "down")
                    sh("ip", "-n", node.ns, "link", "set", link["ifname"], "name", "eth0")
                    sh("ip", "-n", node.ns, "link", "set", "eth0", "up")
            sh("ip", "-n", node.ns, "route", "replace", "default", "via", self.gateway, "dev",
               "eth0")
            sh("ip", "link", "set", node.veth, "up")
            self._seed_local(node)
            self.write_hosts(node, node.address)
            pid = self.sshd_pid(node)
            if "SetEnv" in (self.node_dir(node) / "sshd_config").read_text():
                self._stop_sshd(node)
                pid = None
            if not (pid and procs.alive(pid)):
                self._start_sshd(node)
        self.wait_for_ssh()


def cgroup_mounts() -> list[str]:
    """The machine's cgroup hierarchies as (type, mount point, options) triples, flat: a tmpfs
    at /sys/fs/cgroup first where the hierarchies are mounted below it (cgroup v1, hybrid)."""
    found = []
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 3 and fields[2] in ("cgroup", "cgroup2") and (
                    fields[1] + "/").startswith("/sys/fs/cgroup/"):
                found.append([fields[2], fields[1], fields[3]])
    if found and all(point != "/sys/fs/cgroup" for _type, point, _options in found):
        found.insert(0, ["tmpfs", "/sys/fs/cgroup", "mode=755"])
    return [x for triple in found for x in triple]


CGROUP_CONTROLLERS = {"cpu": "cpu.cfs_quota_us", "memory": "memory.limit_in_bytes",
                      "cpuacct": "cpuacct.usage"}  # (cpuacct: bench launch_profile's groups)


def cgroup_root(controller: str) -> tuple[Path, int]:
    """(directory, version) of the cgroup hierarchy with `controller`: v1's own mount, or v2's
    unified one where it is enabled for children."""
    v1 = Path("/sys/fs/cgroup") / controller
    if (v1 / CGROUP_CONTROLLERS[controller]).exists():
        return v1, 1
    v2 = Path("/sys/fs/cgroup")
    with contextlib.suppress(OSError):
        if controller in (v2 / "cgroup.subtree_control").read_text().split():
            return v2, 2
    raise LabError("no cgroup %s controller to confine a node (neither /sys/fs/cgroup/%s nor "
                   "%s in /sys/fs/cgroup/cgroup.subtree_control)" % (controller, controller,
                                                                      controller))


def release_groups(tag: int | None) -> list[str]:
    """Move the processes of lab `tag`'s cgroups back to the root and remove the groups."""
    removed = []
    for controller in CGROUP_CONTROLLERS:
        try:
            root, _ = cgroup_root(controller)
        except LabError:
            continue
        for group in root.glob(lab_prefix(tag) + "*-" + controller):
            with contextlib.suppress(OSError):
                for pid in (group / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        (root / "cgroup.procs").write_text(pid)
            with contextlib.suppress(OSError):
                group.rmdir()
                removed.append("cgroup " + str(group))
    return removed


def close_control_masters(root: Path) -> None:
    """End the SSH control masters Ansible keeps for the lab's nodes."""
    cp = root / "cp"
    if cp.is_dir():
        for sock in cp.iterdir():
            sh("ssh", "-o", "ControlPath=%s" % sock, "-O", "exit", "tflab", check=False)


def kill_namespace_processes(ns: str, keep: int | None = None, only_sshd: bool = False,
                             matching: str | None = None) -> list[int]:
    """SIGKILL processes in the network namespace: all but `keep` and its descendants (sshd
    and the sessions Ansible's control masters hold open), or with only_sshd, sshd alone, or
    with matching, those whose command line holds it; returns the PIDs signalled."""
    out = sh("ip", "netns", "pids", ns, check=False).stdout
    kept = procs.descendants(procs.table(), [keep]) if keep else set()
    return _sigkill(pid for pid in (int(p) for p in out.split())
                    if pid not in kept
                    and (not only_sshd or procs.comm(pid).startswith("sshd"))
                    and (not matching or matching in procs.cmdline(pid)))


def _sigkill(pids) -> list[int]:
    """SIGKILL each; returns those signalled (a process already gone is skipped)."""
    killed = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
    return killed


def stop_daemons(root: Path) -> list[int]:
    """SIGKILL the daemons the lab started outside its namespaces (the Slurm lab's munged and
    slurmctld): each left a pid file in <root>/daemons and has the lab's path on its command
    line, which a reused pid would not."""
    pids = []
    for pidfile in sorted((root / DAEMONS).glob("*.pid")):
        try:
            pids.append(int(pidfile.read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            continue
    return _sigkill(pid for pid in pids if str(root) in procs.cmdline(pid))


def down(root: Path = DEFAULT_DIR, tag: int | None = None) -> list[str]:
    """Remove every trace of lab `tag` (found by its name prefix; every lab when tag is None)
    and the directory `root`; returns what it removed."""
    removed = []
    close_control_masters(root)
    removed += ["daemon %d" % pid for pid in stop_daemons(root)]
    for ns in our_namespaces(tag):
        kill_namespace_processes(ns)
        sh("ip", "netns", "del", ns, check=False)
        removed.append("netns " + ns)
    removed += release_groups(tag)
    for link in our_links(tag):
        sh("ip", "link", "del", link, check=False)
        removed.append("link " + link)
    netns_etc = Path("/etc/netns")
    if netns_etc.is_dir():
        for entry in netns_etc.glob(lab_prefix(tag) + "*"):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(str(entry))
    for point in mounts_under(root):  # before the rmtree: never into a bound directory
        sh("umount", "-l", point, check=False)
        removed.append("mount " + point)
    for name in our_users(tag):
        sh("userdel", name, check=False)
        removed.append("user " + name)
    removed += restore_neighbour_table(root)
    if root.exists():
        shutil.rmtree(root, ignore_errors=True)
        removed.append(str(root))
    return removed


def raise_neighbour_table(root: Path, nodes: int) -> None:
    """Room in the neighbour table for `nodes` more entries (gc_thresh1-3), the values found
    kept in <lab>/neigh.json for down()."""
    found = [int(Path(NEIGH_SYSCTL % i).read_text()) for i in (1, 2, 3)]
    (root / "neigh.json").write_text(json.dumps(found))
    wanted = [found[0], max(found[1], found[1] + 2 * nodes), max(found[2], found[2] + 4 * nodes)]
    for i, value in zip((1, 2, 3), wanted, strict=True):
        Path(NEIGH_SYSCTL % i).write_text("%d\n" % value)


def restore_neighbour_table(root: Path) -> list[str]:
    """Put back the neighbour table's limits this lab raised."""
    saved = root / "neigh.json"
    try:
        found = json.loads(saved.read_text())
    except (OSError, ValueError):
        return []
    for i, value in zip((1, 2, 3), found, strict=False):
        Path(NEIGH_SYSCTL % i).write_text("%d\n" % value)
    saved.unlink()
    return ["neighbour table limits %s" % found]
