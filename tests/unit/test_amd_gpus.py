"""AMD GPUs: amd-smi's and rocm-smi's JSON and the kernel's KFD topology. The JSON and the KFD
node are RECORDED real output from public threads (tests/fixtures/amd/README.md names each);
no AMD GPU is on the machines this runs on. The CPU node of the KFD tree is built here."""
from __future__ import annotations

import shutil
import sys

from ansible_collections.torchfleet.fleet.plugins.modules import node_probe
import pytest
from ansible_collections.torchfleet.fleet.plugins.module_utils.host import gpu
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.preflight import evaluate

from tests.conftest import FIXTURES
from tests.unit.modules import run_module
from tests.unit.test_preflight_checks import SETTINGS, cluster, failing

AMD = FIXTURES / "amd"


def test_amd_smi_static_newer_shape_gpu_data():
    (rx,) = gpu.parse_amd_smi_static((AMD / "amd_smi_static_gpu_data.json").read_text())
    assert rx == {"index": 0, "name": "AMD Radeon RX 7800 XT", "uuid": "0x4162405E51BB99B0",
                  "driver_version": None, "memory_total_mib": None, "pci_bus_id": "0000:03:00.0",
                  "vendor": "amd"}


def test_amd_smi_static_older_shape_a_list():
    (one,) = gpu.parse_amd_smi_static((AMD / "amd_smi_static_list.json").read_text())
    assert (one["index"], one["name"], one["vendor"]) == (0, "AMD GPU", "amd")


def test_rocm_smi_product_name_and_the_full_listing():
    (mi250x,) = gpu.parse_rocm_smi_json((AMD / "rocm_smi_productname_mi250x.json").read_text())
    assert mi250x["name"] == "AMD INSTINCT MI200 (MCM) OAM LC MBA HPE C2"
    (mi250,) = gpu.parse_rocm_smi_json((AMD / "rocm_smi_all_mi250.json").read_text())
    assert (mi250["pci_bus_id"], mi250["uuid"]) == ("0000:C1:00.0", "0xa32343daf897162a")


def stand_in(tmp_path, monkeypatch, script):
    """PATH with `ip`, `timeout`, `cat` and an amd-smi running `script`; no nvidia-smi."""
    for tool in ("ip", "timeout", "cat"):
        (tmp_path / tool).symlink_to(shutil.which(tool))
    smi = tmp_path / "amd-smi"
    smi.write_text("#!/bin/sh\n" + script + "\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))


def test_kfd_topology_counts_gpu_nodes_only(tmp_path):
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "properties").write_text("cpu_cores_count 64\nsimd_count 0\n")
    (tmp_path / "5").mkdir()
    shutil.copy(AMD / "kfd_mi350x_node5_properties", tmp_path / "5" / "properties")
    found = gpu.kfd_gpus(lambda p: open(p).read(), lambda p: __import__("os").listdir(p),
                         str(tmp_path))
    assert [g["name"] for g in found] == ["AMD GPU (KFD node 5, gfx target ?)"]


def test_node_probe_finds_amd_gpus_with_amd_smi(tmp_path, capsys, monkeypatch):
    stand_in(tmp_path, monkeypatch, "cat %s" % (AMD / "amd_smi_static_gpu_data.json"))
    result = run_module(node_probe, {"python": sys.executable}, capsys)
    assert [g["name"] for g in result["gpus"]] == ["AMD Radeon RX 7800 XT"]
    assert result["gpu_tool"] == {"found": True, "error": None, "tool": "amd-smi"}
    assert result["nvidia_smi"]["found"] is False


def test_node_health_asks_amd_smi_each_question_once(tmp_path, capsys, monkeypatch):
    # The GPU count already read `amd-smi static --json`: node health reuses that answer.
    calls = tmp_path / "calls"
    stand_in(tmp_path, monkeypatch, 'echo "$*" >> %s; cat %s'
             % (calls, AMD / "amd_smi_static_gpu_data.json"))
    result = run_module(node_probe, {"python": sys.executable}, capsys)
    assert sorted(calls.read_text().splitlines()) == [
        "bad-pages --json", "metric --json", "process --json", "static --json"]
    assert result["health"]["vendor"] == "amd" and len(result["health"]["gpus"]) == 1


@pytest.mark.parametrize("script, error", [
    ("echo AMDSMI_STATUS_DRM_ERROR >&2; exit 1", "AMDSMI_STATUS_DRM_ERROR"),
    ("echo '{\"gpu_data\": 3'", "its JSON could not be read"),
    ("echo '[1, 2]'", None),
])
def test_node_probe_names_an_amd_smi_that_fails_or_says_nonsense(tmp_path, capsys, monkeypatch,
                                                                 script, error):
    stand_in(tmp_path, monkeypatch, script)
    result = run_module(node_probe, {"python": sys.executable}, capsys)
    assert result["gpus"] == [] and result["gpu_tool"]["tool"] == "amd-smi"
    assert (result["gpu_tool"]["error"] is None) == (error is None)
    assert error is None or error in result["gpu_tool"]["error"]


def test_gpu_count_and_versions_compare_rocm_hosts():
    probes, connects = cluster()
    amd = gpu.parse_rocm_smi_json((AMD / "rocm_smi_productname_mi250x.json").read_text())
    for p in probes.values():
        p["gpus"] = amd * 8
        p["nvidia_smi"] = {"found": False, "error": None}
        p["gpu_tool"] = {"found": True, "error": None, "tool": "rocm-smi"}
        p["versions"].update(cuda=None, hip="6.2.41133-dd7f95766", rocm="6.2.0-66",
                             nccl="2.20.5", driver=None)
    probes["n2"]["gpus"] = amd * 4
    probes["n3"]["versions"]["rocm"] = "6.1.3-122"
    checks, _, resolved = evaluate(list(probes), 4, 4, probes, connects,
                                   {**SETTINGS, "nproc_per_node": "8"})
    assert resolved["backend"] == "nccl"  # RCCL answers to torch's "nccl" backend
    assert failing(checks) == [("gpu.count", "n2"), ("version.rocm", "n3")]
    count = next(c for c in checks if c["id"] == "gpu.count" and c["host"] == "n2")
    assert count["detail"] == "4 GPU(s) (rocm-smi) for nproc_per_node=8"
    assert "rocm-smi" in count["hint"]
    rocm = next(c for c in checks if c["id"] == "version.rocm" and c["host"] == "n3")
    assert rocm["hint"] == "install ROCm 6.2.0-66 on n3"
