"""container.driver: the host's NVIDIA driver (nvidia-smi's driver_version, as preflight reads
it) against the image's CUDA (its env's CUDA_VERSION, else torch.version.cuda read in the
image), judged by NVIDIA's minimum driver per CUDA release (host/cuda_driver.py's data)."""
from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.torchfleet.fleet.plugins.module_utils.host import cuda_driver, image
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.preflight import container_checks
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.records import ERROR, WARNING
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import container

NGC = "nvcr.io/nvidia/pytorch:24.05-py3"
# `podman image inspect --format '{{json .Config.Env}}'` of NGC's pytorch:24.05-py3 (its CUDA,
# the compat libraries' driver and path; the rest of its env left out) and of nvidia/cuda's
# 12.4.1-base-ubuntu22.04 (NVIDIA's Dockerfile: the compat package by name).
NGC_ENV = json.dumps([
    "PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:"
    "/usr/bin:/sbin:/bin", "CUDA_VERSION=12.4.1.003", "CUDA_DRIVER_VERSION=550.54.15",
    "CUDA_CACHE_DISABLE=1", "NVIDIA_REQUIRE_JETPACK_HOST_MOUNTS=",
    "_CUDA_COMPAT_PATH=/usr/local/cuda/compat", "ENV=/etc/shinit_v2", "NVIDIA_REQUIRE_CUDA=cuda>=9.0",
    "NCCL_VERSION=2.21.5", "PYTORCH_VERSION=2.4.0a0+07cecf4", "NVIDIA_PYTORCH_VERSION=24.05"])
CUDA_BASE_ENV = json.dumps([
    "PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:"
    "/usr/bin:/sbin:/bin", "NVARCH=x86_64",
    "NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,"
    "driver<471", "NV_CUDA_CUDART_VERSION=12.4.127-1", "NV_CUDA_COMPAT_PACKAGE=cuda-compat-12-4",
    "CUDA_VERSION=12.4.1", "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"])
# The recorded H200 host's nvidia-smi (../shared/recorded/h200-1gpu: driver 580.159.04, torch
# 2.11.0+cu130 whose torch.version.cuda is "13.0").
H200_DRIVER = "580.159.04"


def test_the_image_declares_its_cuda_and_the_compat_libraries_in_its_env():
    assert cuda_driver.image_cuda(NGC_ENV) == {"version": "12.4.1.003", "compat": True}
    assert cuda_driver.image_cuda(CUDA_BASE_ENV) == {"version": "12.4.1", "compat": True}
    assert cuda_driver.image_cuda(json.dumps(["CUDA_VERSION=12.1.1"])) == {
        "version": "12.1.1", "compat": False}
    assert cuda_driver.image_cuda(json.dumps(["PATH=/bin"])) is None  # (a CPU image)
    assert cuda_driver.image_cuda("null") is None and cuda_driver.image_cuda(None) is None


def test_the_tables_hold_nvidias_rows():
    assert cuda_driver.TOOLKIT_DRIVER["12.4.1"] == "550.54.15"  # NGC 24.05's CUDA_DRIVER_VERSION
    assert cuda_driver.TOOLKIT_DRIVER["12.2.2"] == "535.104.05"
    assert cuda_driver.MINOR_COMPAT_MIN == {11: "450.80.02", 12: "525.60.13", 13: "580"}
    assert cuda_driver.SOURCE.startswith("https://docs.nvidia.com/") and cuda_driver.READ_ON
    # (every row parses, and a later update never needs an older driver)
    rows = sorted((cuda_driver.parse_version(k), cuda_driver.parse_version(v))
                  for k, v in cuda_driver.TOOLKIT_DRIVER.items())
    assert all(a[1] <= b[1] for a, b in zip(rows, rows[1:], strict=False))
    assert all(cuda_driver.parse_version(cuda_driver.MINOR_COMPAT_MIN[r[0][0]]) <= r[1]
               for r in rows if r[0][:2] != (11, 0))


