"""What the controller decides before it touches a host: the run's id, the plan of the
preflight's port test, and the values asked for that are wrong whatever the hosts hold (the
input.* checks). Runs in ansible-playbook's own process (plugins/action/run_plan.py)."""
from __future__ import annotations

import math
import random

from ansible_collections.torchfleet.fleet.plugins.module_utils.host.net import master_addr_up_front
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.rdma import HCA_SPEC, is_gid_index
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import container
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.restart import MAX_RESTARTS, RESTART_ON
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import RUN_ID, new_run_id
from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults

# The user's values as given (raw): a wrong type is an input.* check naming the variable,
# not a conversion that hides it (a string data_paths would become a list of one).
ARGUMENT_SPEC = dict(
    nnodes=dict(type="raw", required=True),
    forks=dict(type="int", required=True),
    run_id=dict(type="raw"),
    master_port=dict(type="raw", default=defaults.default("master_port")),
    master_addr=dict(type="str", default=defaults.default("master_addr")),
    socket_ifname=dict(type="str", default=defaults.default("socket_ifname")),
    master_host=dict(type="str", default=""),
    master_hosts=dict(type="dict", default={}),
    nproc_per_node=dict(type="raw", default=defaults.default("nproc_per_node")),
    data_paths=dict(type="raw", default=defaults.default("data_paths")),
    collective_isolate=dict(type="bool", default=defaults.default("collective_isolate")),
    collective_isolate_schedule=dict(type="raw", default=defaults.default("collective_isolate_schedule")),
    nccl_ib_hca=dict(type="raw", default=defaults.default("nccl_ib_hca")),
    nccl_ib_gid_index=dict(type="raw", default=defaults.default("nccl_ib_gid_index")),
    spares=dict(type="raw", default=defaults.default("spares")),
    max_restarts=dict(type="raw", default=defaults.default("max_restarts")),
    restart_on=dict(type="raw", default=defaults.default("restart_on")),
    inventory_size=dict(type="int", default=0),
    health=dict(type="raw", default=defaults.default("health")),
    **{name: dict(type="raw", default=defaults.default(name)) for name in (
        "container_image", "container_runtime", "container_mounts", "container_options",
        "health_slow_pct", "health_floors", "health_ecc_corrected_max", "health_xid_window_s",
        "health_disk_min_gb", "health_clock_max_s")}
)
HEALTH_LEVELS = defaults.BY_NAME["health"].choices
# The health thresholds and what each must be: a number >= 0 (whole where it counts things).
HEALTH_NUMBERS = (("health_slow_pct", float), ("health_ecc_corrected_max", int),
                  ("health_xid_window_s", int), ("health_disk_min_gb", float),
                  ("health_clock_max_s", float))

SCHEDULES = ("ring", "full")
# High in Linux's default ephemeral range, where few processes listen.
EPHEMERAL_PORTS = (49152, 60999)


def _int(value):
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def bad_nproc_per_node(value):
    value = str(value).strip()
    return value != "auto" and not (value.isdigit() and int(value) >= 1)


def _error(cid, detail, hint):
    return {"id": cid, "detail": detail, "hint": hint}


