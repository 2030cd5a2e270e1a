"""Versions of the Python stack that torchrun will use, read without importing torch.

The snippet reads package metadata and torch/version.py of the host's `python`. It runs in
the module's own process when `python` is the interpreter running the module (the usual case:
one Python start less per host), else under `python`, printing one JSON object. Importing torch
would take seconds and, on GPU hosts, could initialise CUDA.
"""
from __future__ import annotations

import json
import os
import sys

from ansible_collections.torchfleet.fleet.plugins.module_utils.host.command import missing

# Leaves its answer in `out`.
SNIPPET = r"""
import importlib.metadata as md, importlib.util, json, os, re, sys
out = {"executable": sys.executable, "python_version": "%d.%d.%d" % sys.version_info[:3],
       "torch_version": None, "torch_cuda": None, "torch_hip": None, "nccl_version": None,
       "torch_path": None}
try:
    out["torch_version"] = md.version("torch")
except md.PackageNotFoundError:
    pass
spec = importlib.util.find_spec("torch") if out["torch_version"] else None
if spec and spec.submodule_search_locations:
    out["torch_path"] = list(spec.submodule_search_locations)[0]
    try:
        with open(os.path.join(out["torch_path"], "version.py")) as f:
            text = f.read()
        # __version__ as torch reports it ('2.11.0+cu130'; the package metadata says '2.11.0',
        # so two builds of one release would compare equal); a build for CUDA has no HIP.
        for key, field in (("__version__", "torch_version"), ("cuda", "torch_cuda"),
                           ("hip", "torch_hip")):
            m = re.search(r"^%s\s*(?::[^=]*)?=\s*'([^']+)'" % key, text, re.M)
            if m or field != "torch_version":
                out[field] = m.group(1) if m else None
    except OSError:
        pass
for dist in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
    try:
        out["nccl_version"] = md.version(dist)
        break
    except md.PackageNotFoundError:
        pass
"""

NCCL_HEADER = "/usr/include/nccl.h"


def probe_python(python, run, timeout_s=20, in_image=None):
    """SNIPPET's answer for `python`, or {"error": "..."} when it cannot run; `run` is the
    module's command runner (command.bounded). in_image: a runner like `run` that runs the
    argv in the run's container image (host/image.py's runner), whose Python the ranks will
    use."""
    # Not resolved through symlinks: a venv's python links to the base interpreter but sees
    # other packages.
    if in_image is None and os.path.abspath(python) == os.path.abspath(sys.executable):
        scope: dict = {}
        exec(SNIPPET, scope)  # noqa: S102 (our own constant)
        return scope["out"]
    argv = [python, "-c", SNIPPET + "print(json.dumps(out))"]
    out, err = (in_image or run)(argv, timeout_s=timeout_s)
    where = " in the image" if in_image else ""
    if out is None:
        return {"error": "%s: no such interpreter%s" % (python, where) if missing(err)
                else "%s%s failed: %s" % (python, where, err)}
    try:  # (an image's entrypoint may print a banner first: the answer is the last line)
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": "%s%s printed no answer: %s" % (python, where, out.strip()[-200:])}


def parse_nccl_header(text):
    """NCCL version 'major.minor.patch' from nccl.h, or None."""
    parts = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[0] == "#define" and fields[1] in (
                "NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH"):
            parts[fields[1]] = fields[2]
    if len(parts) != 3:
        return None
    return "%s.%s.%s" % (parts["NCCL_MAJOR"], parts["NCCL_MINOR"], parts["NCCL_PATCH"])
