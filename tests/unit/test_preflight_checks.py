"""Cross-host preflight decisions over probe results shaped like node_probe's and port_probe's.

The probe dicts are built here (the modules' own tests run them for real); each test changes
one thing on one host and asserts that exactly that host fails with the right check id.
"""
from __future__ import annotations

import copy
import json

from ansible_collections.torchfleet.fleet.plugins.modules import preflight_checks
import pytest
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.gpu import parse_gpu_csv
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.preflight import evaluate
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.records import failed

from tests.conftest import FIXTURES
from tests.unit.modules import run_module

HOSTS = ["n0", "n1", "n2", "n3"]
ADDR = {h: "10.1.0.%d" % (i + 1) for i, h in enumerate(HOSTS)}
GPUS = parse_gpu_csv((FIXTURES / "nvidia_smi_query_gpu_h200x8.csv").read_text())
SETTINGS = {"master_port": 29500, "socket_ifname": "", "backend": "auto", "code_dir": "",
            "data_paths": [], "shm_min_bytes": 1 << 30, "nproc_per_node": "auto"}


def probe(host, master=False):
    p = {
        "hostname": {"name": host, "addresses": [ADDR[host]], "loopback": False},
        "nics": [{"name": "lo", "up": True, "loopback": True, "ipv4": ["127.0.0.1"], "ipv6": []},
                 {"name": "eth0", "up": True, "loopback": False, "ipv4": [ADDR[host]],
                  "ipv6": []}],
        "gpus": copy.deepcopy(GPUS),
        "nvidia_smi": {"found": True, "error": None},
        "python": {"executable": "/usr/bin/python3", "error": None},
        "versions": {"python": "3.11.7", "torch": "2.4.1", "cuda": "12.4", "nccl": "2.21.5",
                     "driver": "580.159.03"},
        "shm": {"total_bytes": 64 << 30, "free_bytes": 64 << 30},
        "env": {"NCCL_DEBUG": "WARN"},
        "code": None,
        "data": [],
    }
    if master:
        p["master"] = {"port": 29500, "in_use": False, "holders": [], "ephemeral_port": 51000,
                       "ephemeral_range": [32768, 60999], "addr": ADDR[host],
                       "listener": {"pid": 1, "ports": []}}
    return p


def connect(host, ok=True, error=None):
    local = host == "n0"
    return {"route": {"dev": "lo" if local else "eth0", "src": ADDR[host], "local": local,
                      "nic": "eth0"},
            "route_error": None,
            "ports": [{"port": p, "ok": ok, "error": error, "elapsed_s": 3.0 if error else 0.01}
                      for p in (29500, 51000)]}


def cluster():
    probes = {h: probe(h, master=(h == "n0")) for h in HOSTS}
    connects = {h: connect(h) for h in HOSTS}
    return probes, connects


def run(probes, connects, nnodes=4, inventory=4, **settings):
    checks, nodes, resolved = evaluate(HOSTS[:nnodes], nnodes, inventory, probes, connects,
                                       {**SETTINGS, **settings})
    return checks, nodes, resolved


def failing(checks):
    return sorted((c["id"], c["host"]) for c in checks if not c["ok"])


def test_healthy_cluster_passes_every_check_and_plans_the_nodes():
    checks, nodes, resolved = run(*cluster())
    assert failing(checks) == []
    assert resolved == {"master_addr": "10.1.0.1", "backend": "nccl", "nproc_per_node": 8,
                        "world_size": 32, "ephemeral_port": 51000, "network": "none",
                        "network_why": "asked for", "nccl_env": {}}
    assert [(n["host"], n["node_rank"], n["socket_ifname"], n["address"]) for n in nodes] == [
        (h, i, "eth0", ADDR[h]) for i, h in enumerate(HOSTS)]
    ids = {c["id"] for c in checks}
    assert {"host.unreachable", "python.torch", "gpu.count", "nic.missing", "nic.address",
            "nic.route", "port.in_use", "port.blocked", "port.ephemeral", "env.nccl",
            "hostname.loopback", "shm.size", "world.size", "version.torch"} <= ids


