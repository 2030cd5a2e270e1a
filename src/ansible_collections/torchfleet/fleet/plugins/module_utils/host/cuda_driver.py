"""The host's NVIDIA driver against the image's CUDA (container.driver): NVIDIA's minimum driver
per CUDA release, kept here as data, the image's CUDA as its env declares it, and the verdict.

The data, read 2026-12-07 from NVIDIA's CUDA Toolkit Release Notes
(https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html, "CUDA Toolkit and
Corresponding Driver Versions": the "Toolkit Driver Version" column for Linux x86_64, and
"CUDA Toolkit and Minimum Required Driver Version for CUDA Minor Version Compatibility") and
NVIDIA's CUDA Compatibility guide (https://docs.nvidia.com/deploy/cuda-compatibility/: minor
version compatibility, forward compatibility). Update both tables from those pages when a CUDA
release is added; a release missing here is judged by its major's minimum only.

What the tables mean for a run (the CUDA Compatibility guide):
- From CUDA 11 on, an application built with any CUDA X.y runs on a driver at or above the
  major's minimum (MINOR_COMPAT_MIN) with a limited feature set ("minor version
  compatibility"): what needs the newer driver fails, e.g. PTX the driver's JIT cannot
  compile (a kernel built as PTX for the newer toolkit) -> a warning.
- Below the major's minimum CUDA does not start (cudaErrorInsufficientDriver, torch's
  "The NVIDIA driver on your system is too old") -> an error, unless the image carries the
  forward-compatibility package (cuda-compat: NGC's PyTorch images and nvidia/cuda's images
  do). It works only on data-center GPUs (and select NGC-ready RTX SKUs), only from driver
  branches NVIDIA supports for it, and not for every feature -> a warning that says so.
"""
from __future__ import annotations

import json
import re

SOURCE = "https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html"
COMPAT_SOURCE = "https://docs.nvidia.com/deploy/cuda-compatibility/"
READ_ON = "2026-12-07"

# "CUDA Toolkit and Minimum Required Driver Version for CUDA Minor Version Compatibility"
# (Linux x86_64): any X.y of the major runs on these, with minor version compatibility's limits.
MINOR_COMPAT_MIN = {11: "450.80.02", 12: "525.60.13", 13: "580"}

# "CUDA Toolkit and Corresponding Driver Versions", Toolkit Driver Version, Linux x86_64: the
# driver each release ships with and needs for all of its features. Keyed by the release's
# version as images declare it (CUDA_VERSION=12.4.1: 12.4 Update 1; 11.0's GA was 11.0.2).
TOOLKIT_DRIVER = {
    "13.0.2": "580.95.05", "13.0.1": "580.82.07", "13.0.0": "580.65.06",
    "12.9.1": "575.57.08", "12.9.0": "575.51.03",
    "12.8.1": "570.124.06", "12.8.0": "570.26",
    "12.6.3": "560.35.05", "12.6.2": "560.35.03", "12.6.1": "560.35.03", "12.6.0": "560.28.03",
    "12.5.1": "555.42.06", "12.5.0": "555.42.02",
    "12.4.1": "550.54.15", "12.4.0": "550.54.14",
    "12.3.2": "545.23.08", "12.3.1": "545.23.08", "12.3.0": "545.23.06",
    "12.2.2": "535.104.05", "12.2.1": "535.86.09", "12.2.0": "535.54.03",
    "12.1.1": "530.30.02", "12.1.0": "530.30.02",
    "12.0.1": "525.85.12", "12.0.0": "525.60.13",
    "11.8.0": "520.61.05",
    "11.7.1": "515.65.01", "11.7.0": "515.43.04",
    "11.6.2": "510.47.03", "11.6.1": "510.47.03", "11.6.0": "510.39.01",
    "11.5.2": "495.29.05", "11.5.1": "495.29.05", "11.5.0": "495.29.05",
    "11.4.4": "470.82.01", "11.4.3": "470.82.01", "11.4.2": "470.57.02", "11.4.1": "470.57.02",
    "11.4.0": "470.42.01",
    "11.3.1": "465.19.01", "11.3.0": "465.19.01",
    "11.2.2": "460.32.03", "11.2.1": "460.32.03", "11.2.0": "460.27.03",
    "11.1.1": "455.32", "11.1.0": "455.23",
    "11.0.3": "450.51.06", "11.0.2": "450.51.05",
}

# The env an image declares its CUDA with (NVIDIA's nvidia/cuda Dockerfiles and the NGC images
# built on them): CUDA_VERSION=12.4.1 (NGC: 12.4.1.003). The forward-compatibility package's
# marks: nvidia/cuda's NV_CUDA_COMPAT_PACKAGE=cuda-compat-12-4, NGC's CUDA_DRIVER_VERSION (the
# driver its compat libraries come from, 550.54.15 in pytorch:24.05-py3) and
# _CUDA_COMPAT_PATH=/usr/local/cuda/compat (what NGC's entrypoint puts on the library path).
VERSION_KEY = "CUDA_VERSION"
COMPAT_KEYS = ("NV_CUDA_COMPAT_PACKAGE", "CUDA_DRIVER_VERSION", "_CUDA_COMPAT_PATH")
ENV_READ_CHARS = 1 << 16  # (an image's env is a few KiB; more is not an env)
_VERSION = re.compile(r"\s*(\d{1,6})((?:\.\d{1,6}){0,3})")


