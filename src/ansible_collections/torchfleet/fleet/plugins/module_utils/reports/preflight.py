"""Preflight verdicts: every check of every host, decided once on the controller.

Input is what node_probe and port_probe returned per host; output is a flat list of check
records {id, host, ok, severity, detail, hint}. Comparisons across hosts take the most common
value as the reference (ties go to the master) and fail only the outliers, so the report names
the odd host out instead of saying "mismatch".
"""
from __future__ import annotations

from collections import Counter

from ansible_collections.torchfleet.fleet.plugins.module_utils.host import cuda_driver, kmsg, perf, rdma
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import fabric, health_checks, ledger, memory, spares
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.net import is_loopback as is_loopback_addr
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import container
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.plan import bad_nproc_per_node
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.runstate import action
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.records import (  # noqa: F401 (check: for importers)
    CONTROLLER, ERROR, WARNING, check, failed, fmt_hosts, outliers)
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.report import verdict, write_report
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.table import render
from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults

VERSION_NAMES = ("python", "torch", "cuda", "hip", "nccl", "driver", "rocm")
VERSION_FIX = {
    "python": "use the same Python version for `python` on every host",
    "torch": "install torch {want} on {host} (pip install torch=={want})",
    "cuda": "install the torch build for CUDA {want} on {host}",
    "hip": "install the torch build for ROCm (HIP {want}) on {host}",
    "nccl": "install NCCL {want} on {host} (the nvidia-nccl wheel that matches torch; RCCL on "
            "ROCm)",
    "driver": "install GPU driver {want} on {host}",
    "rocm": "install ROCm {want} on {host}",
}


def world_checks(nnodes, inventory_size, hosts):
    if nnodes < 1:
        return [check("world.size", CONTROLLER, False,
                      "nnodes=%d: at least one node is needed" % nnodes,
                      "set -e nnodes=N with 1 <= N <= %d" % inventory_size)]
    if nnodes > inventory_size:
        return [check("world.size", CONTROLLER, False,
                      "nnodes=%d but group `nodes` has %d host(s)" % (nnodes, inventory_size),
                      "add hosts to group `nodes` in the inventory or set -e nnodes=%d"
                      % inventory_size)]
    return [check("world.size", CONTROLLER, True,
                  "%d node(s): %s" % (len(hosts), fmt_hosts(hosts)))]


def compare_versions(probes, master):
    records = []
    for name in VERSION_NAMES:
        values = {h: p["versions"].get(name) or "none" for h, p in probes.items()}
        if all(v == "none" for v in values.values()):
            continue
        ref, odd = outliers(values, master)
        same = [h for h in values if h not in odd]
        for host, value in values.items():
            if host in odd:
                records.append(check(
                    "version." + name, host, False,
                    "%s %s here, %s on %s" % (name, value, ref, fmt_hosts(same)),
                    VERSION_FIX[name].format(want=ref, host=host)))
            else:
                records.append(check("version." + name, host, True, "%s %s" % (name, value)))
    return records


def compare_env(probes, master):
    records = []
    names = sorted({k for p in probes.values() for k in p["env"]})
    bad = {}
    for name in names:
        values = {h: p["env"].get(name, "<unset>") for h, p in probes.items()}
        ref, odd = outliers(values, master)
        for host, value in odd.items():
            bad.setdefault(host, []).append("%s=%s (elsewhere %s)" % (name, value, ref))
    for host in probes:
        if host in bad:
            records.append(check("env.nccl", host, False, "; ".join(bad[host]),
                                 "set the same NCCL_/GLOO_/TORCH_ variables on every host, or "
                                 "pass them once with -e 'env={...}'", WARNING))
        else:
            records.append(check("env.nccl", host, True, "%d variable(s) agree" % len(names)))
    return records


def compare_code(probes, master, code_dir):
    records = []
    present = {h: p["code"] for h, p in probes.items() if p.get("code") and p["code"]["exists"]}
    for host in probes:
        if host not in present:
            records.append(check("code.sync", host, False, "code_dir %s does not exist" % code_dir,
                                 "copy the code to %s on %s (rsync/git clone) or fix code_dir"
                                 % (code_dir, host)))
    if not present:
        return records
    keys = {h: (c["git_commit"], tuple(sorted(c["files"].items()))) for h, c in present.items()}
    ref_key, odd = outliers(keys, master if master in keys else next(iter(keys)))
    ref_host = next(h for h, k in keys.items() if k == ref_key)
    ref = present[ref_host]
    for host, code in present.items():
        if host not in odd:
            records.append(check("code.sync", host, True, "%d file(s)%s" % (
                len(code["files"]), ", commit " + code["git_commit"][:12] if code["git_commit"]
                else "")))
            continue
        diffs = []
        if code["git_commit"] != ref["git_commit"]:
            diffs.append("commit %s here, %s on %s" % ((code["git_commit"] or "none")[:12],
                                                       (ref["git_commit"] or "none")[:12], ref_host))
        mine, theirs = code["files"], ref["files"]
        changed = sorted(f for f in mine.keys() & theirs.keys() if mine[f] != theirs[f])
        extra = sorted(mine.keys() - theirs.keys())
        missing = sorted(theirs.keys() - mine.keys())
        for label, files in (("changed", changed), ("only here", extra), ("missing here", missing)):
            if files:
                diffs.append("%s: %s" % (label, fmt_hosts(files, 6)))
        records.append(check("code.sync", host, False,
                             "code_dir differs from %s: %s" % (ref_host, "; ".join(diffs)),
                             "sync %s from %s to %s (git pull / rsync -a --delete)"
                             % (code_dir, ref_host, host)))
    return records


