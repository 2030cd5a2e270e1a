#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_probe
short_description: Gather everything torchfleet's preflight needs from one host in one call
description:
  - Returns the host's NICs and addresses, hostname resolution, GPUs (from C(nvidia-smi)),
    NVIDIA driver, the CUDA build and NCCL version of torch, torch and Python versions,
    C(/dev/shm) size, NCCL_/GLOO_/TORCH_ environment, a fingerprint of O(code_dir) and the
    state of O(data_paths).
  - Torch is never imported; versions come from package metadata and C(torch/version.py).
  - A host without C(nvidia-smi) is looked at for AMD GPUs (C(amd-smi), C(rocm-smi), the kernel's
    KFD topology); one without any is reported with no GPUs, not as an error.
  - On the master (when O(master_port) is given) it also names the processes already listening
    on that port, picks a free port in the ephemeral range for the reachability test, and
    decides the address the workers will dial.
  - With O(connect_addr) the port test happens in the same call (one round trip per host);
    every host opens TCP connections to the master while the master's own call holds the
    listener, waits for them and removes it. Without it, M(torchfleet.fleet.port_probe) does that in a second
    round.
  - Reads only; changes nothing on the host (the listener it may start ends before it returns,
    or is stopped by M(torchfleet.fleet.port_probe)).