@pytest.mark.parametrize("name, value", [("torch", "2.3.0"), ("cuda", "12.1"),
                                         ("nccl", "2.18.1"), ("driver", "550.54.15"),
                                         ("python", "3.10.12")])
def test_a_version_outlier_is_named_with_both_values(name, value):
    probes, connects = cluster()
    probes["n2"]["versions"][name] = value
    checks, _, _ = run(probes, connects)
    assert failing(checks) == [("version." + name, "n2")]
    bad = next(c for c in checks if not c["ok"])
    majority = probe("n0")["versions"][name]
    assert value in bad["detail"] and majority in bad["detail"]
    assert "n0, n1, n3" in bad["detail"]


def test_two_against_two_takes_the_masters_side():
    probes, connects = cluster()
    for h in ("n2", "n3"):
        probes[h]["versions"]["torch"] = "2.5.0"
    assert failing(run(probes, connects)[0]) == [("version.torch", "n2"), ("version.torch", "n3")]


def test_unreachable_host_is_named_and_the_others_still_checked():
    probes, connects = cluster()
    probes["n3"] = {"unreachable": True, "msg": "Failed to connect to the host via ssh"}
    connects["n3"] = {"skipped": True}
    probes["n1"]["versions"]["torch"] = "2.0.0"
    checks, nodes, _ = run(probes, connects)
    assert failing(checks) == [("host.unreachable", "n3"), ("version.torch", "n1")]
    assert [n["host"] for n in nodes] == ["n0", "n1", "n2"]


def test_an_unreachable_master_leaves_the_workers_checked():
    probes, connects = cluster()
    probes["n0"] = {"unreachable": True, "msg": "ssh: connect to host 10.1.0.1 port 22"}
    connects = {h: {"skipped": True} for h in HOSTS}
    probes["n2"]["data"] = [{"path": "/data", "exists": False, "kind": None}]
    probes["n3"]["nics"][1]["name"] = "ens5"
    checks, nodes, resolved = run(probes, connects, socket_ifname="eth0", data_paths=["/data"])
    assert failing(checks) == [("data.missing", "n2"), ("host.unreachable", "n0"),
                               ("nic.missing", "n3")]
    assert [n["host"] for n in nodes] == ["n1", "n2", "n3"] and resolved["master_addr"] is None


def test_a_probe_that_fails_is_host_probe_with_the_fix_its_error_names():
    probes, connects = cluster()
    probes["n1"] = {"failed": True, "msg": "/usr/bin/python3: not found"}
    probes["n2"] = {"failed": True, "probe_fix": "install iproute2 on this host",
                    "msg": "cannot list network interfaces: neither `ip -j addr` (ip: not "
                           "found) nor netlink ([Errno 13] Permission denied) lists them"}
    checks = run(probes, connects)[0]
    assert failing(checks) == [("host.probe", "n1"), ("host.probe", "n2")]
    hints = {c["host"]: c["hint"] for c in checks if c["id"] == "host.probe"}
    assert hints == {"n1": "install python3 on n1 or set ansible_python_interpreter",
                     "n2": "install iproute2 on this host"}


def test_no_torch_on_one_host():
    probes, connects = cluster()
    probes["n1"]["versions"].update(torch=None, cuda=None, nccl=None)
    ids = failing(run(probes, connects)[0])
    assert ("python.torch", "n1") in ids and ("version.torch", "n1") in ids