def input_errors(params):
    """One record (id, detail, hint) per value that no host needs to see to refuse."""
    errors = []
    port = _int(params["master_port"])
    if port is None or not 1 <= port <= 65535:
        errors.append(_error("input.master_port",
                             "master_port=%s is not a TCP port" % params["master_port"],
                             "set -e master_port=N with 1024 <= N <= 65535 (29500 is "
                             "torchrun's default)"))
    run_id = params["run_id"]
    if run_id is not None and not RUN_ID.match(str(run_id)):
        errors.append(_error("input.run_id", "run_id=%s cannot name a directory" % run_id,
                             "use letters, digits, '.', '_' and '-' only (at most 64), or "
                             "leave run_id unset"))
    if bad_nproc_per_node(params["nproc_per_node"]):
        errors.append(_error("input.nproc_per_node",
                             "nproc_per_node=%s is not a positive number"
                             % params["nproc_per_node"],
                             "set -e nproc_per_node=N (N >= 1, at most the GPUs per host) "
                             "or auto"))
    paths = params["data_paths"]
    if isinstance(paths, (str, bytes, dict)) or not isinstance(paths, (list, tuple)):
        errors.append(_error("input.data_paths",
                             "data_paths=%s is not a list of paths" % (paths,),
                             "give a YAML list: -e '{\"data_paths\": [\"/data/a\", "
                             "\"/data/b\"]}' (CLI: -e data_paths=[/data/a,/data/b])"))
    else:
        relative = [str(p) for p in paths if not str(p).startswith(("/", "~"))]
        if relative:
            errors.append(_error("input.data_paths",
                                 "data_paths holds relative path(s) %s: each host would "
                                 "resolve them against a different directory"
                                 % ", ".join(relative),
                                 "give absolute paths (/data/shards or ~/data/shards)"))
    nnodes = _int(params["nnodes"])
    if params["collective_isolate"] and (nnodes or 0) < 2:
        errors.append(_error("input.collective_isolate",
                             "collective_isolate pairs hosts, and nnodes=%s leaves nothing to "
                             "pair" % params["nnodes"],
                             "run it with -e nnodes=N, N >= 2 (3 or more to tell a slow host "
                             "from a slow link)"))
    if params["collective_isolate_schedule"] not in SCHEDULES:
        errors.append(_error("input.collective_isolate_schedule",
                             "collective_isolate_schedule=%s is not a schedule"
                             % params["collective_isolate_schedule"],
                             "set -e collective_isolate_schedule=ring (a few rounds, the "
                             "default) or full (every pair)"))
    hca = params["nccl_ib_hca"]
    if hca not in (None, "") and not (isinstance(hca, str) and HCA_SPEC.match(hca.strip())):
        errors.append(_error("input.nccl_ib_hca",
                             "nccl_ib_hca=%s is not a list of HCA names" % (hca,),
                             "give NCCL_IB_HCA's form: names with an optional :port, comma "
                             "separated, optionally behind ^ (exclude) or = (exact), e.g. "
                             "mlx5_0,mlx5_1:1 (ls /sys/class/infiniband lists them)"))
    gid = params["nccl_ib_gid_index"]
    if gid not in (None, "") and not is_gid_index(gid):
        errors.append(_error("input.nccl_ib_gid_index",
                             "nccl_ib_gid_index=%s is not a GID table index" % (gid,),
                             "give an integer from 0 to 255 (3 is common for RoCE v2 IPv4; "
                             "preflight's rdma.gid names the right one), or leave it unset"))
    errors.extend(spares_errors(params))
    errors.extend(restart_errors(params))
    errors.extend(health_errors(params))
    errors.extend(container_errors(params))
    return errors


def container_errors(params):
    """input.container: the container settings (run/container.py's validate), before any host
    is touched; the hosts' runtime and image are preflight's container.* checks."""
    why = container.validate(params.get("container_image"), params.get("container_runtime"),
                             params.get("container_mounts"), params.get("container_options"))
    if why is None:
        return []
    detail, _sep, fix = why.partition("; ")
    return [_error("input.container", detail, fix or "fix it or leave container_image unset")]


def _number(value, kind):
    if isinstance(value, bool):
        return None
    try:
        number = kind(str(value).strip()) if kind is int else float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number >= 0 else None


