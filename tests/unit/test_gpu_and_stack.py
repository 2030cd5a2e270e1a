"""GPU and Python-stack parsers.

nvidia_smi_query_gpu_h100x1.csv, nccl_h_2.28.9_defines.txt and python_probe_h100.json are
RECORDED on a real GPU machine lent to a session (one H100, driver 580.159.04, torch
2.11.0+cu130 with NCCL 2.28.9; tests/fixtures/README.md). The eight-GPU H200 CSV is not a
capture: name, driver and memory were read off a real H200, its UUIDs and bus ids are made up;
it stands for a host with several GPUs, which no lent machine had.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from ansible_collections.torchfleet.fleet.plugins.module_utils.host import gpu, pystack

from tests.conftest import FIXTURES
from tests.unit.modules import command_runner


def test_parse_gpu_csv_eight_h200():
    gpus = gpu.parse_gpu_csv((FIXTURES / "nvidia_smi_query_gpu_h200x8.csv").read_text())
    assert [g["index"] for g in gpus] == list(range(8))
    assert {g["name"] for g in gpus} == {"NVIDIA H200"}
    assert {g["driver_version"] for g in gpus} == {"580.159.03"}
    assert gpus[0]["memory_total_mib"] == 143771
    assert gpus[7]["pci_bus_id"] == "00000000:DB:00.0"


def test_parse_gpu_csv_of_a_recorded_h100():
    (h100,) = gpu.parse_gpu_csv((FIXTURES / "nvidia_smi_query_gpu_h100x1.csv").read_text())
    assert h100 == {"index": 0, "name": "NVIDIA H100 80GB HBM3",
                    "uuid": "GPU-0a9834fe-693b-c2b4-3a88-e1a649bf0cc8",
                    "driver_version": "580.159.04", "memory_total_mib": 81559,
                    "pci_bus_id": "00000000:00:06.0", "vendor": "nvidia"}


def test_parse_gpu_csv_rejects_a_foreign_layout():
    with pytest.raises(ValueError, match="unexpected nvidia-smi line"):
        gpu.parse_gpu_csv("NVIDIA H200, 580.159.03\n")
    assert gpu.parse_gpu_csv("") == []


def test_nccl_version_from_header():
    assert pystack.parse_nccl_header((FIXTURES / "nccl_h_excerpt.txt").read_text()) == "2.21.5"
    assert pystack.parse_nccl_header("#define NCCL_MAJOR 2\n") is None
    # The version defines of a real nccl.h (nvidia-nccl-cu13 2.28.9, recorded on a GPU host).
    recorded = (FIXTURES / "nccl_h_2.28.9_defines.txt").read_text()
    assert pystack.parse_nccl_header(recorded) == "2.28.9"


def test_the_python_probe_on_a_recorded_gpu_host_names_torch_cuda_and_nccl():
    """What the probe's snippet answered on a GPU host (recorded): the fields version.torch,
    version.cuda and version.nccl compare across hosts."""
    seen = json.loads((FIXTURES / "python_probe_h100.json").read_text())
    assert (seen["torch_version"], seen["torch_cuda"], seen["nccl_version"]) == (
        "2.11.0", "13.0", "2.28.9")
    scope = {}
    exec(pystack.SNIPPET, scope)  # the same snippet here: the same keys, whatever the values
    # Recorded before the snippet also read torch's HIP build (None on a CUDA build).
    assert set(scope["out"]) == set(seen) | {"torch_hip"}


# In a fresh interpreter: the probe of the module's own interpreter (answered in-process) must
# leave torch unimported.
PROBE_SELF = """
import json, sys
from ansible_collections.torchfleet.fleet.plugins.module_utils.host import pystack
stack = pystack.probe_python(sys.executable, None)  # in-process: runs no command
print(json.dumps([stack, "torch" in sys.modules]))
"""


def test_probe_python_reads_torch_without_importing_it():
    out = subprocess.run([sys.executable, "-c", PROBE_SELF],
                         capture_output=True, text=True, check=True).stdout
    stack, imported = json.loads(out)
    assert imported is False
    import torch  # the probe must agree with torch itself

    assert stack["torch_version"] == torch.__version__
    assert stack["torch_cuda"] == torch.version.cuda
    assert stack["python_version"] == "%d.%d.%d" % sys.version_info[:3]
    assert stack["executable"] == sys.executable


def test_the_probe_reports_torch_version_as_torch_does_not_its_metadata(tmp_path):
    """A CUDA build's metadata says '2.11.0' while torch.__version__ is '2.11.0+cu130'
    (recorded on the H200 host, ../shared/recorded/h200-1gpu/README.md): two builds of one
    release must not compare equal in version.torch. torch/version.py as that build writes it."""
    pkg = tmp_path / "torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise SystemExit('imported')\n")
    (pkg / "version.py").write_text(
        "from typing import Optional\n\n__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip']\n"
        "__version__ = '2.11.0+cu130'\ndebug = False\ncuda: Optional[str] = '13.0'\n"
        "hip: Optional[str] = None\n")
    meta = tmp_path / "torch-2.11.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0\n")
    out = subprocess.run([sys.executable, "-c", pystack.SNIPPET + "print(json.dumps(out))"],
                         capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}).stdout
    stack = json.loads(out)
    assert (stack["torch_version"], stack["torch_cuda"], stack["torch_hip"]) == (
        "2.11.0+cu130", "13.0", None)


def test_probe_python_without_torch_and_without_interpreter(tmp_path):
    run = command_runner()
    assert "no such interpreter" in pystack.probe_python(str(tmp_path / "python9"), run)["error"]
    system = shutil.which("python3", path="/usr/bin")
    if system:
        stack = pystack.probe_python(system, run)
        assert stack["torch_version"] is None and stack["torch_cuda"] is None


def test_a_hung_interpreter_fails_its_probe_instead_of_hanging_preflight(tmp_path):
    # A stand-in `python` that never answers (as one stuck on a dead NFS mount would).
    hung = tmp_path / "python"
    hung.write_text("#!/bin/sh\nexec sleep 600\n")
    hung.chmod(0o755)
    stack = pystack.probe_python(str(hung), command_runner(), timeout_s=1)
    assert stack == {"error": "%s failed: %s did not answer within 1 s" % (hung, hung)}


def test_a_failing_command_is_named_with_its_message():
    out, err = command_runner()(["ls", "/nonexistent-torchfleet"])
    assert out is None and "nonexistent-torchfleet" in err