version_added: "0.1.0"
author: torchfleet developers (@torchfleet)
options:
  python:
    description: Interpreter that has torch. Defaults to the interpreter running this module.
    type: str
  code_dir:
    description: Directory whose files must be identical on every host. Not fingerprinted when unset.
    type: path
  data_paths:
    description: Paths that must exist on every host.
    type: list
    elements: str
    default: []
  script:
    description: The training script; reported as present or missing.
    type: str
  run_dir:
    description: This host's directory for the coming run; reported as free or already there
      (a run_id used before).
    type: path
  master_port:
    description: Set on the master only; reports what already listens there.
    type: int
  master_addr:
    description: The user's master_addr, if any; returned as is.
    type: str
  socket_ifname:
    description: The user's socket_ifname, if any; the master address is taken from it.
    type: str
  address_hint:
    description: The address the controller uses for this host (ansible_host); preferred as master address when it is local.
    type: str
  listen:
    description:
      - On the master, bind O(master_port) (when free) and the chosen ephemeral port and leave a
        detached listener accepting connections, so M(torchfleet.fleet.port_probe) on every host can test them.
      - The listener ends by itself after O(expect_peers) connections per port, or when
        O(listen_idle_s) pass without a connection; M(torchfleet.fleet.port_probe) given its PID (its
        C(listener_pid) option) stops it sooner.
    type: bool
    default: false
  expect_peers:
    description: Connections per port after which the listener ends.
    type: int
    default: 1
  keep_listener:
    description: On the master with O(connect_addr), return without waiting for the other hosts'
      connections and leave the listener up (the hosts come in later fork batches); a later
      M(torchfleet.fleet.port_probe) given its PID (its C(listener_pid) option) removes it.
    type: bool
    default: false
  listen_idle_s:
    description: The listener ends when no connection arrived for this long (from its start,
      then from the last connection); with O(container_image) and O(keep_listener), longer by
      the image's pull and create timeouts (the hosts of a later fork batch dial once a pulling
      probe returns).
    type: float
    default: 60
    aliases: [listen_max_s]
  ephemeral_port:
    description:
      - The port of the ephemeral-port test, chosen by the controller so that every host knows
        it before the master answers. The master listens there unless a process already does
        (the connection then reaches that process, which tests the firewall just as well).
      - Unset on the master means it picks a free one itself (two-round test).
    type: int
  connect_addr:
    description: Open TCP connections from this host to this address, at O(connect_ports), in
      the background while the facts are gathered.
    type: str
  connect_ports:
    description: Ports to connect to at O(connect_addr).
    type: list
    elements: int
    default: []
  connect_timeout_s:
    description: Time allowed for each connection attempt; a dropped port times out after it.
    type: float
    default: 3
  connect_retry_s:
    description: How long "connection refused" is retried, since the master's listener may
      start after this host's probe (hosts start one after the other). Defaults to
      O(connect_timeout_s).
    type: float
  listener_wait_s:
    description: With O(listen) and O(connect_addr), how long the master waits for every
      host's connections before it stops the listener and returns.
    type: float
    default: 5
  env_prefixes:
    description: Environment variables with these prefixes are returned for comparison across hosts.
    type: list
    elements: str
    default: [NCCL_, GLOO_, TORCH_]
  max_code_files:
    description: Stop hashing O(code_dir) after this many files (reported as truncated).
    type: int
    default: 20000
  health:
    description: Node health level; C(basic) and C(full) gather the GPUs' and the host's health
      (C(nvidia-smi -q), C(nvidia-smi nvlink -s), the kernel log's Xids, C(amd-smi), memlock,
      free space); C(off) gathers none.
    type: str
    choices: ["off", basic, full]
    default: basic
  health_xid_window_s:
    description: Xids of the kernel log's last this many seconds are returned.
    type: int
    default: 7200
  container_image:
    description: The run's image. When set, the runtime, the image (pulled when missing, or
      loaded from an archive for podman and docker) and its id are returned as C(container),
      and the Python probe runs in the image.
    type: str
    default: ""
  container_runtime:
    description: The runtime for O(container_image); C(auto) takes the first of podman, docker,
      apptainer and enroot installed here.
    type: str
    choices: [auto, podman, docker, apptainer, enroot]
    default: auto
  container_mounts:
    description: Mounted read-only into the probe's container (an image's Python may live in
      one); a path, or host:container.
    type: list
    elements: str
    default: []
  container_options:
    description: Given to the probe's container too (what any container on the host may need,
      like C(--ulimit host)).
    type: list
    elements: str
    default: []
  disk_paths:
    description: Where the run writes (its run directory root, the checkpoint directory); their
      free space is returned.
    type: list
    elements: str
    default: []
  rdma_sysfs:
    description: Where the kernel lists RDMA devices; another directory of the same layout is read
      instead (tests, or a container that mounts the host's sysfs elsewhere).
    type: path
    default: /sys/class/infiniband
  kernel_log:
    description: The kernel log a run's agent will follow for hardware events; whether it can
      be read here is returned (C(kmsg)).
    type: str
    default: /dev/kmsg
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reads only; the port test's listener on the master (a process, no file) runs in
      check mode too and is gone when preflight ends.
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Probe every node
  node_probe:
    python: /opt/venv/bin/python
    code_dir: /srv/train
    data_paths: [/data/shards]
  register: probe

- name: Probe the master too for its port
  node_probe:
    master_port: 29500
  when: inventory_hostname == groups['nodes'][0]
"""

RETURN = r"""
health:
  description: >-
    The host's health facts (module_utils/host/health.py's facts), null with O(health=off):
    vendor, per-GPU state (ECC, remapped rows, retired pages, PCIe width, clock-event reasons,
    persistence, fabric, NVLinks, processes with their users), the Xids of the window, whether
    the kernel log could be read, memlock, RDMA, nvidia_peermem, fabric manager, free space.
  returned: always
  type: dict
  sample: {"vendor": "nvidia", "smi_failed": null, "kernel_log": "read", "xids": [],
           "xid_window_s": 7200, "memlock_kib": -1, "rdma": true, "peermem": true,
           "fabricmanager": "active",
           "disk": [{"path": "~/.torchfleet/runs", "free_bytes": 81604378624, "mount": "/home"}],
           "gpus": [{"index": 0, "bus_id": "00000000:53:00.0", "name": "NVIDIA H100 80GB HBM3",
                     "ecc_uncorrected": 0, "remap_pending": false, "pcie_width": 16,
                     "pcie_width_max": 16, "clock_events": ["Idle"], "processes": []}]}
hostname:
  description: The host's name and the addresses it resolves to.
  returned: always
  type: dict
  sample: {"name": "node0", "addresses": ["10.0.0.1"], "loopback": false}
nics:
  description: One entry per interface.
  returned: always
  type: list
  elements: dict
  sample: [{"name": "eth0", "up": true, "loopback": false, "ipv4": ["10.0.0.1"], "ipv6": []}]
default_dev:
  description: Interface of the default route, or null.
  returned: always
  type: str
gpus:
  description: GPUs from nvidia-smi, else AMD GPUs from amd-smi, rocm-smi or /sys/class/kfd;
    empty when none of them finds one.
  returned: always
  type: list
  elements: dict
  sample: [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-...", "driver_version": "580.159.03",
            "memory_total_mib": 143771, "pci_bus_id": "00000000:18:00.0"}]
nvidia_smi:
  description: Whether nvidia-smi was found, and its error if it failed.
  returned: always
  type: dict