def health_errors(params):
    """input.health: the level and every threshold, before any host is touched."""
    errors = []
    level = params.get("health", "basic")
    if level not in HEALTH_LEVELS:
        errors.append(_error("input.health", "health=%s is not a level" % (level,),
                             "set -e health=basic (the default), full (also measures every "
                             "GPU's speed) or off"))
    for name, kind in HEALTH_NUMBERS:
        value = params.get(name, defaults.default(name))
        if _number(value, kind) is None:
            errors.append(_error("input.health", "%s=%s is not a %s >= 0" % (
                name, value, "whole number" if kind is int else "number"),
                "set -e %s=N (default %s)" % (name, defaults.default(name))))
    floors = params.get("health_floors") or {}
    good = isinstance(floors, dict) and all(
        isinstance(v, dict) and set(v) <= {"tflops", "gbps"}
        and all(_number(x, float) is not None for x in v.values()) for v in floors.values())
    if not good:
        errors.append(_error("input.health",
                             "health_floors=%s is not a mapping of GPU model to "
                             "{tflops, gbps} numbers" % (floors,),
                             'set -e \'{"health_floors": {"H100": {"tflops": 600, "gbps": '
                             '2000}}}\' or leave it unset'))
    return errors


def restart_errors(params):
    raw, errors = params.get("max_restarts", 0), []
    restarts = _int(raw)
    if isinstance(raw, bool) or restarts is None or not 0 <= restarts <= MAX_RESTARTS:
        errors.append(_error("input.max_restarts",
                             "max_restarts=%s is not a whole number from 0 to %d"
                             % (raw, MAX_RESTARTS),
                             "set -e max_restarts=R with 0 <= R <= %d (0, the default, never "
                             "restarts; add spares so a restart has a host to take)"
                             % MAX_RESTARTS))
    if params.get("restart_on", "host") not in RESTART_ON:
        errors.append(_error("input.restart_on",
                             "restart_on=%s is neither host nor any" % (params["restart_on"],),
                             "set -e restart_on=host (restart a failure a host explains, the "
                             "default) or any (every failure)"))
    return errors


def spares_errors(params):
    raw = params.get("spares", 0)
    spares, nnodes, size = _int(raw), _int(params["nnodes"]), params.get("inventory_size", 0)
    if isinstance(raw, bool) or spares is None or spares < 0:
        return [_error("input.spares", "spares=%s is not a whole number >= 0" % (raw,),
                       "set -e spares=K with K >= 0 (0, the default, uses no spare hosts)")]
    if spares and nnodes is not None and size and nnodes + spares > size:
        return [_error("input.spares",
                       "spares=%d with nnodes=%d needs %d hosts, and group `nodes` has %d"
                       % (spares, nnodes, nnodes + spares, size),
                       "set -e spares=%d or less, or add hosts to group `nodes`"
                       % max(size - nnodes, 0))]
    return []


def candidates(params):
    """(hosts the preflight checks, spares among them): nnodes + spares, 0 when refused."""
    nnodes = max(_int(params["nnodes"]) or 0, 0)
    spares = 0 if spares_errors(params) else _int(params.get("spares", 0)) or 0
    return nnodes + spares, spares


def port_plan(params, hosts):
    """One round trip per host when the master's address is known up front: each host's probe
    connects to the master's listener. With every host in one fork batch the master waits for
    the others' connections inside its own probe; with several batches the listener outlives
    the master's probe and a last task removes it. Otherwise the master decides its address
    in its probe and a second round connects to it. `hosts`: how many the preflight checks.
    `addrs`: the same answer for each host that may be the master instead of the first (with
    spares, the first one preflight reaches), by name."""
    def up_front(host):
        return master_addr_up_front(params["master_addr"], params["socket_ifname"], host) or ""
    addr = up_front(params["master_host"])
    return {"inline": bool(addr), "batched": hosts > params["forks"], "addr": addr,
            "ephemeral_port": random.randint(*EPHEMERAL_PORTS),
            "addrs": {name: up_front(str(host or "")) for name, host in
                      (params.get("master_hosts") or {}).items()}}


def decide(params):
    run_id = params["run_id"]
    hosts, spares = candidates(params)
    return {"run_id": str(run_id) if run_id is not None else new_run_id(),
            "port_plan": port_plan(params, hosts), "input_errors": input_errors(params),
            "candidates": hosts, "spares": spares}
