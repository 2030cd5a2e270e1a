"""The run's image on one host (container_image), as node_probe reads it for preflight: the
runtime that works, the image present or pulled, its id, and the argv that runs a command in
it (the Python probe then reads the image's torch, not the host's). The command lines are
run/container.py's."""
from __future__ import annotations

import os
import shutil

from ansible_collections.torchfleet.fleet.plugins.module_utils.run import container

# The longest one host's pull may take (every host pulls at once, in its own probe): an NGC
# PyTorch image is about 10 GB.
PULL_TIMEOUT_S = 1800.0
RUNTIME_TIMEOUT_S = 20.0


def probe(image, runtime, run, which=shutil.which, pull_timeout_s=PULL_TIMEOUT_S):
    """{"runtime", "error" (container.runtime's), "pull_error" (container.pull's), "pulled",
    "digest"} for this host; `run` is command.bounded's runner."""
    out = {"image": image, "runtime": None, "error": None, "pull_error": None, "pulled": False,
           "digest": None}
    chosen = container.resolve(runtime, lambda r: which(r) is not None)
    if chosen is None:
        out["error"] = "none of %s is installed here" % ", ".join(container.RUNTIMES)
        return out
    out["runtime"] = chosen
    if which(chosen) is None:
        out["error"] = "%s is not installed here" % chosen
        return out
    _text, why = run(container.version_argv(chosen), timeout_s=RUNTIME_TIMEOUT_S)
    if why is not None:
        out["error"] = "%s does not work for this user: %s" % (chosen, str(why)[:300])
        return out
    present = container.present_argv(chosen, image)
    if present is None:  # a file (.sif, .sqsh) or apptainer's docker:// (pulled at its exec)
        if "://" not in image and not os.path.isfile(image):
            out["pull_error"] = "%s does not exist here" % image
        return out
    if run(present, timeout_s=RUNTIME_TIMEOUT_S)[1] is not None:
        _text, why = run(container.pull_argv(chosen, image), timeout_s=pull_timeout_s)
        if why is not None:
            out["pull_error"] = "not here, and %s pull failed: %s" % (chosen, str(why)[:300])
            return out
        out["pulled"] = True
    text, why = run(container.digest_argv(chosen, image), timeout_s=RUNTIME_TIMEOUT_S)
    out["digest"] = text.strip() if why is None and text else None
    return out


def wrapper(facts, mounts=(), options=()):
    """A function argv -> argv that runs a command in the image, or None where it cannot be
    (no working runtime or image, enroot: the probe then reads nothing of the image)."""
    if facts is None or facts["error"] or facts["pull_error"]:
        return None
    runtime, image = facts["runtime"], facts["image"]
    if container.in_image_argv(runtime, image, []) is None:
        return None
    return lambda argv: container.in_image_argv(runtime, image, argv, mounts, options)