def test_gpu_count_and_gloo_skip():
    probes, connects = cluster()
    probes["n1"]["gpus"] = probes["n1"]["gpus"][:4]
    checks, _, _ = run(probes, connects, nproc_per_node="8")
    assert failing(checks) == [("gpu.count", "n1")]
    checks, _, resolved = run(probes, connects, nproc_per_node="auto")
    assert ("world.size", "controller") in failing(checks)
    checks, _, resolved = run(probes, connects, backend="gloo")
    assert failing(checks) == [] and resolved["nproc_per_node"] == 1
    assert all("skipped" in c["detail"] for c in checks if c["id"] == "gpu.count")
    # An nvidia-smi that is there and fails is named with its own words.
    probes["n1"]["gpus"] = []
    probes["n1"]["nvidia_smi"] = {"found": True, "error": "Failed to initialize NVML"}
    checks, _, _ = run(probes, connects, nproc_per_node="8", backend="nccl")
    (gpu,) = [c for c in checks if c["id"] == "gpu.count" and not c["ok"]]
    assert gpu["detail"] == ("0 GPU(s) (nvidia-smi failed: Failed to initialize NVML) for "
                             "nproc_per_node=8")


def test_missing_nic_and_wrong_route():
    probes, connects = cluster()
    probes["n2"]["nics"][1]["name"] = "ens5"
    checks, _, _ = run(probes, connects, socket_ifname="eth0")
    assert failing(checks) == [("nic.missing", "n2")]
    assert "ens5" in next(c["detail"] for c in checks if not c["ok"])
    probes, connects = cluster()
    connects["n1"]["route"]["nic"] = "docker0"
    assert failing(run(probes, connects, socket_ifname="eth0")[0]) == [("nic.route", "n1")]
    probes, connects = cluster()
    probes["n3"]["nics"][1]["ipv4"] = []
    assert failing(run(probes, connects, socket_ifname="eth0")[0]) == [("nic.address", "n3")]


def test_blocked_and_ephemeral_ports_on_one_worker():
    probes, connects = cluster()
    connects["n2"] = connect("n2", ok=False, error="timed out")
    checks, _, _ = run(probes, connects)
    assert failing(checks) == [("port.blocked", "n2"), ("port.ephemeral", "n2")]
    blocked = next(c for c in checks if c["id"] == "port.blocked" and not c["ok"])
    assert "10.1.0.1:29500" in blocked["detail"] and "firewall" in blocked["detail"]


def late_cluster(dialled_after_s, ended_at=1_795_000_000.0):
    """n2 refused on both ports, its first dial `dialled_after_s` after the master's listener
    ended (the one-round test's stamps: node_probe's listener.ended_at, connect's dialled_at)."""
    probes, connects = cluster()
    probes["n0"]["master"]["listener"]["ended_at"] = ended_at
    connects["n2"] = connect("n2", ok=False, error="refused")
    for port in connects["n2"]["ports"]:
        port["dialled_at"] = ended_at + dialled_after_s
    return probes, connects


def test_a_host_that_dialled_after_the_listener_ended_is_not_called_firewalled():
    # A host too slow to start its probe (the lab's CPU-capped node) was refused because
    # nothing listened any more: no firewall is named, the run is not stopped, the warning
    # says so and what to do.
    checks, _, _ = run(*late_cluster(6.4))
    assert failed(checks) == []
    late = [c for c in checks if not c["ok"]]
    assert [(c["id"], c["host"], c["severity"]) for c in late] == [
        ("port.blocked", "n2", "warning"), ("port.ephemeral", "n2", "warning")]
    assert all("not tested" in c["detail"] and "6.4 s after the master's listener had ended"
               in c["detail"] and "firewall" not in c["detail"] for c in late)
    assert "run preflight again" in late[0]["hint"]


@pytest.mark.parametrize("dialled_after_s", [-3.0, 0.0, 1.9])
def test_a_refusal_while_the_listener_was_up_is_still_the_firewalls(dialled_after_s):
    # Dialled before the listener ended, or later by less than the fleet's clock tolerance
    # (health_clock_max_s, 2 s: the stamps come from two hosts' clocks): a rejecting firewall.
    checks, _, _ = run(*late_cluster(dialled_after_s))
    assert failing(checks) == [("port.blocked", "n2"), ("port.ephemeral", "n2")]
    assert all(c["severity"] == "error" and "refused" in c["detail"]
               for c in checks if not c["ok"])


