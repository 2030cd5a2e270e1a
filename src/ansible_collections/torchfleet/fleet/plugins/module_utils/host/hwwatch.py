"""What a host's agent watches of its hardware while the run runs: one unit per signal (the
kernel log: kmsg.py; NVIDIA GPUs: gpuwatch.py; RDMA ports: ibwatch.py), composed here.

- Scope: a fatal event is the run's only on the run's devices (Scope): its GPUs
  (CUDA_VISIBLE_DEVICES of the host's GPUs), the PCIe bridges and switches above them (the
  device's sysfs path: /sys/bus/pci/devices/<bdf> resolves to /sys/devices/pci0000:00/<root
  port>/<switch ports>/<bdf>), the HCAs its NCCL uses (NCCL_IB_HCA; unset: every RDMA device,
  as NCCL then uses them all) and the NIC of its socket interface (NCCL_SOCKET_IFNAME; unset:
  the NIC that routes to the master, which torchrun's rendezvous, the TCP store and gloo use),
  and the bridges above those. Anything else (an NVMe drive, a storage NIC) is a warning that
  says "not a device of the run".
- The OOM killer's victim is the run's when its PID is a rank's, a process in a rank's tree
  (a DataLoader worker is dead when its line is read: the ranks' descendants are kept from the
  looks before, for OOM_SAME_S once gone, as its PID may be another program's next), or in a
  rank's own cgroup (a container with its own PID namespace), the cgroup holding nothing but
  this agent's own processes (lab hosts share one kernel and may share one cgroup). A kill
  line whose task_memcg is in none of the ranks' cgroups is not the run's, whatever its PID.
  Another program's OOM kill is a warning: the first OOM_OTHERS each their own, every later
  one counted in one event (the newest's line), so a crash-looping container's thousands of
  kills take neither the run's warnings nor the watch's memory.
- A fatal NVSwitch SXid names a switch port, no GPU (kmsg.py): fatal to the run, host-wide,
  unless it follows within SXID_AFTER_XID_S a fatal Xid on a GPU that is not the run's, and no
  fatal Xid on a GPU of the run (or one that cannot be judged) came in that time. A GPU that
  falls off the bus takes its NVLinks down, and the switches say so on their ports to it
  (tests/fixtures/kmsg/sxid20034-xid79.gpud.txt: Xid 79, then 20034 LTSSM Fault on three
  switches 12 s later): that SXid is the other GPU's, a warning that names it. A fabric fault
  that reaches the run's GPUs is their own Xid (74, 79), fatal on its own; an SXid with no
  other GPU's Xid before it stays fatal.
- GPU -> rank: NVML's compute processes per GPU (gpuwatch); without NVML, each rank's
  CUDA_VISIBLE_DEVICES and LOCAL_RANK (every rank holds every visible /dev/nvidiaN: no tie).
- One event per fault: the same fault again is a count (sent again with the new count, at most
  every RESEND_S), and the kernel log's and NVML's sightings of one Xid are one event.
- Bounds: a fatal event is always sent (fatal ones first, PER_BEAT a beat); warnings stop at
  PER_RUN a run, and the number not sent is status()["dropped"].

An event's age is measured on this host's clock (a /dev/kmsg record's calibrated printk stamp,
a sample's time; age_err_s says how uncertain it is), so the master dates it on its own clock
without comparing two hosts' clocks.

Only the standard library: it runs inside the agent on every host.
"""
from __future__ import annotations

import ipaddress
import os
import socket

from ansible_collections.torchfleet.fleet.plugins.module_utils.host import (
    gpuwatch, ibwatch, kmsg, net, netlink, rdma)
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import procs

PER_BEAT = 8        # events per heartbeat, fatal ones first
PER_RUN = 64        # warnings a host sends in a run; more are counted, not sent (never a fatal)
RESEND_S = 10.0     # a fault seen again is sent again with its count at most this often
SAME_S = 10.0       # the kernel log's and NVML's sightings of one Xid this close: one fault
KEYS_MAX = 4096     # faults remembered; past it a new warning is counted as dropped
TREE_MAX = 1024     # the ranks' descendants remembered (PID -> rank)
WALK_MAX = 256      # /proc children files read per walk of their tree
TREE_EVERY_S = 2.0  # how often it is walked
OOM_SAME_S = 60.0   # one kill's lines are this close; later, the same PID is another kill
OOM_OTHERS = 3      # other programs' OOM kills sent one by one; the later ones: one event, counted
OTHERS = ("oom", "others")  # the fault that counts them
OTHERS_WHAT = "killed by the kernel's OOM killer: more processes not of the run (the newest's line)"
AGE_MAX_S = 600.0   # the most uncertain an event's time is said to be
SXID_AFTER_XID_S = 60.0  # a fatal SXid this long after another GPU's fatal Xid is that GPU's
#                          (the recorded HGX's switches wrote theirs 12 s after its Xid 79)
XIDS_MAX = 64       # the GPUs whose newest fatal Xid is remembered
ERROR_MAX = 400     # characters of the watch's own error kept
SYSFS = "/sys"
CGROUP_FS = "/sys/fs/cgroup"
GPU_VENDORS = ("0x10de", "0x1002")  # NVIDIA, AMD: a display-class PCI function of theirs
GPU_KINDS = ("xid", "ecc", "remap", "clocks", "recovery", "amdgpu", "nvml")
DROPPED = -1        # a fault's "sent" when it was a warning past PER_RUN