# container.gpu's fix per runtime (NVIDIA Container Toolkit's install guide).
GPU_FIX = {
    "podman": "generate the CDI spec: sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml",
    "docker": "install the NVIDIA Container Toolkit (nvidia-container-toolkit) and run sudo "
              "nvidia-ctk runtime configure --runtime=docker, then restart docker",
    "enroot": "install libnvidia-container-tools and enroot's hooks (enroot+caps package's "
              "98-nvidia.sh)",
}


def container_checks(probes, master, backend="gloo"):
    """container.runtime, container.pull and container.digest from each probe's `container`
    (host/image.py; absent without container_image). The digest compares hosts as code.sync
    does: the outliers against the id most hosts share (ties: the master's)."""
    records, ids = [], {}
    odd_runtime = runtime_outliers({h: p["container"] for h, p in probes.items()
                                    if p.get("container")}, master)
    for host, probe in probes.items():
        facts = probe.get("container")
        if not facts:
            continue
        runtime = facts.get("runtime") or "a runtime"
        if host in odd_runtime:
            records.append(check("container.runtime", host, False, *odd_runtime[host]))
            continue
        if facts.get("error"):
            records.append(check("container.runtime", host, False,
                                 "%s: %s" % (runtime, facts["error"]),
                                 "install %s on %s (and start its daemon, or add the run's user "
                                 "to its group), or set -e container_runtime=..."
                                 % (runtime, host)))
            continue
        records.append(check("container.runtime", host, True, "%s works" % runtime))
        if backend == "nccl" and "gpu_error" in facts:  # (probed on a host with GPUs)
            why = facts["gpu_error"]
            records.append(check("container.gpu", host, why is None,
                                 "%s: %s" % (runtime, why) if why else
                                 "%s can give the container the GPUs" % runtime,
                                 GPU_FIX.get(runtime, "install the NVIDIA Container Toolkit on "
                                             "%s" % host)))
        loads = container.archive(facts.get("runtime"), facts["image"])  # (an archive's)
        if facts.get("pull_error"):
            records.append(check("container.pull", host, False,
                                 "%s: %s" % (facts["image"], facts["pull_error"]),
                                 "copy the archive to %s on %s (`%s save -o FILE IMAGE` where "
                                 "the image is), or fix the file" % (facts["image"], host, runtime)
                                 if loads else
                                 "make the registry reachable and logged in on %s (%s login), or "
                                 "load the image there (%s load)" % (host, runtime, runtime)))
            continue
        records.append(check("container.pull", host, True, "%s %s" % (
            facts["image"], ("loaded as %s" % facts.get("local") if loads else "pulled")
            if facts.get("pulled") else "present")))
        records.extend(driver_check(host, facts, probe.get("versions") or {}, backend))
        if facts.get("digest"):
            ids[host] = facts["digest"]
    if not ids:
        return records
    ref, odd = outliers(ids, master if master in ids else next(iter(ids)))
    same = [h for h in ids if h not in odd]
    for host, digest in ids.items():
        if host in odd:
            records.append(check("container.digest", host, False,
                                 "image id %s here, %s on %s" % (digest[:19], ref[:19],
                                                                 fmt_hosts(same)),
                                 "pull the same image on %s (by digest: image@sha256:...) or "
                                 "remove its copy" % host))
        else:
            records.append(check("container.digest", host, True, "image id %s" % digest[:19]))
    return records


def runtime_outliers(facts, master):
    """{host: (detail, fix)} for the hosts whose runtime is not the run's: with auto each host
    takes the first runtime installed there, and one run needs one runtime on every host (the
    image's storage, its id, the stop paths are the runtime's). The run's is the first that
    every working host has installed, else the one most hosts took (ties: the master's)."""
    took = {h: f["runtime"] for h, f in facts.items() if f.get("runtime") and not f.get("error")}
    if len(set(took.values())) < 2:
        return {}
    everywhere = [r for r in container.RUNTIMES
                  if all(r in (facts[h].get("installed") or (took[h],)) for h in took)]
    if everywhere:
        target = everywhere[0]
        fix = "set -e container_runtime=%s (installed on every host)" % target
    else:
        target, _odd = outliers(took, master if master in took else next(iter(took)))
        fix = None
    same = [h for h in took if took[h] == target]
    return {h: ("auto took %s here and %s on %s: one run runs one runtime on every host"
                % (r, target, fmt_hosts(same) if same else "no host"),
                fix or "install %s on %s, or set -e container_runtime=..." % (target, h))
            for h, r in took.items() if r != target}


def driver_check(host, facts, versions, backend):
    """container.driver: the host's NVIDIA driver (nvidia-smi's, as version.driver) against the
    image's CUDA (its env's CUDA_VERSION, else torch.version.cuda read in the image); nothing
    on a host without NVIDIA GPUs or where neither is known. Without nccl the ranks may not
    need CUDA at all: a warning then."""
    cuda = facts.get("cuda") or {}
    judged = cuda_driver.verdict(cuda.get("version") or versions.get("cuda"),
                                 versions.get("driver"), bool(cuda.get("compat")))
    if judged is None:
        return []
    level, detail, fix = judged
    severity = ERROR if level == "error" and backend == "nccl" else WARNING
    return [check("container.driver", host, level == "ok", detail, fix, severity)]


