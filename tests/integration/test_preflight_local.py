"""preflight.yml on the embedded default inventory (two nodes on this machine), for real."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from tests.conftest import processes_matching, this_netns
from tests.integration.playbook import local_inventory, playbook
from lab.ports import free_port

pytestmark = pytest.mark.integration

PER_HOST_IDS = {"host.unreachable", "python.torch", "gpu.count", "nic.missing", "nic.address",
                "nic.route", "port.blocked", "port.ephemeral", "env.nccl", "hostname.loopback",
                "shm.size", "version.python", "version.torch"}


def listener_processes(port):
    """The listeners on `port` in this machine's network (not a lab's): its command line names
    the ports it holds, first the master port."""
    return processes_matching("torchfleet-port-listener %d" % port, netns=this_netns())


def test_healthy_default_passes_every_check_and_changes_nothing(tmp_path):
    port = free_port()
    run = playbook("preflight.yml", tmp_path, "-e", "master_port=%d" % port)
    assert run.rc == 0, run.out
    report = run.report()
    assert report["ok"] is True and report["run_id"]
    assert [(h["host"], h["node_rank"], h["socket_ifname"]) for h in report["hosts"]] == [
        ("node0", 0, "lo"), ("node1", 1, "lo")]
    for host in ("node0", "node1"):
        ids = {c["id"] for c in report["checks"] if c["host"] == host and c["ok"]}
        assert PER_HOST_IDS <= ids, PER_HOST_IDS - ids
    assert ("port.in_use", "node0") in {(c["id"], c["host"]) for c in report["checks"]}
    assert "ok: " in run.out and "NCCL/GLOO_SOCKET_IFNAME" in run.out
    assert all(row["changed"] == 0 and row["failed"] == 0 for row in run.recap().values())
    assert run.recap() and listener_processes(port) == []
    # What a fresh install prints is torchfleet's own: nothing on stderr, where a library's
    # warning (cryptography's DSA deprecation at ansible-core's start) would land on the
    # user's screen, and no Ansible warning among the table's lines.
    assert run.stderr == "", run.stderr
    assert "[WARNING]" not in run.out and "[DEPRECATION WARNING]" not in run.out


def test_port_in_use_names_the_holding_pid(tmp_path):
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        run = playbook("preflight.yml", tmp_path, "-e", "master_port=%d" % port)
    assert run.rc != 0
    assert run.failing() == [("port.in_use", "node0")]
    (check,) = [c for c in run.report()["checks"] if c["id"] == "port.in_use"]
    assert "pid %d" % os.getpid() in check["detail"] and str(port) in check["detail"]
    assert "node0" in run.out and "port.in_use" in run.out and "master_port" in run.out


def test_missing_nic_is_named_on_every_host(tmp_path):
    run = playbook("preflight.yml", tmp_path, "-e", "socket_ifname=tfnope0")
    assert run.rc != 0
    assert run.failing() == [("nic.missing", "node0"), ("nic.missing", "node1")]
    assert "no interface tfnope0" in run.out


def test_nnodes_larger_than_inventory_fails_before_touching_a_host(tmp_path):
    run = playbook("preflight.yml", tmp_path, "-e", "nnodes=3")
    assert run.rc != 0
    assert run.failing() == [("world.size", "controller")]
    assert "nnodes=3 but group `nodes` has 2 host(s)" in run.out
    assert "Probe the host" not in run.out  # no task ran on any node


def test_unreachable_host_is_named_and_the_others_are_still_checked(tmp_path):
    inventory = local_inventory(tmp_path, {
        "node0": {}, "node1": {},
        # A real SSH attempt to a port nothing listens on.
        "node2": {"ansible_connection": "ssh", "ansible_host": "127.0.0.1",
                  "ansible_port": free_port()},
    })
    run = playbook("preflight.yml", tmp_path, inventory=inventory)
    assert run.rc != 0
    failing = run.failing()
    assert ("host.unreachable", "node2") in failing
    assert all(host == "node2" for _, host in failing), failing
    checked = {c["host"] for c in run.report()["checks"] if c["id"] == "python.torch"}
    assert checked == {"node0", "node1"}


def test_an_interpreter_without_torch_is_named(tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    inventory = local_inventory(tmp_path, {"node0": {}, "node1": {"python": str(bare / "bin/python")}})
    run = playbook("preflight.yml", tmp_path, inventory=inventory)
    assert run.rc != 0
    assert ("python.torch", "node1") in run.failing()
    assert ("version.torch", "node1") in run.failing()
    assert all(host == "node1" for _, host in run.failing())


def test_a_broken_first_host_hands_the_master_to_the_spare_after_a_port_test_against_it(
        tmp_path):
    # node0 lacks a data path: the master tested is to blame, so node1 is probed and its
    # ports tested again with itself as the master (the plays of a new master), then decided.
    inventory = local_inventory(tmp_path, {"node0": {"data_paths": [str(tmp_path / "shards")]},
                                           "node1": {}})
    port = free_port()
    run = playbook("preflight.yml", tmp_path, "-e", "nnodes=1", "-e", "spares=1",
                   "-e", "master_port=%d" % port, inventory=inventory)
    assert run.rc == 0, run.out[-3000:]
    report = run.report()
    assert [(h["host"], h["node_rank"]) for h in report["hosts"]] == [("node1", 0)]
    assert list(report["spares"]["skipped"]) == ["node0"]
    assert report["spares"]["skipped"]["node0"] == ["data.missing"]
    probes = [line for line in (run.run_dir / "play.log").read_text().splitlines()
              if "Probe the host in one call" in line]
    assert len(probes) == 2 and probes[1].endswith("ok 1, failed 0"), probes
    assert listener_processes(port) == []


def test_a_different_python_version_is_named_with_both_values(tmp_path):
    system = shutil.which("python3", path="/usr/bin")
    other = subprocess.run([system, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                           capture_output=True, text=True).stdout.strip() if system else None
    mine = "%d.%d.%d" % sys.version_info[:3]
    if not other or other == mine:
        pytest.skip("needs a second Python version at /usr/bin/python3")
    inventory = local_inventory(tmp_path, {"node0": {}, "node1": {"python": system}})
    run = playbook("preflight.yml", tmp_path, inventory=inventory)
    (check,) = [c for c in run.report()["checks"] if c["id"] == "version.python" and not c["ok"]]
    assert check["host"] == "node1" and other in check["detail"] and mine in check["detail"]


def test_code_sync_names_the_differing_files(tmp_path):
    for side, files in (("a", {"train.py": "x = 1\n", "model.py": "m\n"}),
                        ("b", {"train.py": "x = 2\n", "model.py": "m\n", "debug.py": "d\n"})):
        for name, text in files.items():
            (tmp_path / side).mkdir(exist_ok=True)
            (tmp_path / side / name).write_text(text)
    inventory = local_inventory(tmp_path, {"node0": {"code_dir": str(tmp_path / "a")},
                                           "node1": {"code_dir": str(tmp_path / "b")}})
    run = playbook("preflight.yml", tmp_path, inventory=inventory)
    assert run.rc != 0
    assert run.failing() == [("code.sync", "node1")]
    (check,) = [c for c in run.report()["checks"] if c["id"] == "code.sync" and not c["ok"]]
    assert "changed: train.py" in check["detail"] and "only here: debug.py" in check["detail"]


def test_code_sync_passes_for_identical_trees(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("x = 1\n")
    run = playbook("preflight.yml", tmp_path, "-e", "code_dir=%s" % (tmp_path / "code"))
    assert run.rc == 0, run.out
    assert {c["host"] for c in run.report()["checks"] if c["id"] == "code.sync" and c["ok"]} == {
        "node0", "node1"}


def test_missing_data_path(tmp_path):
    data = json.dumps({"data_paths": [str(tmp_path), str(tmp_path / "shards")]})
    run = playbook("preflight.yml", tmp_path, "-e", data)
    assert run.rc != 0
    assert run.failing() == [("data.missing", "node0"), ("data.missing", "node1")]
    assert str(tmp_path / "shards") in run.out


def test_nccl_without_gpus_fails_gpu_count_and_small_shm(tmp_path):
    run = playbook("preflight.yml", tmp_path, "-e", "backend=nccl", "-e", "nproc_per_node=8",
                   "-e", "preflight_shm_min_bytes=%d" % (1 << 50))
    assert run.rc != 0
    assert run.failing() == [("gpu.count", "node0"), ("gpu.count", "node1"),
                             ("shm.size", "node0"), ("shm.size", "node1")]
    (check,) = [c for c in run.report()["checks"] if c["id"] == "gpu.count" and c["host"] == "node0"]
    assert "0 GPU(s)" in check["detail"] and "nproc_per_node=8" in check["detail"]


def test_small_shm_is_only_a_warning_with_gloo(tmp_path):
    run = playbook("preflight.yml", tmp_path, "-e", "preflight_shm_min_bytes=%d" % (1 << 50))
    assert run.rc == 0, run.out
    warned = [(c["id"], c["host"], c["severity"]) for c in run.report()["checks"] if not c["ok"]]
    assert warned == [("shm.size", "node0", "warning"), ("shm.size", "node1", "warning")]
    assert "WARN" in run.out


def non_loopback_address():
    out = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True).stdout
    for link in json.loads(out):
        for addr in link.get("addr_info", []):
            if addr.get("family") == "inet" and not addr["local"].startswith("127."):
                return link["ifname"], addr["local"]
    return None


def test_auto_detected_nic_and_hostname_resolution(tmp_path):
    found = non_loopback_address()
    if found is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    ifname, address = found
    inventory = local_inventory(tmp_path, {"node0": {}, "node1": {}})
    run = playbook("preflight.yml", tmp_path, "-e", "master_addr=%s" % address,
                   "-e", "socket_ifname=", "-e", "master_port=%d" % free_port(),
                   inventory=inventory)
    report = run.report()
    assert [h["socket_ifname"] for h in report["hosts"]] == [ifname, ifname]
    addresses = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    loopback = any(a.startswith("127.") or a == "::1" for a in addresses)
    expected = [("hostname.loopback", "node0"), ("hostname.loopback", "node1")] if loopback else []
    # Off loopback, two inventory names for this one machine are a real mistake.
    assert run.failing() == sorted(expected + [("host.duplicate", "node1")])
    assert run.rc != 0


def test_a_wrong_type_is_rejected_before_any_task(tmp_path):
    run = playbook("preflight.yml", tmp_path, "-e", "master_port=abc")
    assert run.rc != 0
    assert "master_port" in run.out and "Probe the host" not in run.out