def _read(path, size=4096):
    try:
        with open(path, errors="replace") as f:
            return f.read(size)
    except OSError:
        return None


def _listdir(path, limit):
    try:
        return sorted(os.listdir(path))[:limit]
    except OSError:
        return []


def device_of(path):
    """The PCI address a sysfs `device` link (or a device's own directory) resolves to."""
    return gpuwatch.bus_id(os.path.basename(os.path.realpath(path)))


def pci_chain(sysfs, bus):
    """bus and every bridge above it, from its sysfs path; [bus] where sysfs does not have it."""
    path = os.path.realpath(os.path.join(sysfs, "bus", "pci", "devices", bus))
    chain = [p for p in path.split(os.sep) if gpuwatch.bus_id(p) == p] if os.path.exists(path) \
        else []
    return chain if bus in chain else chain + [bus]


def gpus_in_sysfs(sysfs):
    """The host's NVIDIA and AMD GPUs (display-class functions) in PCI order, from sysfs."""
    base = os.path.join(sysfs, "bus", "pci", "devices")
    out = []
    for name in _listdir(base, 4096):
        vendor = (_read(os.path.join(base, name, "vendor"), 64) or "").strip()
        cls = (_read(os.path.join(base, name, "class"), 64) or "").strip()
        if vendor in GPU_VENDORS and cls.startswith("0x03") and gpuwatch.bus_id(name):
            out.append(gpuwatch.bus_id(name))
    return out


def visible(gpus, value):
    """The GPUs of CUDA_VISIBLE_DEVICES=value among gpus (the host's, in index order): every one
    where it is unset or names a UUID (only NVML maps those); CUDA stops at an entry that is
    not a GPU."""
    if value is None:
        return list(gpus)
    out = []
    for item in str(value).split(","):
        item = item.strip()
        if item.startswith(("GPU-", "MIG-")):
            return list(gpus)
        if not item.isdigit() or int(item) >= len(gpus):
            break
        out.append(gpus[int(item)])
    return out


def name_list(spec, default_exclude=()):
    """(exclude, exact, [(name, port or None)]) of an NCCL name list (NCCL_IB_HCA,
    NCCL_SOCKET_IFNAME: `^` excludes, `=` is exact, else a prefix; `:port`); unset excludes
    default_exclude."""
    spec = str(spec or "").strip()
    if not spec:
        return True, False, [(n, None) for n in default_exclude]
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    entries = []
    for item in spec.split(",")[:64]:
        name, _sep, port = item.strip().partition(":")
        if name:
            entries.append((name, int(port) if port.isdigit() else None))
    return exclude, exact, entries


def chosen(name, port, spec):
    """Whether an NCCL name list (name_list's) picks device name (at port; None: any port)."""
    exclude, exact, entries = spec
    hit = any((name == e if exact else name.startswith(e)) and (None in (p, port) or p == port)
              for e, p in entries)
    return hit != exclude


def route_nic(addr):
    """The interface traffic to addr leaves by (the kernel's own lookup, netlink), the one that
    holds addr where it is this host's own; None where that cannot be said. Never raises."""
    try:
        addr = str(addr or "").strip()
        if not addr or "\0" in addr:
            return None
        try:
            ip = str(ipaddress.ip_address(addr))
        except ValueError:  # a name: resolved as the agent's own client resolved it
            ip = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)[0][4][0]
        route = netlink.route_get(ip)
        if route.get("local"):
            return net.nic_holding(netlink.interfaces(), ip) or route.get("dev")
        return route.get("dev")
    except (OSError, ValueError, IndexError, UnicodeError):
        return None


