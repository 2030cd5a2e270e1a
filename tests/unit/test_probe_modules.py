"""node_probe and port_probe run for real on this machine through their main()."""
from __future__ import annotations

import shutil
import socket
import sys
import time

from ansible_collections.torchfleet.fleet.plugins.modules import node_probe
from ansible_collections.torchfleet.fleet.plugins.modules import port_probe

from tests.unit.modules import run_module
from lab.ports import free_port
from tests.unit.test_listener import wait_gone


def test_node_probe_reports_this_host(tmp_path, capsys):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print(1)\n")
    result = run_module(node_probe, {
        "python": sys.executable,
        "code_dir": str(tmp_path / "code"),
        "data_paths": [str(tmp_path / "code"), str(tmp_path / "absent")],
    }, capsys)
    assert result["changed"] is False
    assert "lo" in {n["name"] for n in result["nics"]}
    assert result["versions"]["python"] == "%d.%d.%d" % sys.version_info[:3]
    assert result["versions"]["torch"]
    assert result["hostname"]["name"] == socket.gethostname()
    assert result["shm"]["total_bytes"] > 0
    assert list(result["code"]["files"]) == ["train.py"]
    assert [d["exists"] for d in result["data"]] == [True, False]
    assert "master" not in result


def test_node_probe_without_nvidia_smi_reports_no_gpu(tmp_path, capsys, monkeypatch):
    # A PATH with `ip` and coreutils' `timeout` alone: the probe must treat the missing
    # nvidia-smi as "no GPU".
    for tool in ("ip", "timeout"):
        (tmp_path / tool).symlink_to(shutil.which(tool))
    monkeypatch.setenv("PATH", str(tmp_path))
    result = run_module(node_probe, {"python": sys.executable}, capsys)
    assert result["gpus"] == [] and result["nvidia_smi"]["found"] is False
    assert result["versions"]["driver"] is None


def test_node_probe_names_an_nvidia_smi_that_is_there_and_fails(tmp_path, capsys, monkeypatch):
    # A stand-in nvidia-smi whose library is missing: it exists, so this is a broken GPU host
    # to name, not a host without GPUs, though its message says "not found".
    for tool in ("ip", "timeout"):
        (tmp_path / tool).symlink_to(shutil.which(tool))
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI could not find libnvidia-ml.so library: not "
                   "found' >&2\nexit 12\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    result = run_module(node_probe, {"python": sys.executable}, capsys)
    assert result["gpus"] == [] and result["nvidia_smi"]["found"] is True
    assert "libnvidia-ml.so" in result["nvidia_smi"]["error"]


def test_node_probe_on_master_names_the_holder_of_the_port(capsys):
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run_module(node_probe, {"master_port": port, "master_addr": "127.0.0.1"},
                            capsys)
    import os

    master = result["master"]
    assert master["in_use"] is True
    assert os.getpid() in [h["pid"] for h in master["holders"]]
    assert master["addr"] == "127.0.0.1"
    low, high = master["ephemeral_range"]
    assert low <= master["ephemeral_port"] <= high and master["ephemeral_port"] != port


def test_node_probe_listens_and_port_probe_connects_then_stops_it(capsys):
    port = free_port()
    probe = run_module(node_probe, {"master_port": port, "master_addr": "127.0.0.1",
                                    "listen": True, "expect_peers": 2}, capsys)
    listener = probe["master"]["listener"]
    assert [p["bound"] for p in listener["ports"]] == [True, True]
    ports = [port, probe["master"]["ephemeral_port"]]
    worker = run_module(port_probe, {"master_addr": "127.0.0.1", "ports": ports}, capsys)
    assert [p["ok"] for p in worker["ports"]] == [True, True]
    assert worker["route"]["nic"] == "lo" and worker["route"]["local"] is True
    master = run_module(port_probe, {"master_addr": "127.0.0.1", "ports": ports,
                                     "listener_pid": listener["pid"], "listener_wait_s": 5},
                        capsys)
    assert master["listener"] in ("exited", "gone")
    assert wait_gone(listener["pid"])


def test_port_probe_reports_refused_after_retrying(capsys):
    result = run_module(port_probe, {"master_addr": "127.0.0.1", "ports": [free_port()],
                                     "timeout_s": 0.5}, capsys)
    (port,) = result["ports"]
    assert port["ok"] is False and port["error"] == "refused"
    assert port["elapsed_s"] >= 0.4


def test_one_round_master_waits_for_the_workers_connections_then_removes_its_listener(capsys):
    """The one-round port test: a worker dials while the master's own probe starts the
    listener, counts the connections and removes it before returning."""
    import threading

    from ansible_collections.torchfleet.fleet.plugins.module_utils.host.connect import Connector

    port, ephemeral = free_port(), free_port()
    worker = {}
    thread = threading.Thread(target=lambda: worker.update(
        results=Connector("127.0.0.1", [port, ephemeral], 5).results()))
    thread.start()
    master = run_module(node_probe, {
        "master_port": port, "master_addr": "127.0.0.1", "listen": True, "expect_peers": 2,
        "ephemeral_port": ephemeral, "connect_addr": "127.0.0.1", "connect_ports": [port],
        "listener_wait_s": 5}, capsys)
    thread.join()
    assert master["master"]["ephemeral_port"] == ephemeral
    assert master["connect"]["listener"] in ("exited", "gone")  # both connected: it ended itself
    assert wait_gone(master["master"]["listener"]["pid"])
    assert [r["ok"] for r in master["connect"]["ports"]] == [True, True]
    assert [r["ok"] for r in worker["results"]] == [True, True]
    assert master["connect"]["route"]["nic"] == "lo"


