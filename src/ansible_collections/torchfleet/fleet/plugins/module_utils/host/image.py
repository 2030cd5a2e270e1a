"""The run's image on one host (container_image), as node_probe reads it for preflight: the
runtime that works, the image present or pulled, its id, and the argv that runs a command in
it (the Python probe then reads the image's torch, not the host's). The command lines are
run/container.py's."""
from __future__ import annotations

import contextlib
import os
import random
import re
import secrets
import shutil
import socket
import time

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.host import cuda_driver
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import container

PULL_TIMEOUT_S = defaults.CONTAINER_PULL_TIMEOUT_S
RUNTIME_TIMEOUT_S = 20.0
CREATE_TIMEOUT_S = defaults.CONTAINER_CREATE_TIMEOUT_S
# A registry answering many hosts' pulls at once refuses some for a moment (429 Too Many
# Requests, a 5xx, a reset connection): such a pull is tried again, after 10-20 s times the
# try (jittered, so the hosts do not come back together), while a minute of the pull's time is
# left; an error that says the image is not there or not allowed (401, 404) is not.
PULL_TRIES = 3
PULL_BACKOFF_S = (10.0, 20.0)
PULL_TRANSIENT = re.compile(r"(?:status|code|HTTP)\D{0,20}(?:429|50[0234])\b|too many requests|"
                            r"bad gateway|gateway timeout|connection reset|"
                            r"unexpected eof|i/o timeout|tls handshake timeout|"
                            r"temporarily unavailable|service unavailable", re.I)


def probe(image, runtime, run, which=shutil.which, pull_timeout_s=PULL_TIMEOUT_S,
          enroot_images=container.ENROOT_IMAGES):
    """{"runtime", "installed" (the runtimes auto could take here), "error"
    (container.runtime's), "pull_error" (container.pull's), "pulled" (pulled, imported, or
    loaded from an archive), "local" (the name podman or docker know it by:
    container.local_image), "digest", "cuda" (the CUDA its env declares: container.driver)}
    for this host; `run` is command.bounded's runner; enroot_images: where enroot's imports of
    references are kept."""
    out = {"image": image, "runtime": None, "error": None, "pull_error": None, "pulled": False,
           "local": None, "digest": None, "cuda": None}
    # (with auto, the runtimes installed here: preflight compares them across hosts)
    out["installed"] = [r for r in container.candidates(image) if which(r) is not None]
    chosen = container.resolve(runtime, lambda r: which(r) is not None, image)
    if chosen is None:
        out["error"] = "none of %s is installed here" % ", ".join(container.candidates(image))
        return out
    out["runtime"] = chosen
    if which(chosen) is None:
        out["error"] = "%s is not installed here" % chosen
        return out
    _text, why = run(container.version_argv(chosen), timeout_s=RUNTIME_TIMEOUT_S)
    if why is not None:
        out["error"] = "%s does not work for this user: %s" % (chosen, str(why)[:300])
        return out
    if chosen == "enroot":
        return _enroot_pull(out, image, run, pull_timeout_s, enroot_images)
    local = out["local"] = container.local_image(chosen, image)
    present = container.present_argv(chosen, local) if local else None
    if present is None:  # a file: a .sif, or an archive that is not a regular file here
        if not os.path.isfile(image):
            out["pull_error"] = "%s is not a file here" % image
        return out
    if run(present, timeout_s=RUNTIME_TIMEOUT_S)[1] is not None:
        why = (load if container.archive(chosen, image) else pull)(
            chosen, image, local, run, pull_timeout_s)
        if why is not None:
            out["pull_error"] = why
            return out
        out["pulled"] = True
    text, why = run(container.digest_argv(chosen, local), timeout_s=RUNTIME_TIMEOUT_S)
    out["digest"] = text.strip() if why is None and text else None
    text, why = run(container.env_argv(chosen, local), timeout_s=RUNTIME_TIMEOUT_S)
    out["cuda"] = cuda_driver.image_cuda(text) if why is None else None
    return out


def pull(runtime, image, _local, run, timeout_s, sleep=time.sleep, clock=time.monotonic):
    """Pulls a reference, again after a registry's passing refusal (PULL_TRANSIENT) within
    timeout_s in all; why not (the registry's last error), or None."""
    end, tries = clock() + timeout_s, 0
    while True:
        tries += 1
        left = timeout_s if tries == 1 else max(1.0, end - clock())
        _text, why = run(container.pull_argv(runtime, image), timeout_s=left)
        if why is None:
            return None
        wait = random.uniform(*PULL_BACKOFF_S) * tries
        if tries >= PULL_TRIES or not PULL_TRANSIENT.search(str(why)[:2000]) \
                or end - clock() - wait < 60:
            return "not here, and %s pull failed%s: %s" % (
                runtime, " %d times" % tries if tries > 1 else "", str(why)[:300])
        sleep(wait)