class Scope:
    """The run's devices on this host: what a fatal event must be on to stay fatal. sysfs: the
    root sysfs is read under (injectable for the tests), rdma_root: /sys/class/infiniband, env:
    the run's environment (NCCL_IB_HCA, NCCL_IB_DISABLE, NCCL_SOCKET_IFNAME, CUDA_VISIBLE_DEVICES,
    MASTER_ADDR); master_addr: the master's address (else env's MASTER_ADDR); route: addr -> the
    interface that reaches it, or None (route_nic; injectable for the tests)."""

    def __init__(self, sysfs=SYSFS, rdma_root=rdma.SYSFS, env=None, master_addr=None,
                 route=route_nic):
        self.sysfs, self.rdma_root, self.env = sysfs, rdma_root, dict(env or {})
        self.master_addr = master_addr or self.env.get("MASTER_ADDR")
        self.route, self._master_nic = route, False  # False: not asked yet
        self.hca_spec = name_list(self.env.get("NCCL_IB_HCA"))
        self.ib_used = str(self.env.get("NCCL_IB_DISABLE", "0")).strip() != "1" \
            and self.env.get("TORCHFLEET_BACKEND") != "gloo"
        self.gpus = self.run_gpus = []  # the host's GPUs in index order; those the run sees
        self.devices = set()
        self.pci = os.path.isdir(os.path.join(sysfs, "bus", "pci", "devices"))
        self._from = self._sysfs_gpus = None

    def hca_ports(self):
        """The RDMA ports NCCL uses ({"mlx5_0/1", ...}) among those under rdma_root."""
        if not self.ib_used:
            return set()
        out = set()
        for name in _listdir(self.rdma_root, rdma.MAX_DEVICES):
            for port in _listdir(os.path.join(self.rdma_root, name, "ports"), rdma.MAX_PORTS):
                if port.isdigit() and chosen(name, int(port), self.hca_spec):
                    out.add("%s/%s" % (name, port))
        return out

    def master_nic(self):
        """The interface that routes to the master (asked once), or None."""
        if self._master_nic is False:
            self._master_nic = None
            if self.master_addr:
                try:
                    nic = self.route(self.master_addr)
                except Exception:  # an injected route's fault: as if unknown
                    nic = None
                self._master_nic = nic if isinstance(nic, str) and nic else None
        return self._master_nic

    def _nics(self):
        spec = self.env.get("NCCL_SOCKET_IFNAME") or self.env.get("GLOO_SOCKET_IFNAME")
        if not spec and self.master_nic():
            # Unset: the run's sockets (rendezvous, TCP store, gloo) reach the master by its
            # route; every NIC but lo and docker only where that route is unknown.
            spec = "=" + self.master_nic()
        spec = name_list(spec, ("lo", "docker"))
        base = os.path.join(self.sysfs, "class", "net")
        out = set()
        for name in _listdir(base, 256):
            if not chosen(name, None, spec):
                continue
            # A bond's or a team's own device is none: its lower interfaces' are.
            links = [os.path.join(base, name)] + [
                os.path.join(base, name, x) for x in _listdir(os.path.join(base, name), 256)
                if x.startswith("lower_")]
            out.update(d for d in (device_of(os.path.join(p, "device")) for p in links
                                   if os.path.exists(os.path.join(p, "device"))) if d)
        return out

    def update(self, buses=None):
        """The run's devices again when the GPUs known changed (buses: GpuWatch.buses(), in
        index order; a GPU whose address NVML could not read is None there and keeps its slot,
        so that CUDA_VISIBLE_DEVICES' indices still name the GPUs after it)."""
        if buses and any(gpuwatch.bus_id(x) for x in buses):
            gpus = [gpuwatch.bus_id(x) for x in list(buses)[:gpuwatch.MAX_GPUS]]
        else:
            if self._sysfs_gpus is None:
                self._sysfs_gpus = gpus_in_sysfs(self.sysfs) if self.pci else []
            gpus = self._sysfs_gpus
        if self._from == gpus:
            return
        self._from, self.gpus = gpus, gpus
        self.run_gpus = visible(gpus, self.env.get("CUDA_VISIBLE_DEVICES"))
        hcas = {name.split("/")[0] for name in self.hca_ports()}
        own = {b for b in self.run_gpus if b} | self._nics() | {
            d for d in (device_of(os.path.join(self.rdma_root, h, "device")) for h in hcas
                        if os.path.exists(os.path.join(self.rdma_root, h, "device"))) if d}
        self.devices = {b for d in own for b in pci_chain(self.sysfs, d)}

    def judge(self, event):
        """Whether a fatal event's device is the run's: True, False, or None where nothing can
        tell (no device named; a GPU's event on a host whose GPUs cannot be listed; no sysfs)."""
        bus = event.get("pci_bus")
        if event.get("kind") == "oom" or bus is None:
            return None
        if (event.get("kind") in GPU_KINDS and not any(self.gpus)) or (
                not self.pci and not self.devices):
            return None
        return bus in self.devices