gpu_tool:
  description: What listed the GPUs (nvidia-smi; where it is absent, amd-smi, rocm-smi or the
    kernel's KFD topology), whether one was found, and its error if it failed.
  returned: always
  type: dict
  sample: {"tool": "amd-smi", "found": true, "error": null}
versions:
  description: python, torch, cuda (torch's CUDA build), hip (torch's HIP build), nccl (NCCL, or
    RCCL on ROCm), driver, rocm (/opt/rocm/.info/version); null when absent.
  returned: always
  type: dict
  sample: {"python": "3.11.7", "torch": "2.13.0", "cuda": null, "hip": null, "nccl": null,
           "driver": null, "rocm": null}
python:
  description: The interpreter examined and its error when it could not run.
  returned: always
  type: dict
  sample: {"executable": "/usr/bin/python3", "error": null}
shm:
  description: Size of /dev/shm.
  returned: always
  type: dict
  sample: {"total_bytes": 67108864, "free_bytes": 67108864}
kmsg:
  description: Whether the kernel log a run follows can be read (C(error) null) and why not.
  returned: always
  type: dict
  sample: {"source": "/dev/kmsg", "error": null}
env:
  description: Environment variables with the requested prefixes.
  returned: always
  type: dict
code:
  description: Fingerprint of code_dir (null when code_dir is unset).
  returned: always
  type: dict
  sample: {"exists": true, "git_commit": "3f2a...", "git_dirty": false, "files": {"train.py": "ab12..."}, "truncated": false}
script:
  description: The training script and whether it exists (null when O(script) is unset).
  returned: always
  type: dict
  sample: {"path": "/srv/code/train.py", "exists": true}
run_dir:
  description: This host's directory for the coming run and whether it already exists (null
    when O(run_dir) is unset).
  returned: always
  type: dict
  sample: {"path": "/home/u/.torchfleet/runs/20261122-0301-ab12/node0", "exists": false}
rdma:
  description: RDMA devices from sysfs (no ibstat needed) - each device's netdevs and ports with
    state, phys_state, rate, link_layer and GIDs (index, gid, ipv4, type, netdev); a file that
    could not be read is an error beside its device or port, never a value.
  returned: always
  type: dict
  sample: {"root": "/sys/class/infiniband", "present": true, "error": null,
           "devices": [{"name": "mlx5_0", "netdevs": ["ib0"], "error": null,
                        "ports": [{"port": 1, "state": "ACTIVE", "phys_state": "LinkUp",
                                   "rate": "200 Gb/sec (4X HDR)", "rate_gbps": 200.0,
                                   "link_layer": "InfiniBand", "gids": [], "error": null}]}]}
container:
  description: With O(container_image) (else null) - the runtime used, its error (the
    container.runtime check), the pull's error (container.pull), whether it was pulled (or
    loaded from an archive), the name the runtime knows it by (local - an archive's is the
    tag localhost/torchfleet-archive:HASH of its path, size and mtime), the image's id
    (container.digest), the CUDA its env declares (cuda - CUDA_VERSION and whether
    it carries the forward-compatibility libraries; container.driver), and on a host with
    NVIDIA GPUs why the runtime cannot give them to a container (gpu_error, null when it can;
    container.gpu).
  returned: always
  type: dict
  sample: {"image": "nvcr.io/nvidia/pytorch:24.05-py3", "runtime": "podman", "error": null,
           "pull_error": null, "pulled": false, "local": "nvcr.io/nvidia/pytorch:24.05-py3",
           "digest": "sha256:3b48991e50fd",
           "cuda": {"version": "12.4.1.003", "compat": true}}
euid:
  description: The effective user id the probe ran as (binding a port below 1024 needs 0).
  returned: always
  type: int