def duplicate_checks(probes, hosts):
    """host.duplicate: two inventory names for one machine (same hostname and addresses),
    which would start two torchrun agents there and double its share of the world."""
    seen, records = {}, []
    for host in hosts:
        if host not in probes:
            continue
        p = probes[host]
        key = (p["hostname"]["name"], tuple(sorted(a for n in p["nics"] for a in n["ipv4"]
                                                   if not is_loopback_addr(a))))
        first = seen.setdefault(key, host)
        records.append(check("host.duplicate", host, first == host,
                             "the same machine as %s (hostname %s, addresses %s)"
                             % (first, key[0], ", ".join(key[1])) if first != host else
                             "a machine of its own",
                             "remove %s from group `nodes`, or give it its real address" % host))
    return records


def nic_checks(host, probe, connect, ifname, master_addr, is_master):
    """nic.missing / nic.address / nic.route for one host; returns (records, nic, address)."""
    nics = {n["name"]: n for n in probe["nics"]}
    route = (connect or {}).get("route")
    chosen = ifname or (route or {}).get("nic")
    if chosen is None and master_addr is None:
        return [check("nic.route", host, True, "not tested: the master was not reached")], None, None
    records = []
    if chosen is None:  # no interface named, and none found that routes to the master
        detail = "no interface routes to master %s (%s)" % (
            master_addr, (connect or {}).get("route_error") or "no route")
        return [check("nic.route", host, False, detail,
                      "add a route to %s, or set -e socket_ifname to the interface that "
                      "reaches it" % master_addr)], None, None
    if ifname and ifname not in nics:
        records.append(check("nic.missing", host, False,
                             "no interface %s; this host has %s" % (ifname, ", ".join(sorted(nics))),
                             "set -e socket_ifname to an interface every host has, or leave it "
                             "unset to auto-detect the one that routes to the master"))
        return records, None, None
    records.append(check("nic.missing", host, True, "uses %s" % (chosen or "?")))
    nic = nics.get(chosen)
    if nic is None or not nic["ipv4"]:
        records.append(check("nic.address", host, False,
                             "%s has no IPv4 address" % (chosen or "no interface"),
                             "give %s an IPv4 address or pick another socket_ifname" % chosen))
        return records, chosen, None
    address = master_addr if is_master and master_addr in nic["ipv4"] else nic["ipv4"][0]
    records.append(check("nic.address", host, True, "%s has %s" % (chosen, address)))
    if route is None and master_addr is None:
        records.append(check("nic.route", host, True, "not tested: the master was not reached"))
    elif route is None:
        detail = "no route to master %s (%s)" % (master_addr, (connect or {}).get("route_error"))
        records.append(check("nic.route", host, False, detail,
                             "add a route to %s via %s" % (master_addr, chosen)))
    elif is_master and master_addr not in nic["ipv4"]:
        records.append(check("nic.route", host, False,
                             "master_addr %s is not an address of %s on the master"
                             % (master_addr, chosen),
                             "set -e master_addr to the master's address on %s" % chosen))
    elif route["nic"] != chosen:
        records.append(check("nic.route", host, False,
                             "traffic to master %s leaves by %s, not %s"
                             % (master_addr, route["nic"], chosen),
                             "set -e socket_ifname=%s, or route %s via %s"
                             % (route["nic"], master_addr, chosen)))
    else:
        records.append(check("nic.route", host, True,
                             "reaches master %s via %s" % (master_addr, chosen)))
    return records, chosen, address


PORT_FIX = {
    "port.blocked": "allow TCP {port} from the workers on the master's firewall "
                    "(nft add rule inet filter input tcp dport {port} accept / ufw allow {port}/tcp)",
    "port.ephemeral": "allow the master's ephemeral ports {low}-{high} from the workers: c10d "
                      "and NCCL/gloo listen on random ports",
}


# Refused: the master answered with a reset. Either nothing listened there when this host
# dialled (the preflight listener had ended, or master_addr is not the master's), or a firewall
# rejects rather than drops.
REFUSED_FIX = ("refused means nothing listened on {port} when this host connected, or a "
               "firewall rejects it: run preflight again; if it repeats, check that master_addr "
               "is the master's address, then {fix}")


# Dialled late: the one-round test's listener had ended before this host first dialled (a host
# too slow to start its probe: CPU capped, overloaded, swapping). The port was never tested, so
# no firewall is named; a warning, for a run may still go on it.
LATE_FIX = ("run preflight again; if this host is late again, look at what slows it (its load, "
            "its CPU quota: cpu.perf with -e health=full)")


def dialled_late(result, listener, clock_max_s):
    """Seconds by which this host's first dial came after the master's listener had ended, or
    None (on time, or either time unknown). The two stamps come from two hosts' clocks: only
    a gap larger than the fleet's clock tolerance counts."""
    ended = listener.get("ended_at") if isinstance(listener, dict) else None
    dialled = result.get("dialled_at")
    try:
        margin = float(clock_max_s)
    except (TypeError, ValueError):
        return None
    if not (_finite(ended) and _finite(dialled) and _finite(margin)):
        return None
    late = dialled - ended
    return late if late > margin else None