class HostWatch:
    """The host's hardware from the run's start: look() each beat, take() what to send.
    env: the run's environment (the agent's, with the run's env over it); sysfs: where sysfs is
    read (default: above rdma_sysfs when that is <root>/class/infiniband, else /sys); gpu: a
    GpuWatch (the tests give a stand-in); cgroup_fs: where the cgroup file system is;
    master_addr, route: how the NIC of the run's sockets is found (Scope)."""

    def __init__(self, kernel_log=kmsg.KMSG, rdma_sysfs=ibwatch.rdma.SYSFS, command=None,
                 env=None, sysfs=None, gpu=None, cgroup_fs=CGROUP_FS, master_addr=None,
                 route=route_nic):
        rdma_sysfs = rdma_sysfs or rdma.SYSFS
        if sysfs is None:
            head, tail = os.path.split(os.path.normpath(rdma_sysfs))
            sysfs = os.path.dirname(head) if tail == "infiniband" and \
                os.path.basename(head) == "class" else SYSFS
        self.scope = Scope(sysfs, rdma_sysfs, env, master_addr, route)
        self.scope.master_nic()  # at the agent's start: a name's lookup never delays a look
        self.cgroup_fs = cgroup_fs
        self.log = kmsg.KernelLog(kernel_log)
        self.gpu = gpu if gpu is not None else gpuwatch.GpuWatch(command)
        self.ib = ibwatch.IbWatch(rdma_sysfs, self.scope.hca_ports() if self.scope.ib_used
                                  else set())
        self.faults = {}    # key -> {"event", "count", "sent", "read_m", "next_m", "seen"}
        self.queue = []     # keys with something to send
        self.tree = {}      # PID of a rank's descendant (or the ranks' torchrun) -> rank or None
        self.tree_seen = {}  # its PID -> when a walk last found it alive
        self.rank_facts = {}  # rank PID -> (CUDA_VISIBLE_DEVICES, LOCAL_RANK, own_cgroup())
        self.oom_kills = {}   # a rank cgroup's directory -> its own OOM kills, when last read
        self.xids = {}      # GPU bus -> (when, its uncertainty, Scope.judge, code, gpu) of its
        #                     newest fatal Xid: what a fatal SXid after it is judged by
        self.gone, self.walk_m = set(), 0.0  # ranks seen dead; when the tree is walked next
        self.gpu_pids = {}  # GPU -> the PIDs NVML last saw computing on it
        self.warned = self.dropped = 0
        self.others = 0     # other programs' OOM kills sent as events of their own
        self.folded = {}    # ("oom", PID) of a kill counted in OTHERS -> when read (OOM_SAME_S)
        self.error, self.errors = None, 0  # the watch's own first fault, and how many

    def status(self):
        """What the master's record says of this host's watch."""
        out = {"kmsg": self.log.how, "kmsg_error": self.log.why,
               "gpu": getattr(self.gpu, "how", None),
               "dropped": self.dropped + getattr(self.gpu, "dropped", 0)}
        why = getattr(self.gpu, "why", None)
        if why:
            out["gpu_error"] = why
        if self.error:  # the watch's own fault, apart from the kernel log's reason
            out["watch_error"] = self.error if self.errors < 2 else "%s (%d times)" % (
                self.error, self.errors)
        return out

    def _failed(self, exc):
        self.errors += 1
        if self.error is None:
            self.error = ("the hardware watch failed: %s" % (
                str(exc) or type(exc).__name__))[:ERROR_MAX]

    # -- the ranks' processes -----------------------------------------------------------------

    def _follow(self, now_m, ranks):
        """The ranks' facts at first sight (their environ and cgroup go with them) and, every
        TREE_EVERY_S, their descendants, kept for the OOM killer's lines that come after they
        died."""
        walk, reads = now_m >= self.walk_m, 0
        if walk:
            self.walk_m = now_m + TREE_EVERY_S
        for pid, rank in list(ranks.items())[:256]:
            if pid not in self.rank_facts:
                env = procs.environ(pid)
                cgroup = own_cgroup(pid)
                local = env.get(b"LOCAL_RANK", b"").decode(errors="replace")
                visible_ = env.get(b"CUDA_VISIBLE_DEVICES")
                self.rank_facts[pid] = (
                    None if visible_ is None else visible_.decode(errors="replace"),
                    int(local) if local.isdigit() else rank[0], cgroup)
                if cgroup and cgroup[1] not in self.oom_kills:
                    self.oom_kills[cgroup[1]] = oom_kills(self.cgroup_fs, cgroup[1])
                parent = procs.parent(pid)
                if parent and parent not in ranks and parent != os.getpid():
                    self._remember(parent, None, now_m)  # torchrun: the run's, no rank's
            if not walk or pid in self.gone:
                continue
            if not procs.alive(pid):
                self.gone.add(pid)  # its PID may be another process's one day
                continue
            todo = [pid]
            while todo and reads < WALK_MAX:
                reads += 1
                for child in procs.children(todo.pop()):
                    if child not in ranks:
                        self._remember(child, rank, now_m)
                        todo.append(child)
        if walk:
            self._forget(now_m, ranks)

    def _remember(self, pid, rank, now_m):
        self.tree.pop(pid, None)
        self.tree[pid] = rank
        self.tree_seen[pid] = now_m
        while len(self.tree) > TREE_MAX:
            oldest = next(iter(self.tree))
            del self.tree[oldest]
            self.tree_seen.pop(oldest, None)

    def _forget(self, now_m, ranks):
        """Drop a descendant no walk has found alive for OOM_SAME_S: its kill line has been read
        by then, and its PID may be another program's next (workers are new each epoch).
        torchrun (no rank's) is kept while it lives."""
        for pid in list(self.tree):
            if self.tree[pid] is None and procs.alive(pid):
                self.tree_seen[pid] = now_m
            elif now_m - self.tree_seen.get(pid, now_m) > OOM_SAME_S:
                del self.tree[pid]
                self.tree_seen.pop(pid, None)

    def _ours(self):
        """This agent's own processes: its ancestors and everything below it."""
        out, pid = set(), os.getpid()
        for _step in range(64):
            if not pid or pid in out:
                break
            out.add(pid)
            pid = procs.parent(pid)
        todo, reads = [os.getpid()], 0
        while todo and reads < 4 * WALK_MAX:
            reads += 1
            for child in procs.children(todo.pop()):
                if child not in out:
                    out.add(child)
                    todo.append(child)
        return out | set(self.tree)

    def _oom_owner(self, event, ranks):
        """(tied to the run, rank or None) of an OOM kill."""
        pid, path = event.get("pid"), event.get("cgroup")
        if not isinstance(path, str) or not path.startswith("/"):
            path = None
        if (pid in ranks or pid in self.tree) and not self._outside(path, ranks):
            rank = ranks[pid] if pid in ranks else self.tree[pid]
            self._counted()
            return True, rank[1] if rank else None
        within = [(p, facts[2]) for p, facts in self.rank_facts.items()
                  if facts[2] and path is not None and same_cgroup(path, facts[2][0])]
        if not within:
            within = self._killed_within()
        if not within or not self._only_ours(within[0][1][1]):
            return False, None  # another lab host's, another program's: not claimed
        tied = {ranks.get(p, (None, None))[1] for p, _cgroup in within} - {None}
        self._counted()
        return True, tied.pop() if len(tied) == 1 else None

    def _counted(self):
        """A kill tied by its PID or path is counted in its cgroup too: taken from the counts,
        so that another program's line never takes it later."""
        for rel in self.oom_kills:
            self.oom_kills[rel] = oom_kills(self.cgroup_fs, rel)

    def _killed_within(self):
        """The ranks whose own cgroup counts an OOM kill more than when last read (cgroup v2's
        memory.events.local, v1's memory.oom_control): a container whose ranks see their
        cgroup as "/" (its own cgroup namespace, Docker's default on cgroup v2) and their PIDs
        in a PID namespace of their own, where neither the kernel's path nor its PID is theirs.
        The kill is taken from the count, once."""
        for rel, before in list(self.oom_kills.items()):
            now = oom_kills(self.cgroup_fs, rel)
            if now is not None and before is not None and now > before:
                self.oom_kills[rel] = before + 1
                return [(p, facts[2]) for p, facts in self.rank_facts.items()
                        if facts[2] and facts[2][1] == rel]
            if before is None:
                self.oom_kills[rel] = now
        return []

    def _only_ours(self, rel):
        """Whether the cgroup holds this agent's own processes alone (the lab's hosts share one
        kernel and may share one cgroup: another host's victim is never claimed)."""
        procs_text = _read(os.path.join(self.cgroup_fs, rel, "cgroup.procs"), 65536)
        if procs_text is None or len(procs_text) >= 65536:
            return False
        ours = self._ours()
        return all(x.isdigit() and int(x) in ours for x in procs_text.split())

    def _outside(self, path, ranks):
        """Whether the kernel's task_memcg path is in none of the ranks' cgroups (a PID of the
        run's reused by another program); False where a rank's cgroup is unknown."""
        known = [facts[2] for pid, facts in self.rank_facts.items() if pid in ranks]
        if path is None or not known or None in known:
            return False
        return not any(in_cgroup(path, cgroup[0]) for cgroup in known)

    # -- GPUs and ranks -------------------------------------------------------------------------

    def _rank_gpu(self, pid):
        """The GPU a rank computes on from its own CUDA_VISIBLE_DEVICES and LOCAL_RANK."""
        value, local, _cgroup = self.rank_facts.get(pid, (None, None, None))
        seen = visible(self.scope.gpus, value)
        if local is not None and local < len(seen):
            return seen[local]
        return seen[0] if len(seen) == 1 else None

    def _gpu_rank(self, bus, ranks):
        """The one rank that computes on GPU bus, else None: NVML's processes on it where NVML
        answers, else each rank's CUDA_VISIBLE_DEVICES and LOCAL_RANK."""
        pids = self.gpu_pids.get(bus)
        by_nvml = [pid for pid in pids or () if pid in ranks]
        if len(by_nvml) == 1:
            return ranks[by_nvml[0]][1]
        # None of them in NVML's newest sample (dead already) or several (each rank has a
        # context on it): the ranks' own CUDA_VISIBLE_DEVICES and LOCAL_RANK say.
        by_env = [pid for pid in by_nvml or ranks if self._rank_gpu(pid) == bus]
        return ranks[by_env[0]][1] if len(by_env) == 1 else None

    # -- reading ----------------------------------------------------------------------------------

    def _kernel_events(self):
        events = []
        for line in self.log.read():
            event = self.log.parse(line)
            if event is None:
                continue
            # Its age at the read, on this host's monotonic clock: a calibrated /dev/kmsg
            # stamp's, else bounded by the looks (kmsg.KernelLog.age_of).
            age, err = self.log.age_of(event.pop("boot_s", None))
            event.update(source="kmsg", gpu=None, age_s=age, age_err_s=err)
            events.append(event)
        return events

    def look(self, now_m, ranks):
        """Read every source that is due. ranks: {pid: (local_rank, rank)} of the run's live and
        dead ranks on this host (the agent's own list). Never raises."""
        try:
            self._follow(now_m, ranks)
            self.scope.update(getattr(self.gpu, "buses", lambda: None)())
            found = self._kernel_events()
            for e in self.gpu.look(now_m):
                found.append(dict(e, age_s=e.get("age_s", 0.0), age_err_s=e.get(
                    "age_err_s", gpuwatch.NVML_EVERY_S)))
            found += self.ib.look(now_m)
            taken = getattr(self.gpu, "processes", lambda: None)()
            for bus, pids in (taken or {}).items():
                if gpuwatch.bus_id(bus) and pids:
                    self.gpu_pids[gpuwatch.bus_id(bus)] = set(pids)
        except Exception as exc:  # a watcher's fault never stops the run's agent
            self._failed(exc)
            return
        # A look's SXids after its Xids (NVML's come after the kernel log's lines): an SXid is
        # judged by the Xids before it (_judge).
        found.sort(key=lambda e: e.get("kind") == "nvswitch")
        for event in found:
            try:
                self._add(event, now_m, ranks)
            except Exception as exc:  # one odd event: the others still go
                self._failed(exc)

    def _add(self, event, now_m, ranks):
        event["pci_bus"] = gpuwatch.bus_id(event.get("pci_bus")) or None
        bus = event["pci_bus"]
        if event.get("gpu") is None and bus is not None and bus in self.scope.gpus:
            event["gpu"] = self.scope.gpus.index(bus)
        if event["kind"] == "oom":
            key = ("oom", event.get("pid"))
            folded_m = self.folded.pop(key, None)
            if folded_m is not None and now_m - folded_m <= OOM_SAME_S:
                self.folded[key] = folded_m  # a later line of a kill already counted
                return
        elif event["kind"] == "xid":  # the kernel's line has the PID, NVML's has none
            key = ("xid", event.get("code"), bus or ("gpu", event.get("gpu")))
        else:
            key = (event["kind"], event.get("code"), bus, event.get("pid"), event.get("gpu"))
        fault = self.faults.get(key)
        if fault is not None and event["kind"] == "oom" and key not in self.queue \
                and now_m - fault["read_m"] > OOM_SAME_S:
            del self.faults[key]  # its PID used again, by a process killed again
            fault = None
        at = now_m - event["age_s"]
        if event["kind"] == "xid" and event.get("fatal") and bus is not None:
            self._xid_seen(bus, event, at)
        if fault is not None:
            if event["kind"] == "oom":  # one kill's lines (oom-kill:, then Killed process)
                if not fault["sent"]:
                    kept = fault["event"]
                    kept["cgroup"] = kept.get("cgroup") or event.get("cgroup")
                    tied = kept.get("fatal") is True
                    if "oom-kill:" in kept["line"]:
                        kept.update(line=event["line"], what=event["what"])
                    if not tied:  # (a kill tied once stays so: its cgroup's count is taken)
                        self._judge(kept, ranks)
                return
            if event.get("fatal") and not fault["event"].get("fatal") \
                    and self._turned_fatal(key, fault, event, now_m, ranks):
                return
            more = sum(not self._paired(fault, event, at) for _sighting in range(_count(event)))
            if not more:
                return
            fault["count"] += more
            if fault["sent"] not in (0, DROPPED) and key not in self.queue:
                self.queue.append(key)
            return
        if len(self.faults) >= KEYS_MAX and not event.get("fatal"):
            self.dropped += 1
            return
        event["rank"] = None
        self._judge(event, ranks, at)
        self.faults[key] = {"event": event, "count": _count(event), "sent": 0, "read_m": now_m,
                            "next_m": 0.0, "seen": {event["source"]: [(at, event["age_err_s"])]}}
        self.queue.append(key)

    def _turned_fatal(self, key, fault, event, now_m, ranks):
        """A fault kept as a warning that comes again fatal (NVML that has not answered for
        NVML_FATAL_S): sent again at once, fatal, dated by this sighting, unless it is not
        the run's; a warning dropped past the cap is sent too (a fatal event never is
        dropped)."""
        kept = dict(fault["event"], fatal=True, what=event["what"], line=event["line"],
                    age_s=event["age_s"], age_err_s=event.get("age_err_s", 0.0))
        self._judge(kept, ranks, now_m - kept["age_s"])
        if not kept["fatal"]:
            return False
        fault.update(event=kept, read_m=now_m, next_m=0.0, count=fault["count"] + _count(event),
                     sent=0 if fault["sent"] == DROPPED else fault["sent"])
        if key not in self.queue:
            self.queue.append(key)
        return True

    def _paired(self, fault, event, at):
        """Whether this sighting is one another source already counted (an Xid in the kernel
        log and through NVML, within SAME_S and their uncertainties)."""
        err = event.get("age_err_s", 0.0)
        for source, times in fault["seen"].items():
            if source == event["source"]:
                continue
            for i, (t, e) in enumerate(times):
                if abs(at - t) <= SAME_S + err + e:
                    del times[i]
                    return True
        mine = fault["seen"].setdefault(event["source"], [])
        mine.append((at, err))
        del mine[:-64]
        return False

    def _xid_seen(self, bus, event, at):
        """A fatal Xid's GPU, when, and whether it is the run's (Scope.judge): what a fatal
        SXid after it is judged by."""
        self.xids.pop(bus, None)
        # Outside the run only as one of the host's GPUs the run does not see: an address
        # that is no GPU of the list cannot be judged (the SXid after it stays fatal).
        ours = self.scope.judge(event) if bus in self.scope.gpus else None
        self.xids[bus] = (at, event.get("age_err_s", 0.0), ours, event.get("code"),
                          event.get("gpu"))
        while len(self.xids) > XIDS_MAX:
            del self.xids[next(iter(self.xids))]

    def _sxid_owner(self, at, err):
        """The GPU outside the run whose fatal Xid a fatal SXid at `at` follows (its bus and
        xids entry), or None: none did within SXID_AFTER_XID_S, or a GPU of the run (or one
        that cannot be judged) had one then too: the SXid stays the run's."""
        owner = None
        for bus, entry in self.xids.items():
            t, e, ours = entry[:3]
            slack = err + e
            if not -slack <= at - t <= SXID_AFTER_XID_S + slack:
                continue
            if ours is not False:
                return None
            owner = (bus, entry)
        return owner

    def _judge(self, event, ranks, at=None):
        """The event's rank, and fatal only where it is the run's (a fatal SXid: unless it
        follows another GPU's fatal Xid, _sxid_owner)."""
        if event["kind"] == "oom":
            tied, rank = self._oom_owner(event, ranks)
            event["rank"], event["fatal"] = rank, tied
            note = ": not a process of the run"
            if not tied and not event["what"].endswith(note):
                event["what"] += note
            elif tied and event["what"].endswith(note):
                event["what"] = event["what"][:-len(note)]
            return
        rank = ranks.get(event.get("pid")) or self.tree.get(event.get("pid"))
        if rank is None and event.get("pci_bus") is not None \
                and event["pci_bus"] in self.scope.gpus:
            event["rank"] = self._gpu_rank(event["pci_bus"], ranks)
        else:
            event["rank"] = rank[1] if rank else None
        if event.get("fatal") and self.scope.judge(event) is False:
            event["fatal"] = False
            event["what"] = "%s: not a device of the run" % event["what"]
        elif event.get("fatal") and event["kind"] == "nvswitch" and at is not None:
            owner = self._sxid_owner(at, event.get("age_err_s", 0.0))
            if owner is not None:
                bus, (t, _e, _ours, code, gpu) = owner
                event["fatal"] = False
                # (its words without "judged host-wide": it is judged that GPU's)
                event["what"] = "%s: %.0f s after Xid %s on GPU %s (%s), that GPU's links: " \
                    "not a device of the run" % (
                        event["what"].replace(kmsg.SXID_HOST_WIDE, "").rstrip(": "),
                        max(0.0, at - t), code, "?" if gpu is None else gpu, bus)

    def _fold_others(self, now_m):
        """Other programs' OOM kills (kmsg.parse makes one event of a kill, its 4.19+ oom-kill:
        summary held for the "Killed process" line): the first OOM_OTHERS keep an event of their own; each later one is counted in OTHERS,
        which carries the newest's line, and forgotten (its PID kept OOM_SAME_S, for a line of
        the same kill read late)."""
        queue = []
        for key in self.queue:
            fault = self.faults[key]
            event = fault["event"]
            if key == OTHERS or event["kind"] != "oom" or event.get("fatal") or fault["sent"] \
                    or fault.get("alone"):
                queue.append(key)
                continue
            if self.others < OOM_OTHERS:
                self.others += 1
                fault["alone"] = True
                queue.append(key)
                continue
            del self.faults[key]
            self.folded[key] = fault["read_m"]
            while len(self.folded) > TREE_MAX:
                del self.folded[next(iter(self.folded))]
            others = self.faults.get(OTHERS)
            newest = dict(event, code="others", pid=None, rank=None, what=OTHERS_WHAT)
            if others is None:
                others = self.faults[OTHERS] = {"event": newest, "count": 0, "sent": 0,
                                                "next_m": 0.0, "seen": {}}
            others["event"], others["read_m"] = newest, fault["read_m"]
            others["count"] += 1
            if others["sent"] != DROPPED:
                queue.append(OTHERS)
        self.queue = list(dict.fromkeys(queue))  # (OTHERS once)

    def take(self, now_m):
        """At most PER_BEAT events for this beat, fatal ones first, their ages grown by how
        long they waited; a fault seen again goes again with its count."""
        self._fold_others(now_m)
        out, later = [], []
        for key in sorted(self.queue, key=lambda k: not self.faults[k]["event"].get("fatal")):
            fault = self.faults[key]
            event = fault["event"]
            if len(out) >= PER_BEAT or fault["sent"] and now_m < fault["next_m"]:
                later.append(key)
                continue
            if not fault["sent"] and not event.get("fatal"):
                if self.warned >= PER_RUN:
                    self.dropped += 1
                    fault["sent"] = DROPPED
                    continue
                self.warned += 1
            fault["sent"], fault["next_m"] = fault["count"], now_m + RESEND_S
            sent = {k: v for k, v in event.items() if k != "cgroup"}
            sent.update(count=fault["count"], age_err_s=round(min(
                AGE_MAX_S, max(0.0, event.get("age_err_s", 0.0))), 3),
                age_s=round(event["age_s"] + max(0.0, now_m - fault["read_m"]), 3))
            out.append(sent)
        self.queue = later
        return out

    def close(self):
        self.log.close()
        self.ib.close()
        getattr(self.gpu, "close", lambda: None)()