stacks:
  description: Whether py-spy can attach to the ranks here to dump a hang's stacks (py_spy
    path, Yama's ptrace_scope, CAP_SYS_PTRACE held by the user or py-spy, can_attach, why
    not), by the kernel's rules and then tried for real on a Python process of the run's user;
    where it cannot, the ranks' own faulthandler is used.
  returned: always
  type: dict
  sample: {"py_spy": "/opt/venv/bin/py-spy", "ptrace_scope": 1, "cap_sys_ptrace": false,
           "can_attach": false, "why": "kernel.yama.ptrace_scope=1 and neither the run's user
           nor /opt/venv/bin/py-spy holds CAP_SYS_PTRACE"}
data:
  description: One entry per data path.
  returned: always
  type: list
  elements: dict
  sample: [{"path": "/data", "exists": true, "kind": "dir"}]
connect:
  description: Only with O(connect_addr); shaped like M(torchfleet.fleet.port_probe)'s result (route, route_error,
    ports, and on the master what became of the listener).
  returned: when connect_addr is set
  type: dict
  sample: {"route": {"dev": "eth0", "src": "10.0.0.2", "local": false, "nic": "eth0"},
           "route_error": null, "listener": "exited",
           "ports": [{"port": 29500, "ok": true, "error": null, "elapsed_s": 0.01,
                      "dialled_at": 1795000000.123}]}