def port_checks(host, connect, master_addr, master, master_port, clock_max_s=None):
    """port.blocked and port.ephemeral of one host from its connection results (`connect`)
    and the master's facts; `clock_max_s`: health_clock_max_s (see dialled_late)."""
    records = []
    if not master:
        return records  # the master was not probed: host.unreachable / python.torch say why
    by_port = {r["port"]: r for r in (connect or {}).get("ports", [])}
    wanted = (("port.blocked", master_port), ("port.ephemeral", master.get("ephemeral_port")))
    for cid, port in wanted:
        if cid == "port.blocked" and master.get("in_use"):
            records.append(check(cid, host, True, "not tested: port %s is held by another "
                                 "process (see port.in_use)" % port))
            continue
        result = by_port.get(port)
        if port is None or result is None:
            continue
        unbound = [p for p in (master.get("listener") or {}).get("ports", [])
                   if p["port"] == port and not p["bound"]]
        if unbound and not result["ok"]:
            # The master could not listen there (an outgoing connection holds the port, say):
            # nothing was tested, which is not the firewall's fault.
            records.append(check(cid, host, True, "not tested: the master could not listen on "
                                 "%s (%s); run preflight again" % (port, unbound[0]["error"])))
            continue
        if result["ok"]:
            records.append(check(cid, host, True, "TCP %s:%s open (%.2f s)"
                                 % (master_addr, port, result["elapsed_s"])))
            continue
        # Only a refusal can come from a listener that had ended; a timeout is a firewall.
        late = (dialled_late(result, master.get("listener"), clock_max_s)
                if result["error"] == "refused" else None)
        if late is not None:
            records.append(check(cid, host, False, "not tested: %s first dialled %s:%s %.1f s "
                                 "after the master's listener had ended" % (host, master_addr,
                                                                            port, late),
                                 LATE_FIX, severity=WARNING))
            continue
        dropped = result["error"] == "timed out"
        why = ("dropped: no answer in %.0f s, a firewall?" % result["elapsed_s"] if dropped
               else result["error"])
        low, high = master.get("ephemeral_range", [32768, 60999])
        fix = PORT_FIX[cid].format(port=port, low=low, high=high)
        if not dropped:
            fix = REFUSED_FIX.format(port=port, fix=fix)
        records.append(check(cid, host, False, "cannot open TCP %s:%s (%s)"
                             % (master_addr, port, why), fix))
    return records