def test_one_round_a_worker_that_dials_after_the_listener_ended_is_not_tested(capsys):
    """A worker too slow to start its probe dials once the master's listener is gone: it is
    refused, and the stamps (the master's listener.ended_at, the worker's dialled_at) make it
    a "not tested" warning, where a worker refused while the listener was up is an error."""
    from ansible_collections.torchfleet.fleet.plugins.module_utils.host.connect import connect
    from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.preflight import (
        port_checks)

    port = free_port()
    master = run_module(node_probe, {
        "master_port": port, "master_addr": "127.0.0.1", "listen": True, "expect_peers": 2,
        "connect_addr": "127.0.0.1", "connect_ports": [port], "listener_wait_s": 0.2}, capsys)
    assert master["connect"]["listener"] == "stopped"  # one peer never came
    ended = master["master"]["listener"]["ended_at"]
    assert abs(time.time() - ended) < 60
    while time.time() <= ended + 2.0:  # later than the fleet's clock tolerance (2 s)
        time.sleep(0.1)
    late = connect("127.0.0.1", port, timeout_s=0.5, retry_s=0.5)
    assert late["error"] == "refused" and late["dialled_at"] > ended + 2.0
    records = port_checks("w1", {"ports": [late]}, "127.0.0.1", master["master"], port, 2.0)
    assert [(r["id"], r["ok"], r["severity"]) for r in records] == [
        ("port.blocked", False, "warning")]
    assert "not tested" in records[0]["detail"]
    # The same refusal dialled before the listener ended: a firewall that rejects.
    on_time = dict(late, dialled_at=ended - 1.0)
    records = port_checks("w1", {"ports": [on_time]}, "127.0.0.1", master["master"], port, 2.0)
    assert [(r["id"], r["ok"], r["severity"]) for r in records] == [("port.blocked", False, "error")]


def test_one_round_ephemeral_port_held_by_another_process_is_dialled_not_bound(capsys):
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        held = holder.getsockname()[1]
        master = run_module(node_probe, {
            "master_port": port, "master_addr": "127.0.0.1", "listen": True, "expect_peers": 1,
            "ephemeral_port": held, "connect_addr": "127.0.0.1", "connect_ports": [port],
            "listener_wait_s": 5}, capsys)
    assert [p["port"] for p in master["master"]["listener"]["ports"]] == [port]
    assert [(r["port"], r["ok"]) for r in master["connect"]["ports"]] == [(port, True), (held, True)]


def test_one_round_worker_reports_refused_when_no_master_listens(capsys):
    port, ephemeral = free_port(), free_port()
    result = run_module(node_probe, {"connect_addr": "127.0.0.1", "connect_ports": [port],
                                     "ephemeral_port": ephemeral, "connect_timeout_s": 0.3},
                        capsys)
    assert [(r["port"], r["ok"], r["error"]) for r in result["connect"]["ports"]] == [
        (port, False, "refused"), (ephemeral, False, "refused")]
    assert "master" not in result


def test_node_probe_with_an_image_and_no_runtime_reads_no_python_of_the_host(tmp_path, capsys,
                                                                            monkeypatch):
    # container_image with docker absent: container.runtime's error, and the host's Python
    # (which has torch here) is not reported as the ranks': they would run the image's.
    for tool in ("ip", "timeout"):
        (tmp_path / tool).symlink_to(shutil.which(tool))
    monkeypatch.setenv("PATH", str(tmp_path))
    result = run_module(node_probe, {"python": sys.executable,
                                     "container_image": "nvcr.io/nvidia/pytorch:24.05-py3",
                                     "container_runtime": "docker"}, capsys)
    assert result["container"]["error"] == "docker is not installed here"
    assert result["versions"]["torch"] is None
    assert "container.runtime says why" in result["python"]["error"]
    assert run_module(node_probe, {"python": sys.executable}, capsys)["container"] is None


def test_with_an_image_the_masters_listener_outwaits_a_pull(capsys, monkeypatch):
    # A later fork batch dials only once a pulling host's probe returns: the listener's idle
    # time covers the pull (else every host past the forks would fail port.blocked).
    from ansible_collections.torchfleet.fleet.plugins.module_utils.host import image
    started = []
    monkeypatch.setattr(node_probe, "start_listener",
                        lambda ports, peers, idle_s: started.append(idle_s) or None)
    monkeypatch.setattr(image, "probe", lambda *a, **k: dict(
        image=a[0], runtime=None, error="no runtime here", pull_error=None, pulled=False))
    ngc = "nvcr.io/nvidia/pytorch:24.05-py3"
    # (one fork batch dials at once: only a listener kept for later batches outwaits a pull,
    # else a Ctrl-C'd preflight would leave the master's port held for half an hour)
    for extra, idle in (({"keep_listener": True}, 60.0), ({"container_image": ngc}, 60.0),
                        ({"container_image": ngc, "keep_listener": True},
                         60.0 + image.PULL_TIMEOUT_S + image.CREATE_TIMEOUT_S)):
        run_module(node_probe, dict({"master_port": free_port(), "master_addr": "127.0.0.1",
                                     "listen": True, "python": sys.executable}, **extra), capsys)
        assert started.pop() == idle