def _count(event):
    """How many sightings an event stands for (gpuwatch counts an Xid's repeats between two
    looks), at least 1 and bounded."""
    count = event.get("count")
    return min(1 << 20, count) if isinstance(count, int) and count > 1 else 1


def own_cgroup(pid):
    """(the cgroup path of pid as its /proc/<pid>/cgroup says it, the directory that holds it
    under the cgroup file system): the memory controller's under cgroup v1, the unified one's
    under v2; None when unreadable."""
    text = _read("/proc/%d/cgroup" % pid, 8192) or ""
    unified = None
    for line in text.splitlines():
        hierarchy, _sep, rest = line.partition(":")
        controllers, _sep, path = rest.partition(":")
        if "memory" in controllers.split(","):
            return path, os.path.join("memory", path.lstrip("/"))
        if hierarchy == "0" and controllers == "":
            unified = (path, path.lstrip("/"))
    return unified


def oom_kills(cgroup_fs, rel):
    """How many processes the OOM killer ended in this cgroup itself (cgroup v2's
    memory.events.local, v1's memory.oom_control), None where neither says."""
    for name in ("memory.events.local", "memory.oom_control"):
        for line in (_read(os.path.join(cgroup_fs, rel, name), 4096) or "").splitlines():
            key, _sep, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value.strip())
    return None


def same_cgroup(kernel_path, own_path):
    """Whether the kernel's task_memcg names the cgroup a rank sees as own_path: the same path,
    or (a cgroup namespace, where a process sees its path from the namespace's root) one that
    ends with it; the namespace's root itself ("/") matches only "/"."""
    kernel_path, own_path = kernel_path.rstrip("/") or "/", own_path.rstrip("/") or "/"
    if kernel_path == own_path:
        return True
    return own_path != "/" and kernel_path.endswith(own_path)


def in_cgroup(kernel_path, own_path):
    """Whether the kernel's task_memcg is the cgroup a rank sees as own_path or one below it
    (same_cgroup's namespace rule); every path is below the root "/"."""
    own = own_path.rstrip("/")
    return not own or same_cgroup(kernel_path, own_path) or \
        own + "/" in kernel_path.rstrip("/") + "/"