@pytest.mark.parametrize("ended_at,dialled", [
    (float("nan"), 1e9), (float("inf"), 1e9), ("soon", 1e9), (None, 1e9),
    (1_795_000_000.0, "late"), (1_795_000_000.0, True), (1_795_000_000.0, 1e300)])
def test_stamps_that_are_not_times_leave_the_refusal_an_error(ended_at, dialled):
    # Either stamp is a host's answer: not a finite number, it decides nothing.
    probes, connects = late_cluster(0.0)
    probes["n0"]["master"]["listener"]["ended_at"] = ended_at
    for port in connects["n2"]["ports"]:
        port["dialled_at"] = dialled
    checks, _, _ = run(probes, connects)
    assert failing(checks) == [("port.blocked", "n2"), ("port.ephemeral", "n2")]


def test_a_late_host_with_a_timed_out_port_is_still_named():
    # Dropped packets are a firewall whenever the host dialled: only a refusal can come from
    # a listener that had ended.
    probes, connects = late_cluster(10.0)
    for port in connects["n2"]["ports"]:
        port["error"] = "timed out"
    assert failing(run(probes, connects)[0]) == [("port.blocked", "n2"), ("port.ephemeral", "n2")]


def test_port_in_use_names_the_pid_and_skips_the_blocked_test():
    probes, connects = cluster()
    probes["n0"]["master"].update(in_use=True, holders=[{"pid": 4242, "cmdline": "torchrun x"}])
    checks, _, _ = run(probes, connects)
    assert failing(checks) == [("port.in_use", "n0")]
    assert "pid 4242 (torchrun x)" in next(c["detail"] for c in checks if not c["ok"])


def test_env_difference_is_a_warning():
    probes, connects = cluster()
    probes["n3"]["env"]["NCCL_IB_DISABLE"] = "1"
    checks, _, _ = run(probes, connects)
    (bad,) = [c for c in checks if not c["ok"]]
    assert (bad["id"], bad["host"], bad["severity"]) == ("env.nccl", "n3", "warning")
    assert "NCCL_IB_DISABLE=1" in bad["detail"]


def test_hostname_resolving_to_loopback():
    probes, connects = cluster()
    probes["n1"]["hostname"].update(addresses=["127.0.1.1"], loopback=True)
    assert failing(run(probes, connects)[0]) == [("hostname.loopback", "n1")]


def test_code_sync_names_changed_extra_and_missing_files():
    probes, connects = cluster()
    files = {"train.py": "aa", "model.py": "bb"}
    for h in HOSTS:
        probes[h]["code"] = {"exists": True, "git_commit": None, "git_dirty": False,
                             "files": dict(files), "truncated": False}
    probes["n2"]["code"]["files"].update({"train.py": "zz", "debug.py": "cc"})
    del probes["n2"]["code"]["files"]["model.py"]
    probes["n3"]["code"] = {"exists": False, "git_commit": None, "git_dirty": False,
                            "files": {}, "truncated": False}
    checks, _, _ = run(probes, connects, code_dir="/srv/code")
    assert failing(checks) == [("code.sync", "n2"), ("code.sync", "n3")]
    detail = next(c["detail"] for c in checks if not c["ok"] and c["host"] == "n2")
    assert "changed: train.py" in detail and "only here: debug.py" in detail
    assert "missing here: model.py" in detail


def test_data_missing_and_shm():
    probes, connects = cluster()
    for h in HOSTS:
        probes[h]["data"] = [{"path": "/data/a", "exists": True, "kind": "dir"}]
    probes["n1"]["data"][0]["exists"] = False
    probes["n2"]["shm"]["total_bytes"] = 64 << 20
    checks, _, _ = run(probes, connects, data_paths=["/data/a"])
    assert failing(checks) == [("data.missing", "n1"), ("shm.size", "n2")]