master:
  description: Only on the master; the port's holders, a free ephemeral port and the address workers dial;
    with the one-round port test, when its listener ended (C(listener.ended_at), this host's clock).
  returned: when master_port is set
  type: dict
  sample: {"port": 29500, "holders": [{"pid": 4242, "cmdline": "torchrun ..."}], "in_use": true,
           "ephemeral_port": 51234, "ephemeral_range": [32768, 60999], "addr": "10.0.0.1",
           "listener": {"pid": 4321, "ports": [{"port": 51234, "bound": true, "error": null}],
                        "ended_at": 1795000006.5}}
"""

import os
import random
import socket
import sys
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.command import bounded, missing
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.connect import Connector, interfaces, route_to
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.connect import default_dev as default_route_dev
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.fingerprint import fingerprint
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.gpu import (
    AMD_SMI_ARGV, NVIDIA_SMI_ARGV, RCCL_HEADERS, ROCM_SMI_ARGV, ROCM_VERSION_FILE, kfd_gpus,
    parse_amd_smi_static, parse_gpu_csv, parse_rocm_smi_json)
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.listener import start_listener, stop_listener
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.net import (
    choose_master_addr, ephemeral_range, is_loopback, listening_ports, parse_proc_net_tcp,
    processes_holding)
from ansible_collections.torchfleet.fleet.plugins.module_utils.host import image
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import container
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.pystack import NCCL_HEADER, parse_nccl_header, probe_python
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.rdma import read_devices
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.stacks import attach_facts, probe_attach
from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.host import health, kmsg

PROC_TCP = ("/proc/net/tcp", "/proc/net/tcp6")


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def hostname_facts():
    name = socket.gethostname()
    try:
        addresses = sorted({info[4][0] for info in socket.getaddrinfo(name, None)})
    except socket.gaierror:
        addresses = []
    return {"name": name, "addresses": addresses,
            "loopback": any(is_loopback(a) for a in addresses)}


def listdir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


def gpu_facts(run, outputs):
    """(gpus, nvidia-smi's facts, the GPU tool's facts): NVIDIA's GPUs from nvidia-smi; where
    it is absent, AMD's from amd-smi, rocm-smi or the KFD topology. A tool that exists and
    fails is a problem to name, not a host without GPUs. `outputs` keeps what node health reads
    too (amd-smi static's answer), so it is not asked twice."""
    out, err = run(NVIDIA_SMI_ARGV)
    if out is not None:
        facts = {"found": True, "error": None, "tool": "nvidia-smi"}
        return parse_gpu_csv(out), facts, facts
    if not missing(err):
        facts = {"found": True, "error": err, "tool": "nvidia-smi"}
        return [], facts, facts
    smi = {"found": False, "error": None}
    for argv, parse in ((AMD_SMI_ARGV, parse_amd_smi_static), (ROCM_SMI_ARGV, parse_rocm_smi_json)):
        out, err = run(argv)
        if out is None and missing(err):
            continue
        if argv is AMD_SMI_ARGV and out is not None:
            outputs[health.AMD_STATIC] = out
        tool = {"found": True, "error": err, "tool": argv[0]}
        if out is None:
            return [], smi, tool
        try:
            return parse(out), smi, tool
        except (ValueError, TypeError, AttributeError) as exc:
            return [], smi, dict(tool, error="its JSON could not be read (%s)" % exc)
    gpus = kfd_gpus(read, listdir)
    return gpus, smi, {"found": bool(gpus), "error": None, "tool": "kfd" if gpus else None}


def first_line(path):
    return (read(path).splitlines() or [""])[0].strip() or None


def shm_facts():
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return {"total_bytes": 0, "free_bytes": 0}
    return {"total_bytes": st.f_blocks * st.f_frsize, "free_bytes": st.f_bavail * st.f_frsize}


def data_facts(paths):
    facts = []
    for path in paths:
        kind = "dir" if os.path.isdir(path) else "file" if os.path.exists(path) else None
        facts.append({"path": path, "exists": kind is not None, "kind": kind})
    return facts


def master_facts(port, nics, default_dev, params):
    tables = [read(p) for p in PROC_TCP]
    inodes = [i for text in tables for i in parse_proc_net_tcp(text, port)]
    low, high = ephemeral_range() or (32768, 60999)
    listening = set().union(*(listening_ports(text) for text in tables))
    busy = listening | {port}
    if params["ephemeral_port"]:
        ephemeral = params["ephemeral_port"]
    else:
        # Upper half of the range: what an ephemeral bind most likely gets, least likely taken.
        free = [p for p in range((low + high) // 2, high + 1) if p not in busy]
        ephemeral = random.choice(free) if free else None
    facts = {
        "port": port,
        "in_use": bool(inodes),
        "holders": processes_holding(inodes),
        "ephemeral_port": ephemeral,
        "ephemeral_range": [low, high],
        "addr": choose_master_addr(nics, default_dev, params["master_addr"],
                                   params["socket_ifname"], params["address_hint"]),
        "listener": None,
    }
    if params["listen"]:
        # A port some process already listens on is not bound again: connections reach it.
        ports = [p for p in (port, facts["ephemeral_port"]) if p and p not in listening]
        facts["listener"] = start_listener(ports, params["expect_peers"], params["listen_idle_s"])
    return facts


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type="str"),
            code_dir=dict(type="path"),
            data_paths=dict(type="list", elements="str", default=defaults.default("data_paths")),
            script=dict(type="str"),
            run_dir=dict(type="path"),
            master_port=dict(type="int"),
            master_addr=dict(type="str"),
            socket_ifname=dict(type="str"),
            address_hint=dict(type="str"),
            listen=dict(type="bool", default=False),
            expect_peers=dict(type="int", default=1),
            listen_idle_s=dict(type="float", default=60, aliases=["listen_max_s"]),
            env_prefixes=dict(type="list", elements="str", default=["NCCL_", "GLOO_", "TORCH_"]),
            max_code_files=dict(type="int", default=20000),
            rdma_sysfs=dict(type="path", default=defaults.default("rdma_sysfs")),
            kernel_log=dict(type="str", default=defaults.default("kernel_log")),
            health=dict(type="str", default=defaults.default("health"),
                        choices=list(defaults.BY_NAME["health"].choices)),
            health_xid_window_s=dict(type="int", default=defaults.default("health_xid_window_s")),
            container_image=dict(type="str", default=defaults.default("container_image")),
            container_runtime=dict(type="str", default=defaults.default("container_runtime"),
                                   choices=list(defaults.BY_NAME["container_runtime"].choices)),
            container_mounts=dict(type="list", elements="str",
                                  default=defaults.default("container_mounts")),
            container_options=dict(type="list", elements="str",
                                   default=defaults.default("container_options")),
            disk_paths=dict(type="list", elements="str", default=[]),
            ephemeral_port=dict(type="int"),
            connect_addr=dict(type="str"),
            connect_ports=dict(type="list", elements="int", default=[]),
            connect_timeout_s=dict(type="float", default=3),
            connect_retry_s=dict(type="float"),
            listener_wait_s=dict(type="float", default=5),
            keep_listener=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    params = module.params
    run = bounded(module)
    if params["container_image"] and params["keep_listener"]:
        # Each host pulls (or unpacks, enroot) inside its probe, after its dial: with more
        # hosts than forks the next batch dials only once a pulling host's probe returns, so
        # the master's listener waits out a pull before it may call the port idle (else every
        # later host would fail port.blocked behind a slow registry). One batch dials at once.
        params["listen_idle_s"] += image.PULL_TIMEOUT_S + image.CREATE_TIMEOUT_S
    connector = None
    if params["connect_addr"] and params["master_port"] is None:
        # Workers dial at once: the master's listener may be up before their facts are.
        connector = start_connector(params)
    nics, nics_error = interfaces(run)
    if nics is None:
        module.fail_json(msg="cannot list network interfaces: %s" % nics_error,
                         probe_fix="install iproute2 on this host, or let the module's user "
                                   "open a netlink socket")
    default_dev = default_route_dev(run)
    master = None
    if params["master_port"] is not None:
        # First thing on the master: the workers are already dialling.
        master = master_facts(params["master_port"], nics, default_dev, params)
        if params["connect_addr"]:
            connector = start_connector(params)

    # With container_image the ranks' Python is the image's: the probe reads it there.
    image_facts = in_image = None
    if params["container_image"]:
        image_facts = image.probe(params["container_image"], params["container_runtime"], run)
        in_image = image.runner(image_facts, run,
                                container.mounts([], params["container_mounts"]),
                                params["container_options"])
    python = params["python"] or ("python3" if in_image else sys.executable)
    if image_facts and (image_facts["error"] or image_facts["pull_error"]):
        # (the ranks' Python is the image's: the host's says nothing about it)
        stack = {"error": "the image %s cannot be read here (container.%s says why)" % (
            params["container_image"], "runtime" if image_facts["error"] else "pull")}
    else:
        stack = probe_python(python, run, in_image=in_image)
    outputs = {}
    gpus, smi, tool = gpu_facts(run, outputs)
    if image_facts and image_facts["runtime"] and not image_facts["error"] and gpus:
        image_facts["gpu_error"] = image.gpu_error(image_facts["runtime"])  # container.gpu
    # RCCL (ROCm) keeps NCCL's version macros in its own header.
    nccl = stack.get("nccl_version") or next(
        (v for v in (parse_nccl_header(read(h)) for h in (NCCL_HEADER,) + RCCL_HEADERS) if v), None)
    rdma = read_devices(params["rdma_sysfs"])
    node_health = None
    if params["health"] != "off":
        files = health.collect(run, params["disk_paths"], tool.get("tool"),
                               tool.get("error") if tool.get("tool") == "nvidia-smi" else None,
                               [d["name"] for d in rdma["devices"]], outputs)
        node_health = health.facts(files, params["health_xid_window_s"], time.time(),
                                   health.process_users)
    result = dict(
        changed=False,
        health=node_health,
        hostname=hostname_facts(),
        nics=nics,
        default_dev=default_dev,
        gpus=gpus,
        nvidia_smi=smi,
        gpu_tool=tool,
        python={"executable": stack.get("executable", python), "error": stack.get("error"),
                "torch_path": stack.get("torch_path")},
        versions={
            "python": stack.get("python_version"),
            "torch": stack.get("torch_version"),
            "cuda": stack.get("torch_cuda"),
            "nccl": nccl if stack.get("torch_version") else None,
            "driver": gpus[0]["driver_version"] if gpus else None,
            "hip": stack.get("torch_hip"),
            "rocm": first_line(ROCM_VERSION_FILE),
        },
        shm=shm_facts(),
        kmsg={"source": params["kernel_log"], "error": kmsg.readable(params["kernel_log"])},
        env={k: v for k, v in sorted(os.environ.items())
             if k.startswith(tuple(params["env_prefixes"]))},
        code=fingerprint(params["code_dir"], run, params["max_code_files"])
        if params["code_dir"] else None,
        data=data_facts(params["data_paths"]),
        script={"path": params["script"], "exists": os.path.isfile(params["script"])}
        if params["script"] else None,
        run_dir={"path": params["run_dir"], "exists": os.path.exists(params["run_dir"])}
        if params["run_dir"] else None,
        rdma=rdma,
        container=image_facts,
        euid=os.geteuid(),
        # py-spy tried for real on a process of this user (the kernel's rules as read can be
        # wrong in a container).
        stacks=probe_attach(attach_facts(stack.get("executable", python)),
                            stack.get("executable", python), run),
    )
    if master is not None:
        result["master"] = master
    if connector is not None:
        route, route_error = route_to(params["connect_addr"], run, nics)
        result["connect"] = dict(route=route, route_error=route_error, ports=connector.results())
        if master is not None and master["listener"] and not params["keep_listener"]:
            result["connect"]["listener"] = stop_listener(master["listener"]["pid"],
                                                          params["listener_wait_s"])
            # When the port test stopped listening: a refusal that began later is no verdict.
            master["listener"]["ended_at"] = round(time.time(), 3)
    module.exit_json(**result)


def start_connector(params):
    ports = params["connect_ports"] + ([params["ephemeral_port"]] if params["ephemeral_port"] else [])
    return Connector(params["connect_addr"], ports, params["connect_timeout_s"],
                     params["connect_retry_s"])


if __name__ == "__main__":
    main()