def load(runtime, path, local, run, timeout_s):
    """Loads an archive and tags what it loaded `local` (container.local_image: what the agent
    starts); why not (the runtime's own error), or None."""
    text, why = run(container.load_argv(runtime, path), timeout_s=timeout_s)
    if why is not None:
        return "not loaded here, and %s load failed: %s" % (runtime, str(why)[:300])
    ref = container.loaded_ref(text)
    if ref is None:
        return "%s load named no image it loaded: %r" % (runtime, (text or "")[:200])
    _text, why = run(container.tag_argv(runtime, ref, local), timeout_s=RUNTIME_TIMEOUT_S)
    if why is not None:
        return "loaded as %s, but %s tag failed: %s" % (ref, runtime, str(why)[:300])
    return None


def _enroot_pull(out, image, run, timeout_s, cache_dir):
    """enroot's image on this host: a squashfs file that must be here, or a registry
    reference imported once into cache_dir (container.enroot_image's file; a later probe
    finds it there)."""
    path = container.enroot_image(image, cache_dir)
    if os.path.isfile(path):
        return out
    if not container.pull_argv("enroot", image):
        out["pull_error"] = "%s does not exist here" % image
        return out
    # Imported beside under a name of this probe's own, then renamed: enroot refuses an
    # output that exists, and a cut-off import (the timeout) never passes for the image.
    # (host, pid and a token: on a shared home (NFS) the first fork batch's hosts import
    # together, and two of them may share a pid; each renames a whole file of its own)
    part = "%s.%s.%d.%s.part" % (path, socket.gethostname(), os.getpid(), secrets.token_hex(4))
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    except OSError as exc:
        out["pull_error"] = "cannot make %s for enroot's import: %s" % (
            os.path.dirname(path), exc.strerror or exc)
        return out
    _text, why = run(container.pull_argv("enroot", image, output=part), timeout_s=timeout_s)
    if why is None:
        try:
            os.replace(part, path)
        except OSError as exc:
            why = "its file %s: %s" % (part, exc.strerror or exc)
    if why is not None:
        with contextlib.suppress(OSError):
            os.unlink(part)
        out["pull_error"] = "not in %s, and enroot import failed: %s" % (
            os.path.dirname(path), str(why)[:300])
        return out
    out["pulled"] = True
    return out


def runner(facts, run, mounts=(), options=()):
    """A runner like `run` (argv, timeout_s) -> (stdout, why) that runs argv in the image, or
    None where it cannot be (no working runtime or image). enroot's is a container of its
    own per call, created first and removed after, whatever became of the command (it failed,
    timed out, or raised)."""
    if facts is None or facts["error"] or facts["pull_error"]:
        return None
    runtime, image = facts["runtime"], facts.get("local") or facts["image"]
    if runtime not in container.RUNTIMES:
        return None

    def in_image(argv, timeout_s=RUNTIME_TIMEOUT_S):
        cname = container.probe_name(socket.gethostname(), os.getpid(), secrets.token_hex(4))
        create = container.create_argv(runtime, image, cname)
        try:
            if create is not None:
                _out, why = run(create, timeout_s=CREATE_TIMEOUT_S)
                if why is not None:
                    return None, "%s cannot make a container from %s: %s" % (
                        runtime, create[-1], why)
            return run(container.in_image_argv(runtime, image, argv, mounts, options, cname),
                       timeout_s=timeout_s)
        finally:
            remove = container.remove_argv(runtime, cname) if create is not None else None
            if remove is not None:
                run(remove, timeout_s=RUNTIME_TIMEOUT_S)
    return in_image


# Where CDI specs live (the CDI specification's default spec directories), and enroot's hook
# that gives a container the GPUs (enroot's own 98-nvidia.sh, which calls nvidia-container-cli).
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
ENROOT_GPU_HOOK = "/etc/enroot/hooks.d/98-nvidia.sh"
CDI_READ_BYTES = 1 << 20


def gpu_error(runtime, which=shutil.which, cdi_dirs=CDI_DIRS, enroot_hook=ENROOT_GPU_HOOK):
    """Why `runtime` cannot give a container this host's NVIDIA GPUs (container.gpu), or None:
    podman gives them by CDI (a spec of kind nvidia.com/gpu), docker's --gpus runs NVIDIA's
    nvidia-container-runtime-hook, enroot its nvidia hook (nvidia-container-cli); apptainer's
    --nv binds the host's driver libraries itself."""
    if runtime == "podman":
        for folder in cdi_dirs:
            try:
                names = sorted(os.listdir(folder))
            except OSError:
                continue
            for name in names:
                if not name.endswith((".yaml", ".yml", ".json")):
                    continue
                try:
                    with open(os.path.join(folder, name), "rb") as f:
                        if b"nvidia.com/gpu" in f.read(CDI_READ_BYTES):
                            return None
                except OSError:
                    continue
        return "no CDI spec of kind nvidia.com/gpu in %s" % " or ".join(cdi_dirs)
    if runtime == "docker" and which("nvidia-container-runtime-hook") is None:
        return "nvidia-container-runtime-hook (the NVIDIA Container Toolkit) is not installed"
    if runtime == "enroot":
        if which("nvidia-container-cli") is None:
            return "nvidia-container-cli (libnvidia-container) is not installed"
        if not os.path.isfile(enroot_hook):
            return "enroot's GPU hook %s is missing" % enroot_hook
    return None