def parse_version(text):
    """(major, minor, ...) of the leading dotted number of `text` ("550.54.15", "12.4.1.003",
    torch's "12.4", nvidia-smi's "580.159.04"), or None."""
    m = _VERSION.match(text) if isinstance(text, str) else None
    if not m:
        return None
    return (int(m.group(1)),) + tuple(int(p) for p in m.group(2).split(".")[1:])


def image_cuda(env_json):
    """{"version", "compat"} from `podman/docker image inspect --format {{json .Config.Env}}`'s
    output (a JSON list of KEY=VALUE), or None where it declares no CUDA. Never raises."""
    try:
        env = json.loads(env_json[:ENV_READ_CHARS]) if isinstance(env_json, str) else None
    except ValueError:
        return None
    if not isinstance(env, list):
        return None
    pairs = dict(e.split("=", 1) for e in env if isinstance(e, str) and "=" in e)
    version = pairs.get(VERSION_KEY, "").strip()[:40]
    if parse_version(version) is None:
        return None
    return {"version": version, "compat": any(pairs.get(k) for k in COMPAT_KEYS)}


def _fmt(version):
    return ".".join(str(p) for p in version)


def _fmt_driver(version):
    """A driver version as NVIDIA writes it: the third part in two digits (560.28.03)."""
    return ".".join(("%02d" if i == 2 else "%d") % p for i, p in enumerate(version))


def toolkit_driver(cuda):
    """(release, driver) of the Toolkit Driver Version row for `cuda` (a version tuple): the
    exact release, else the latest listed update of that X.y at or below it (an X.y with no
    update given, as torch's "12.4": the X.y's GA); None for an X.y not in the table."""
    rows = sorted((parse_version(k), parse_version(v)) for k, v in TOOLKIT_DRIVER.items())
    same = [r for r in rows if r[0][:2] == cuda[:2]]
    below = [r for r in same if r[0] <= cuda + (0,) * (3 - len(cuda))]
    return (below or same[:1] or [None])[-1]


def verdict(cuda_text, driver_text, compat=False):
    """(level, detail, fix) for the image's CUDA (`cuda_text`: CUDA_VERSION or torch's
    version.cuda) on this host's driver (nvidia-smi's driver_version): level "ok", "warning"
    or "error"; None where either cannot be read or the major is not in the tables."""
    cuda, driver = parse_version(cuda_text), parse_version(driver_text)
    if cuda is None or driver is None or len(cuda) < 2 or cuda[0] not in MINOR_COMPAT_MIN:
        return None
    row = toolkit_driver(cuda)
    # (11.0 shipped with 450.51, before 11.x's minor-compatibility minimum 450.80.02: a release
    # always runs on its own driver)
    major_min = min(parse_version(MINOR_COMPAT_MIN[cuda[0]]), row[1] if row else (1 << 30,))
    here = "driver %s, image CUDA %s" % (driver_text.strip(), cuda_text.strip())
    upgrade = ("upgrade the host's NVIDIA driver to %s or later, or use an image built for "
               "an older CUDA" % _fmt_driver(row[1] if row else major_min))
    if driver < major_min:
        if compat:
            return ("warning", "%s: below CUDA %d.x's minimum %s; the image carries the CUDA "
                    "forward-compatibility libraries (cuda-compat), which work only on "
                    "data-center GPUs and from the driver branches NVIDIA supports for them "
                    "(%s), else CUDA fails to initialise" % (here, cuda[0], _fmt_driver(major_min),
                                                             COMPAT_SOURCE), upgrade)
        return ("error", "%s: below CUDA %d.x's minimum driver %s (%s, read %s): CUDA cannot "
                "start in the image" % (here, cuda[0], _fmt_driver(major_min), SOURCE, READ_ON),
                upgrade)
    if row is not None and driver < row[1]:
        return ("warning", "%s: below CUDA %s's driver %s, above CUDA %d.x's minimum %s: runs "
                "by minor version compatibility, where what needs the newer driver fails "
                "(PTX built for CUDA %s that the driver's JIT cannot compile)"
                % (here, _fmt(row[0]), _fmt_driver(row[1]), cuda[0], MINOR_COMPAT_MIN[cuda[0]],
                   _fmt(cuda[:2])), upgrade)
    return ("ok", "%s: at or above %s" % (
        here, "CUDA %s's driver %s" % (_fmt(row[0]), _fmt_driver(row[1])) if row else
        "CUDA %d.x's minimum %s (CUDA %s is newer than the table read %s)"
        % (cuda[0], MINOR_COMPAT_MIN[cuda[0]], _fmt(cuda[:2]), READ_ON)), "")