def _finite(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < 1e10


def _clock(connect):
    """The port test's best clock reading of one host (the smallest uncertainty), or None;
    readings that are not two finite numbers are left out (a host's answer is not trusted)."""
    ports = (connect or {}).get("ports") if isinstance(connect, dict) else None
    readings = [p["clock"] for p in ports or [] if isinstance(p, dict)
                and isinstance(p.get("clock"), dict)
                and _finite(p["clock"].get("offset_s")) and _finite(p["clock"].get("uncertainty_s"))]
    return min(readings, key=lambda c: c["uncertainty_s"]) if readings else None


def health_records(reachable, connects, master, settings, network=None):
    """Every health check (health.py, perf.py) of the reachable hosts, unless health=off.
    `network`: the preset the run will use; with ethernet NCCL leaves RDMA alone (memlock
    does not matter), otherwise it uses the RDMA devices it finds."""
    level = settings.get("health", "basic")
    if level == "off":
        return []

    def limit(name, kind=float):
        return kind(settings.get(name, defaults.default(name)))
    limits = health_checks.limits(settings, rdma_in_use=network != "ethernet")
    records = []
    for host, probe in reachable.items():
        if probe.get("health"):
            try:
                records.extend(health_checks.checks(host, probe["health"], limits))
            except (TypeError, ValueError, KeyError, AttributeError) as exc:
                # node_probe's own facts never do this; a host that answers garbage is said.
                records.append(check("gpu.smi", host, False, "the host's health facts could "
                                     "not be read (%s): not checked" % str(exc)[:120],
                                     "run `torchfleet health --from DIR` on its saved outputs",
                                     WARNING))
    offsets = {h: _clock(p.get("connect") or connects.get(h)) for h, p in reachable.items()}
    records.extend(health_checks.clock_checks(offsets, master, limit("health_clock_max_s")))
    if level == "full":
        results = {}
        for host, probe in reachable.items():
            got = (settings.get("perf") or {}).get(host)
            got = got if isinstance(got, dict) else {}
            if got.get("skipped") or not probe["versions"].get("torch"):
                continue  # no torch there: python.torch says so
            devices = got.get("devices") if isinstance(got.get("devices"), list) else []
            results[host] = {"devices": [d for d in map(perf.checked, devices) if d],
                             "gpus": len(probe["gpus"]),
                             "error": str(got.get("error") or (got.get("msg") if got.get("failed")
                                                               else "") or "") or None}
        records.extend(perf.compare(results, limit("health_slow_pct"),
                                    settings.get("health_floors") or {}))
    return records


def probe_failed(host, probe):
    """host.probe: the host's probe failed; the fix is the one its error names (node_probe's
    probe_fix), else the interpreter's where none could run it."""
    said = " ".join(str(probe.get(k) or "") for k in ("msg", "module_stderr", "module_stdout"))
    no_python = "python" in said.lower() and ("not found" in said or "No such file" in said)
    fix = probe.get("probe_fix") or (
        "install python3 on %s or set ansible_python_interpreter" % host if no_python else
        "run `ansible-playbook preflight.yml -v --limit %s` and mend what the probe's error "
        "names" % host)
    return check("host.probe", host, False,
                 "the probe could not run: %s" % str(probe.get("msg") or "")[:300], fix)


def evaluate(hosts, nnodes, inventory_size, probes, connects, settings, master=None):
    """All check records plus the per-node plan: (checks, nodes, resolved settings). `master`:
    the host the ports were tested against, when not the first (spares.choose)."""
    checks = world_checks(nnodes, inventory_size, hosts)
    checks += [check(e["id"], CONTROLLER, False, e["detail"], e["hint"])
               for e in settings.get("input_errors", [])]
    if not hosts:
        return checks, [], {}
    master = master if master in hosts else hosts[0]
    reachable = {}
    for host in hosts:
        probe = probes.get(host) or {}
        if probe.get("unreachable"):
            checks.append(check("host.unreachable", host, False, probe.get("msg", "").strip()[:300],
                                "make `ssh %s` work from the controller (host up, ansible_host, "
                                "ansible_user, key) or remove it from group `nodes`" % host))
            continue
        checks.append(check("host.unreachable", host, True, "reached"))
        if probe.get("failed"):
            checks.append(probe_failed(host, probe))
            continue
        reachable[host] = probe
    if not reachable:
        return checks, [], {}
    # With the master unreachable the workers are still checked; only what needs the master
    # (its port, the listener, the route to its address when none was given) is left out.
    minfo = reachable.get(master, {}).get("master", {})
    if minfo and settings.get("listener"):  # the two-round test started it in a task of its own
        minfo = dict(minfo, listener=settings["listener"])
    master_addr = minfo.get("addr") or settings.get("master_addr") or None

    gpu_hosts = [h for h, p in reachable.items() if p["gpus"]]
    backend = settings["backend"]
    if backend == "auto":
        backend = "nccl" if gpu_hosts and len(gpu_hosts) == len(reachable) else "gloo"
    nproc = settings["nproc_per_node"]
    if nproc == "auto":
        counts = {len(p["gpus"]) for p in reachable.values()}
        nproc = min(counts) if backend == "nccl" else 1
        if backend == "nccl" and len(counts) > 1:
            checks.append(check("world.size", CONTROLLER, False,
                                "GPU counts differ across hosts (%s); nproc_per_node=auto would "
                                "start a smaller world on some" % sorted(counts),
                                "set -e nproc_per_node=%d or fix the hosts with fewer GPUs"
                                % min(counts)))
    nproc = int(nproc)

    nodes = []
    for rank, host in enumerate(hosts):
        probe = reachable.get(host)
        if probe is None:
            continue
        is_master = host == master
        # One-round preflight: the probe itself connected; otherwise port_probe's second round.
        connect = probe.get("connect") or connects.get(host) or {}
        stack_error = probe["python"].get("error")
        if probe["versions"].get("torch"):
            checks.append(check("python.torch", host, True,
                                "torch %s in %s" % (probe["versions"]["torch"],
                                                    probe["python"]["executable"])))
        else:
            checks.append(check("python.torch", host, False,
                                stack_error or "%s has no torch" % probe["python"]["executable"],
                                # (with container_image the probe read the image's Python)
                                "use an image with torch, or set `python` to the image's "
                                "interpreter that has it" if probe.get("container") else
                                "install torch for that interpreter, or set `python` to the one "
                                "that has it"))
        if backend == "gloo":
            checks.append(check("gpu.count", host, True, "skipped: backend gloo runs on CPU"))
        else:
            have = len(probe["gpus"])
            tool = probe.get("gpu_tool") or dict(probe["nvidia_smi"], tool="nvidia-smi")
            why = (" (no nvidia-smi, amd-smi or rocm-smi)" if not tool["found"] else
                   " (%s failed: %s)" % (tool["tool"], tool["error"]) if tool["error"] else
                   " (%s)" % tool["tool"])
            checks.append(check("gpu.count", host, have >= nproc,
                                "%d GPU(s)%s for nproc_per_node=%d" % (have, why, nproc),
                                "set -e nproc_per_node=%d, or check `%s` on %s"
                                % (have, tool["tool"] or "nvidia-smi", host) if have else
                                "install the GPU driver (NVIDIA, or AMD's amdgpu with ROCm) on %s "
                                "or use -e backend=gloo" % host))
        records, nic, address = nic_checks(host, probe, connect, settings["socket_ifname"],
                                           master_addr, is_master)
        checks.extend(records)
        if is_master and minfo:
            holders = minfo.get("holders", [])
            who = ", ".join("pid %d (%s)" % (h["pid"], " ".join(h["cmdline"].split())[:80]) for h in holders)
            checks.append(check("port.in_use", host, not minfo.get("in_use"),
                                "port %d is free" % settings["master_port"]
                                if not minfo.get("in_use") else
                                "port %d is already bound by %s" % (
                                    settings["master_port"], who or "a process this user cannot see"),
                                "stop it (ansible-playbook stop.yml if it is an earlier run, or "
                                "kill %s) or choose another -e master_port"
                                % (holders[0]["pid"] if holders else "it")))
            port = settings["master_port"]
            if port < 1024 and probe.get("euid", 0) != 0:
                checks.append(check("port.privileged", host, False,
                                    "master_port=%d is below 1024 and the run's user is not root"
                                    % port, "choose -e master_port above 1023 (29500 is "
                                            "torchrun's default)"))
        checks.extend(port_checks(host, connect, master_addr, minfo, settings["master_port"],
                                  settings.get("health_clock_max_s",
                                               defaults.default("health_clock_max_s"))))
        if settings.get("script"):
            present = (probe.get("script") or {}).get("exists", False)
            checks.append(check("script.missing", host, present,
                                "%s %s" % (settings["script"], "present" if present else
                                           "does not exist here"),
                                "copy %s to %s or fix -e script (a path on the hosts)"
                                % (settings["script"], host)))
        used = probe.get("run_dir")
        if used:
            # An earlier run's directory: its final state record would be read as this run's.
            checks.append(check("run_id.used", host, not used["exists"],
                                "%s %s" % (used["path"], "exists: this run_id was used before "
                                           "here" if used["exists"] else "is free"),
                                "leave run_id unset (each run gets a new one) or choose another;"
                                " to reuse the name, remove %s on %s" % (used["path"], host)))
        hn = probe["hostname"]
        # On a loopback-only run (the embedded default) every address is loopback by design.
        if hn["loopback"] and not is_loopback_addr(master_addr):
            checks.append(check("hostname.loopback", host, False,
                                "hostname %s resolves to %s" % (hn["name"],
                                                                ", ".join(hn["addresses"])),
                                "map %s to %s in /etc/hosts (Debian adds 127.0.1.1) or fix DNS; "
                                "torchfleet passes --local-addr, but your code may use the name"
                                % (hn["name"], address or "its address")))
        else:
            checks.append(check("hostname.loopback", host, True, "%s -> %s" % (
                hn["name"], ", ".join(hn["addresses"]) or "unresolved")))
        missing = [d["path"] for d in probe["data"] if not d["exists"]]
        if settings["data_paths"]:
            checks.append(check("data.missing", host, not missing,
                                "missing: %s" % ", ".join(missing) if missing else
                                "%d path(s) present" % len(probe["data"]),
                                "copy or mount %s on %s" % (", ".join(missing), host)))
        st = probe.get("stacks") or {}
        if st:
            checks.append(check(
                "hang.stacks", host, st.get("can_attach", False),
                "py-spy %s can attach to the ranks" % st.get("py_spy") if st.get("can_attach")
                else "%s: a hang's stacks will come from each rank's own faulthandler (Python "
                     "frames only)" % st.get("why"),
                "pip install py-spy beside the hosts' python" if not st.get("py_spy") else
                "sudo setcap cap_sys_ptrace+ep %s, or sysctl kernel.yama.ptrace_scope=0, or run "
                "as root" % st.get("py_spy"), WARNING))
        why = (probe.get("kmsg") or {}).get("error")
        if why:  # the run would not see its hardware events here
            checks.append(check("host.kmsg", host, False, why, kmsg.FIX, WARNING))
        shm = probe["shm"]["total_bytes"]
        need = settings["shm_min_bytes"]
        checks.append(check("shm.size", host, shm >= need,
                            "/dev/shm is %d MiB (need %d MiB)" % (shm >> 20, need >> 20),
                            "remount /dev/shm larger (mount -o remount,size=%dG /dev/shm; in "
                            "docker --shm-size)" % max(1, need >> 30),
                            ERROR if backend == "nccl" else WARNING))
        nodes.append({"host": host, "node_rank": rank, "address": address,
                      "socket_ifname": nic, "python": probe["python"]["executable"],
                      "versions": probe["versions"], "gpus": len(probe["gpus"]),
                      # the runtime container_image runs with here (auto resolved)
                      "container_runtime": (probe.get("container") or {}).get("runtime")})

    if not is_loopback_addr(master_addr):  # the embedded default is one machine on purpose
        checks.extend(duplicate_checks(reachable, hosts))
    checks.extend(compare_versions(reachable, master))
    checks.extend(compare_env(reachable, master))
    checks.extend(container_checks(reachable, master, backend))
    if settings["code_dir"]:
        checks.extend(compare_code(reachable, master, settings["code_dir"]))
    fabric_records, network, network_why = fabric.rdma_checks(reachable, master, settings)
    checks.extend(fabric_records)
    checks.extend(health_records(reachable, connects, master, settings, network))
    order = {h: i for i, h in enumerate([CONTROLLER] + hosts)}
    checks.sort(key=lambda c: (order.get(c["host"], len(order)), c["id"]))
    resolved = {"master_addr": master_addr, "backend": backend, "nproc_per_node": nproc,
                "world_size": nproc * len(hosts), "ephemeral_port": minfo.get("ephemeral_port"),
                "network": network, "network_why": network_why,
                "nccl_env": rdma.preset_env(
                    network, settings.get("nccl_ib_hca"), settings.get("nccl_ib_gid_index"),
                    settings.get("nccl_nsocks_perthread", 4),
                    settings.get("nccl_socket_nthreads", 2))}
    return checks, nodes, resolved


ARGUMENT_SPEC = dict(
    hosts=dict(type="list", elements="str", required=True),
    master=dict(type="str"),
    nnodes=dict(type="int", required=True),
    inventory_size=dict(type="int", required=True),
    probes=dict(type="dict", default={}),
    connects=dict(type="dict", default={}),
    master_port=dict(type="int", default=defaults.default("master_port")),
    master_addr=dict(type="str", default=defaults.default("master_addr")),
    socket_ifname=dict(type="str", default=defaults.default("socket_ifname")),
    backend=dict(type="str", default=defaults.default("backend"), choices=["auto", "nccl", "gloo"]),
    nproc_per_node=dict(type="str", default=defaults.default("nproc_per_node")),
    code_dir=dict(type="str", default=defaults.default("code_dir")),
    data_paths=dict(type="list", elements="str", default=defaults.default("data_paths")),
    shm_min_bytes=dict(type="int", default=1 << 30),
    script=dict(type="str", default=defaults.default("script")),
    input_errors=dict(type="list", elements="dict", default=[]),
    listener=dict(type="dict"),
    run_id=dict(type="str", default=defaults.default("run_id")),
    run_dir=dict(type="str", default=defaults.default("run_dir")),
    runs_root=dict(type="str", default=""),
    network=dict(type="str", default=defaults.default("network"), choices=["none", "ethernet", "ib", "auto"]),
    nccl_ib_hca=dict(type="str", default=defaults.default("nccl_ib_hca")),
    nccl_ib_gid_index=dict(type="str", default=defaults.default("nccl_ib_gid_index")),
    nccl_nsocks_perthread=dict(type="int", default=defaults.default("nccl_nsocks_perthread")),
    nccl_socket_nthreads=dict(type="int", default=defaults.default("nccl_socket_nthreads")),
    spares=dict(type="int", default=defaults.default("spares")),
    perf=dict(type="dict", default={}),
    health=dict(type="str", default=defaults.default("health")),
    # raw: a bad value is input.health (plan.py), reported before any host is probed; with
    # hosts to judge they are numbers.
    **{name: dict(type="raw", default=defaults.default(name)) for name in (
        "health_slow_pct", "health_floors", "health_ecc_corrected_max", "health_disk_min_gb",
        "health_clock_max_s")},
    skipped=dict(type="list", elements="dict", default=[]),
    choice=dict(type="dict"),
    quarantine=dict(type="str", default=defaults.default("quarantine"), choices=["warn", "strict"]),
    **memory.SPEC
)


def summary_table(checks, nodes):
    """Failed and warning checks (host, check, verdict, detail, fix); else one row per node."""
    problems = [c for c in checks if not c["ok"]]
    if problems:
        rows = [(c["host"], c["id"], "FAIL" if c["severity"] == ERROR else "WARN",
                 c["detail"], c["hint"]) for c in problems]
        return render(("HOST", "CHECK", "VERDICT", "DETAIL", "FIX"), rows, max_width=60)
    per_host = Counter(c["host"] for c in checks)
    rows = [(n["host"], n["node_rank"], n["address"], n["socket_ifname"],
             "ok: %d checks passed" % per_host[n["host"]]) for n in nodes]
    return render(("HOST", "RANK", "ADDRESS", "NCCL/GLOO_SOCKET_IFNAME", "VERDICT"), rows)


def decide(params):
    """The module's whole job, shared by the module and its controller-side action plugin."""
    nproc = params["nproc_per_node"]
    # run_plan reports a bad value as input.nproc_per_node before any host is probed; here it
    # can only arrive from a direct call of the module.
    if bad_nproc_per_node(nproc) and params["hosts"]:
        raise ValueError("nproc_per_node=%s is not a positive number; set -e nproc_per_node=N "
                         "or auto" % nproc)
    settings = {k: params[k] for k in ("master_port", "master_addr", "socket_ifname", "backend",
                                       "code_dir", "data_paths", "shm_min_bytes", "script",
                                       "input_errors", "listener", "network", "nccl_ib_hca",
                                       "nccl_ib_gid_index", "nccl_nsocks_perthread",
                                       "nccl_socket_nthreads", "perf", "health",
                                       "health_slow_pct", "health_floors",
                                       "health_ecc_corrected_max", "health_disk_min_gb",
                                       "health_clock_max_s")}
    settings["nproc_per_node"] = nproc
    hosts, nnodes = params["hosts"], params["nnodes"]
    # The fleet's memory of the candidates: their scores order the spares, a quarantined host
    # is left out while spares allow (none of it without a ledger, or with its history empty).
    fleet = memory.open_fleet(params, params["run_dir"])
    now = ledger.now()
    # (A second decision, after a port test against a new master, names every candidate's.)
    candidates = list(dict.fromkeys(list((params["choice"] or {}).get("candidates") or [])
                                    + hosts))
    health = memory.health(fleet, candidates) if hosts else {}
    # Quarantines are judged at the time the ledger was read at: on PostgreSQL the server's
    # clock, every controller's one (a controller 36 h ahead would read a 24 h quarantine as
    # over, and use the host); `now` stays this controller's, its report's times.
    now_held = memory.read_at(fleet, now)
    # What quarantine=strict gates on: a ledger that could not be read (before or in
    # health()), not a write after it (ledger_checks).
    unread = list(fleet.warnings)
    held = memory.quarantined(health, now_held)
    observe = params["actions"] == "observe"

    def judge(chosen, master=None):
        return evaluate(chosen, nnodes, params["inventory_size"], params["probes"],
                        params["connects"], settings, master)

    # With spares the ports may have been tested against a host after the first (the ones
    # before it were not reached): that master, unless it is the one to blame, runs.
    checks, nodes, resolved = judge(hosts, params["master"])
    choice = None
    used = hosts
    left_out = {}  # {host: True (left out for its quarantine) or False (would have been)}
    if params["spares"] > 0 and hosts:
        # actions=observe leaves out no host for a quarantine of the ledger's own (its check
        # still says it); one made by hand is the user's, and honoured.
        chosen, skipped, retest = spares.choose(
            hosts, nnodes, checks, params["master"],
            {h: v.get("score") or 0.0 for h, v in health.items()},
            {h: v for h, v in held.items() if not str(v.get("reason") or "").startswith(
                ledger.AUTO_REASON)} if observe else held)
        choice = {"candidates": hosts, "chosen": chosen, "skipped": skipped}
        # The audit's exclusions: the hosts left out for a quarantine, and in observe those
        # the ledger's quarantine would have left out (the choice enforce would have made).
        would = spares.choose(hosts, nnodes, checks, params["master"],
                              {h: v.get("score") or 0.0 for h, v in health.items()},
                              held)[1] if observe else skipped
        left_out = {h: h in skipped for h, ids in would.items() if "host.quarantined" in ids}
        used = chosen
        if len(chosen) < nnodes:
            checks = checks + [spares.too_few(hosts, nnodes, skipped)]
        else:
            others = spares.skipped_records(hosts, checks, chosen, skipped, retest)
            others += memory.quarantine_checks([], [h for h in hosts if h in skipped], health,
                                               now_held)
            if retest:
                # The chosen hosts' ports were tested against the broken master: the playbook
                # tests them again with the new one and decides then, with these records.
                fleet.close()
                return dict(ok=True, retest=chosen, checks=others, skipped_records=others,
                            choice=choice, nodes=[], resolved={}, failures=[], report="",
                            table="", verdict="")
            checks, nodes, resolved = judge(chosen)
            checks = checks + others
    checks = checks + params["skipped"] + memory.quarantine_checks(
        used, [], health, now_held, params["quarantine"] == "strict" and not observe)
    choice = choice or params["choice"]
    newly = []
    recording = bool(params["run_dir"] and params["ledger_record"])
    if recording:
        # Written in the ledger before the report: its warnings are the report's too.
        newly = memory.record(fleet, "preflight", dict(
            ok=not failed(checks), kind="preflight", run_id=params["run_id"],
            nnodes=params["nnodes"], hosts=nodes, checks=checks,
            **({"spares": choice} if choice else {})))  # (dated by the ledger's clock)
        memory.textfile(fleet, params, params["run_dir"], now_held)
    # The audit (as train.json's, by the same function): the hosts left out for a quarantine
    # (not done: actions=observe kept them in), then the quarantines recording made or not.
    actions = memory.audit(fleet, "preflight", params["run_id"], newly, now, [
        action("exclude", h, "host.quarantined", now, memory.why_held(h, held[h]), done)
        for h, done in left_out.items() if h in held], write=recording)
    fleet.close()  # (a PostgreSQL ledger's connection, not held through the run)
    checks = checks + memory.ledger_checks(
        fleet, strict=params["quarantine"] == "strict" and not observe, unread=unread)
    bad = failed(checks)
    sentence = verdict("preflight", checks)
    if fleet.breaker:  # what the circuit breaker kept the ledger from doing, in the verdict
        sentence += "; " + fleet.breaker
    table = summary_table(checks, nodes)
    if params["network"] != "none" and resolved.get("network"):  # what the preset will be
        table += "\n\nnetwork=%s%s: %s" % (
            resolved["network"], " (auto)" if params["network"] == "auto" else "",
            resolved["network_why"])
    said = memory.history_lines(health, candidates, now_held)
    if said or newly:
        table += "\n\n" + "\n".join(t for t in (said, memory.newly_text(newly)) if t)
    if choice and not bad:
        table += "\n\n" + spares.summary(choice)
    result = dict(ok=not bad, checks=checks, nodes=nodes, resolved=resolved, failures=bad,
                  table=table + "\n\n" + sentence, verdict=sentence, report="", retest=[],
                  actions=actions)
    if choice:
        result["choice"] = choice
    fleet_entry = memory.report_entry(health, candidates, now_held)
    if newly:
        result["quarantined"] = newly
    if params["run_dir"]:
        report = dict(ok=not bad, kind="preflight", run_id=params["run_id"],
                      nnodes=params["nnodes"], master_port=params["master_port"],
                      hosts=nodes, checks=checks, verdict=sentence, actions=actions,
                      **resolved)
        if choice:
            report["spares"] = choice
        if fleet_entry:
            report["fleet"] = fleet_entry
        result["report"] = write_report(params["run_dir"], "preflight.json", report,
                                        params["runs_root"] or None)
    return result
