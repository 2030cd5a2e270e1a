"""Versions of the Python stack that torchrun will use, read without importing torch.

The snippet runs under the host's `python` (which may not be the interpreter running the
module), reads package metadata and torch/version.py, and prints one JSON object. Importing
torch would take seconds and, on GPU hosts, could initialise CUDA.
"""
from __future__ import annotations

import json
import subprocess

SNIPPET = r"""
import importlib.metadata as md, importlib.util, json, os, re, sys
out = {"executable": sys.executable, "python_version": "%d.%d.%d" % sys.version_info[:3],
       "torch_version": None, "torch_cuda": None, "nccl_version": None, "torch_path": None}
try:
    out["torch_version"] = md.version("torch")
except md.PackageNotFoundError:
    pass
spec = importlib.util.find_spec("torch") if out["torch_version"] else None
if spec and spec.submodule_search_locations:
    out["torch_path"] = list(spec.submodule_search_locations)[0]
    try:
        with open(os.path.join(out["torch_path"], "version.py")) as f:
            m = re.search(r"^cuda\s*(?::[^=]*)?=\s*'([^']+)'", f.read(), re.M)
        out["torch_cuda"] = m.group(1) if m else None
    except OSError:
        pass
for dist in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
    try:
        out["nccl_version"] = md.version(dist)
        break
    except md.PackageNotFoundError:
        pass
print(json.dumps(out))
"""

NCCL_HEADER = "/usr/include/nccl.h"


def probe_python(python, timeout_s=20):
    """Run SNIPPET under `python`; return its dict, or {"error": "..."} when it cannot run."""
    try:
        proc = subprocess.run([python, "-c", SNIPPET], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except FileNotFoundError:
        return {"error": "%s: no such interpreter" % python}
    except subprocess.TimeoutExpired:
        return {"error": "%s did not answer within %d s" % (python, timeout_s)}
    if proc.returncode != 0:
        return {"error": "%s failed: %s" % (python, proc.stderr.strip()[-300:])}
    return json.loads(proc.stdout)


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