def test_verdicts_on_real_driver_strings():
    v = cuda_driver.verdict
    assert v("12.4.1.003", "550.54.15")[0] == "ok"
    assert v("12.4.1.003", H200_DRIVER)[0] == "ok"
    level, detail, fix = v("12.4.1.003", "535.104.05")
    assert level == "warning" and "minor version compatibility" in detail and "550.54.15" in fix
    level, detail, fix = v("12.4.1.003", "470.82.01")
    assert level == "error" and "525.60.13" in detail and "550.54.15" in fix
    level, detail, _fix = v("12.4.1.003", "470.82.01", compat=True)
    assert level == "warning" and "data-center GPUs" in detail and "cuda-compat" in detail
    assert v("13.0", "575.57.08")[0] == "error" and v("13.0", H200_DRIVER)[0] == "ok"
    assert v("12.4", "550.54.14")[0] == "ok"  # (torch's "12.4": 12.4's GA row)
    assert v("11.8", "450.80.02")[0] == "warning" and v("11.8", "450.80.01")[0] == "error"
    # (11.0 shipped before 11.x's minimum: its own driver runs it)
    assert v("11.0.3", "450.51.06")[0] == "ok" and v("11.0.2", "450.36.06")[0] == "error"
    # A release newer than the table: its major's minimum only; a major it lacks: no verdict.
    assert v("12.7.0", "525.60.13") == ("ok", v("12.7.0", "525.60.13")[1], "")
    assert "newer than the table" in v("12.7.0", "530.30.02")[1]
    assert v("14.0", H200_DRIVER) is None and v("10.2", "440.33") is None
    assert v(None, H200_DRIVER) is None and v("12.4", None) is None and v("12.4", "") is None


def probe(driver, cuda=None, torch_cuda=None):
    facts = {"image": NGC, "runtime": "podman", "error": None, "pull_error": None,
             "pulled": False, "digest": "sha256:" + "a" * 64, "cuda": cuda}
    return {"container": facts, "versions": {"driver": driver, "cuda": torch_cuda}}


def test_container_driver_names_the_host_whose_driver_is_too_old():
    ngc = cuda_driver.image_cuda(NGC_ENV)
    plain = {"version": "12.4.1", "compat": False}
    probes = {"n0": probe(H200_DRIVER, ngc), "n1": probe("535.104.05", ngc),
              "n2": probe("470.82.01", plain), "n3": probe(None, ngc),  # (no GPUs)
              "n4": probe("575.57.08", None, torch_cuda="13.0")}  # (no CUDA_VERSION: torch's)
    got = {r["host"]: (r["ok"], r["severity"]) for r in container_checks(probes, "n0", "nccl")
           if r["id"] == "container.driver"}
    assert got == {"n0": (True, "info"), "n1": (False, WARNING), "n2": (False, ERROR),
                   "n4": (False, ERROR)}
    [n2] = [r for r in container_checks(probes, "n0", "gloo")
            if r["id"] == "container.driver" and r["host"] == "n2"]
    assert n2["severity"] == WARNING and "upgrade the host's NVIDIA driver" in n2["hint"]


def test_the_image_probe_reads_the_images_env():
    calls = []

    def run(argv, timeout_s=None, data=None):
        calls.append(argv)
        if argv[-2:] == ["{{json .Config.Env}}", NGC]:
            return NGC_ENV + "\n", None
        return ("sha256:" + "a" * 64 + "\n" if argv[1] == "image" else ""), None

    facts = image.probe(NGC, "podman", run, which=lambda r: "/usr/bin/" + r)
    assert facts["cuda"] == {"version": "12.4.1.003", "compat": True}
    assert container.env_argv("podman", NGC) in calls
    assert container.env_argv("apptainer", "/i.sif") is None


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=300), st.lists(st.text(max_size=40)).map(json.dumps),
                 st.lists(st.text(max_size=30).map(lambda t: "CUDA_VERSION=" + t)).map(json.dumps)),
       st.text(max_size=40), st.booleans())
def test_hostile_env_and_driver_strings_never_raise(env, driver, compat):
    facts = cuda_driver.image_cuda(env)
    assert facts is None or cuda_driver.parse_version(facts["version"]) is not None
    for cuda in (facts and facts["version"], env[:40], driver):
        got = cuda_driver.verdict(cuda, driver, compat)
        assert got is None or got[0] in ("ok", "warning", "error")


def test_a_driver_is_named_as_nvidia_writes_it_with_its_leading_zero():
    # (560.28.03 is CUDA 12.6 GA's driver; "560.28.3" is no driver anyone can install)
    level, detail, fix = cuda_driver.verdict("12.6.0", "555.42.06", False)
    assert level == "warning" and "below CUDA 12.6.0's driver 560.28.03," in detail
    assert fix.startswith("upgrade the host's NVIDIA driver to 560.28.03 or later")