def test_world_size_fails_before_any_host():
    checks, nodes, _ = evaluate([], 5, 4, {}, {}, SETTINGS)
    assert failing(checks) == [("world.size", "controller")]
    assert "nnodes=5" in checks[0]["detail"] and nodes == []
    assert failing(evaluate([], 0, 4, {}, {}, SETTINGS)[0]) == [("world.size", "controller")]


def test_module_main_writes_the_report(tmp_path, capsys):
    probes, connects = cluster()
    connects["n1"] = connect("n1", ok=False, error="refused")
    result = run_module(preflight_checks, {
        "hosts": HOSTS, "nnodes": 4, "inventory_size": 4, "probes": probes,
        "connects": connects, "run_id": "r1", "run_dir": str(tmp_path / "r1"),
        "runs_root": str(tmp_path)}, capsys)
    assert result["ok"] is False and result["changed"] is False
    assert [(c["id"], c["host"]) for c in result["failures"]] == [
        ("port.blocked", "n1"), ("port.ephemeral", "n1")]
    row = next(line for line in result["table"].splitlines() if "port.blocked" in line)
    assert row.split()[:3] == ["n1", "port.blocked", "FAIL"]
    report = json.loads((tmp_path / "r1" / "preflight.json").read_text())
    assert report["ok"] is False and report["run_id"] == "r1" and len(report["hosts"]) == 4
    assert (tmp_path / "latest").resolve() == (tmp_path / "r1").resolve()


def test_module_main_rejects_a_bad_nproc(capsys):
    result = run_module(preflight_checks, {"hosts": ["n0"], "nnodes": 1, "inventory_size": 1,
                                           "nproc_per_node": "eight"}, capsys)
    assert result["failed"] and "nproc_per_node=eight" in result["msg"]


def test_input_errors_fail_on_the_controller_before_any_host():
    errors = [{"id": "input.master_port", "detail": "master_port=70000 is not a TCP port",
               "hint": "set -e master_port=N with 1024 <= N <= 65535"}]
    checks, nodes, _ = evaluate([], 2, 4, {}, {}, {**SETTINGS, "input_errors": errors})
    assert failing(checks) == [("input.master_port", "controller")] and nodes == []


def test_script_missing_and_privileged_port():
    probes, connects = cluster()
    for h in HOSTS:
        probes[h]["script"] = {"path": "/srv/train.py", "exists": h != "n2"}
        probes[h]["euid"] = 1000
    checks, _, _ = run(probes, connects, script="/srv/train.py", master_port=80)
    assert failing(checks) == [("port.privileged", "n0"), ("script.missing", "n2")]


def test_the_same_machine_twice_is_named():
    probes, connects = cluster()
    probes["n3"] = copy.deepcopy(probes["n1"])
    probes["n3"].pop("master", None)
    checks, _, _ = run(probes, connects)
    assert ("host.duplicate", "n3") in failing(checks)
    assert "the same machine as n1" in next(c["detail"] for c in checks
                                           if c["id"] == "host.duplicate" and not c["ok"])


def test_an_ephemeral_port_the_master_could_not_bind_is_not_blamed_on_the_firewall():
    probes, connects = cluster()
    probes["n0"]["master"]["listener"]["ports"] = [
        {"port": 29500, "bound": True, "error": None},
        {"port": 51000, "bound": False, "error": "Address already in use"}]
    for host in HOSTS:
        connects[host]["ports"][1].update(ok=False, error="refused")
    checks, _, _ = run(probes, connects)
    assert failing(checks) == []
    eph = [c for c in checks if c["id"] == "port.ephemeral"]
    assert eph and all("not tested" in c["detail"] and "51000" in c["detail"] for c in eph)
