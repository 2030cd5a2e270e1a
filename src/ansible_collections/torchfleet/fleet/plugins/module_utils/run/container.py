"""The run's container (container_image): every command line a runtime gets, built here once.

Pure functions of the run's settings: argv lists, never shell strings (local_image() alone
reads the host: a stat of an archive). The agent starts torchrun through run_argv() and removes
the container with remove_argv(); preflight probes the image with present_argv(), pull_argv()
or load_argv() and tag_argv(), digest_argv() and in_image_argv(); every one of them is given
local_image()'s name, never container_image itself. docs/containers.md shows each line as
built here (tests/unit/test_container.py holds them).

What every runtime gets (what a multi-node run needs, as SkyPilot, pyxis and apptainer give it):
the host's network and IPC (NCCL's shared memory, gloo's and torch's ports on the host's
addresses), an unlimited memlock (RDMA registers memory), the GPUs, /dev/infiniband with
network ib, the run's environment by name (values come from the runtime's own environment, so
no value is on a command line), the run's paths mounted at the same paths, and the container
named torchfleet-<run_id>-<host> so stop paths find and remove exactly this run's container.

podman and docker run the container under their own daemon/conmon: the agent's child is their
client, and the container's first process (torchrun) is found by name (pid_argv). apptainer
and enroot run torchrun as a process of the host's own tree (no daemon), so stopping the
agent's process tree stops them, and there is nothing more to remove for apptainer; torchrun
is found below the agent's child (procs.find_torchrun).

enroot takes a squashfs file or, as pyxis does, a registry reference (nvcr.io#nvidia/pytorch:
24.05-py3, docker://...): preflight's probe imports a reference once per host into
ENROOT_IMAGES, and every container is created from that file (enroot_image()).
"""
from __future__ import annotations

import hashlib
import os
import re
import stat as statmod

RUNTIMES = ("podman", "docker", "apptainer", "enroot")
AUTO = "auto"
NAME_PREFIX = "torchfleet-"
# Container names: docker's and podman's [a-zA-Z0-9][a-zA-Z0-9_.-]*; enroot's are file names.
_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]")
# The environment the GPU hooks read (enroot's nvidia hook, NVIDIA's container toolkit).
GPU_ENV = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
APPTAINER_ENV_PREFIX = "APPTAINERENV_"
IB_DEVICE = "/dev/infiniband"
# Where podman and docker keep an image loaded from an archive (container_image=/path/x.tar):
# a tag of its own per archive file, so the agent and preflight find it without loading again.
ARCHIVE_REPO = "localhost/torchfleet-archive"
# What `podman load` / `docker load` print for each image they load (podman 4: "Loaded image:
# NAME", one line a name; podman 1-3: "Loaded image(s): A,B"; docker: "Loaded image: NAME", or
# "Loaded image ID: sha256:..." for an image saved by id).
_LOADED = re.compile(r"^Loaded image(?:\(s\)| ID)?: *(.+)$")
# A name or id the load printed, as it may stand in a tag command's argv (no option, no space).
_REF_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,255}$")
LOAD_OUTPUT_BYTES = 64 << 10
# Where container_runtime=enroot keeps what it imports from a registry reference: one .sqsh
# per reference, in the run's user's own cache (beside enroot's ${XDG_CACHE_HOME}/enroot,
# where enroot keeps the layers it downloads).
ENROOT_IMAGES = "~/.cache/torchfleet/enroot"
# The schemes pyxis hands to `enroot import` as given; any other reference gets docker://.
ENROOT_SCHEMES = ("docker://", "dockerd://")
ENROOT_FILES = (".sqsh", ".squashfs")
# What the image's Python probe gives enroot's GPU hook: nothing (it needs no GPU, and a host
# without nvidia-container-cli still reads its image; NGC's images set NVIDIA_VISIBLE_DEVICES).
PROBE_ENV = ["NVIDIA_VISIBLE_DEVICES=void"]


def name(run_id, host, attempt=0):
    """The container's name: torchfleet-<run_id>-<host>[-a<attempt>] (a later attempt's own:
    an earlier attempt's container may still be being removed)."""
    raw = "%s%s-%s%s" % (NAME_PREFIX, run_id, host, "-a%d" % attempt if attempt else "")
    return _NAME_BAD.sub("_", raw)


def probe_name(host, pid, token):
    """The name of preflight's throwaway probe container (enroot): its own per host, probe
    process and call, so two probes never share one and stop paths still know the prefix."""
    return _NAME_BAD.sub("_", "%sprobe-%s-%d-%s" % (NAME_PREFIX, host, pid, token))


def enroot_is_file(image):
    """Whether container_image names a squashfs file for enroot (a path, as pyxis takes it),
    not a registry reference."""
    return image.startswith(("/", "./", "../")) or image.endswith(ENROOT_FILES)


def enroot_uri(image):
    """What `enroot import` takes for a registry reference, as pyxis builds it:
    [USER@][REGISTRY#]IMAGE[:TAG] gets docker://; docker:// and dockerd:// are kept. A
    reference written as docker writes it (nvcr.io/nvidia/pytorch:24.05-py3: a first part with
    a dot or a port, or localhost, is the registry) gets enroot's '#' after its registry: enroot
    reads everything before a '#' as the registry and sends a reference without one to
    Docker Hub (registry-1.docker.io), where nvcr.io/nvidia/... does not exist."""
    if image.startswith(ENROOT_SCHEMES):
        return image
    first, slash, rest = image.partition("/")
    if "#" not in image and slash and first in ("docker.io", "index.docker.io"):
        image = rest  # (Docker Hub: enroot's own default registry, registry-1.docker.io)
    elif "#" not in image and slash and ("." in first or ":" in first or first == "localhost"):
        image = "%s#%s" % (first, rest)
    return "docker://" + image


def enroot_image(image, cache_dir=ENROOT_IMAGES):
    """The squashfs file enroot creates the container from (every caller goes through here:
    the probe's import and its container, the agent's): container_image itself where it is a
    file, else the file the probe's import writes in cache_dir, named after the reference
    (readable: nvcr.io+nvidia+pytorch+24.05-py3) and a hash of it (two references whose
    readable names agree never share a file)."""
    if enroot_is_file(image):
        return image
    uri = enroot_uri(image)
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "+", uri.split("://", 1)[1]).strip("+.")[:100]
    return os.path.join(os.path.expanduser(cache_dir), "%s-%s.sqsh" % (
        readable, hashlib.sha256(uri.encode()).hexdigest()[:12]))


def parse_mount(entry):
    """(host path, container path) of one container_mounts entry: a path (mounted at the same
    path) or host:container; None when it is neither (two absolute paths at most)."""
    if not isinstance(entry, str) or not entry:
        return None
    parts = entry.split(":")
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2 or not all(os.path.isabs(p) for p in parts):
        return None
    return tuple(os.path.normpath(p) for p in parts)


def mounts(paths, extra=()):
    """The run's mounts: each of `paths` (code_dir, data_paths, checkpoint_dir, the script's
    directory, the run's directory: absolute paths, '' skipped) at the same path, then
    container_mounts; each container path once, the first entry for it kept."""
    out, seen = [], set()
    for pair in [(os.path.normpath(p),) * 2 for p in paths if p and os.path.isabs(p)] + [
            parse_mount(e) for e in extra]:
        if pair is not None and pair[1] not in seen:
            seen.add(pair[1])
            out.append(pair)
    return out


def validate(image, runtime, container_mounts, options):
    """One sentence for the first wrong container setting (the thing and its fix; the caller
    names the host or the controller), or None. Without an image the others are not read."""
    if not image:
        return None
    if runtime not in RUNTIMES + (AUTO,):
        return ("container_runtime=%r is not one of %s; set one of them or leave it %s"
                % (runtime, ", ".join(RUNTIMES), AUTO))
    if not isinstance(image, str) or image.startswith("-") or any(c.isspace() for c in image):
        return ("container_image=%r is not an image reference or archive path; set it like "
                "nvcr.io/nvidia/pytorch:24.05-py3, /path/image.tar (podman save, docker save), "
                "/path/image.sif or /path/image.sqsh" % (image,))
    if runtime == "apptainer" and not image.endswith(".sif"):
        # (apptainer exec docker://... converts the image at every start, minutes for an NGC
        # image: past preflight's probe timeout, and on every host at once inside the join)
        return ("container_runtime=apptainer starts a .sif file, not %r; run `apptainer pull "
                "/path/image.sif docker://IMAGE` once (shared storage, or on each host) and set "
                "container_image to the .sif" % (image,))
    if runtime in ("podman", "docker") and image.endswith((".sif", ".sqsh")):
        return ("container_runtime=%s loads archives of `podman save` or `docker save`, not %r; "
                "set container_runtime=%s or give the image's reference"
                % (runtime, image, "apptainer" if image.endswith(".sif") else "enroot"))
    if runtime == "enroot" and (image.endswith(".sif") or "://" in image
                                and not image.startswith(ENROOT_SCHEMES)):
        return ("container_runtime=enroot starts a squashfs file or imports a registry "
                "reference, not %r; set container_image like nvcr.io#nvidia/pytorch:24.05-py3 "
                "(as pyxis takes it) or /path/image.sqsh" % (image,))
    if not isinstance(container_mounts, list):
        return "container_mounts must be a list of paths or host:container pairs"
    for entry in container_mounts:
        if parse_mount(entry) is None:
            return ("container_mounts entry %r is not an absolute path or an "
                    "/host/path:/container/path pair; fix or remove it" % (entry,))
    if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
        return "container_options must be a list of strings (one argument each)"
    return None


# The runtimes that can start an image of this form at all: a .sif is apptainer's, a .sqsh
# enroot's (auto must not hand either to podman because podman comes first).
FILE_RUNTIMES = {".sif": ("apptainer",), ".sqsh": ("enroot",), ".squashfs": ("enroot",)}


def candidates(image):
    """The runtimes, in auto's order, that can start `image`: apptainer a .sif only
    (validate() says why)."""
    for suffix, runtimes in FILE_RUNTIMES.items():
        if isinstance(image, str) and image.endswith(suffix):
            return runtimes
    return tuple(r for r in RUNTIMES if r != "apptainer")


def resolve(runtime, present, image=None):
    """The runtime to use: `runtime` itself, or with auto the first of the runtimes that can
    start `image` (candidates()) for which present(name) is true; None when auto finds none.
    Each host resolves its own; preflight's container.runtime fails the hosts whose choice is
    not the one every host can make (reports/preflight.py), so one runtime runs the run."""
    if runtime != AUTO:
        return runtime
    return next((r for r in candidates(image) if present(r)), None)


def archive(runtime, image):
    """Whether container_image is an archive that podman or docker loads (`podman save`,
    `docker save`: docker-archive or oci-archive): an absolute path; a reference never is."""
    return runtime in ("podman", "docker") and isinstance(image, str) and os.path.isabs(image)


def local_image(runtime, image, stat=os.stat):
    """The name the runtime knows container_image by: the reference itself, or for an archive
    (archive()) ARCHIVE_REPO:<hash of its path, size and mtime>, the tag preflight gives the
    image it loads; a changed archive has another name, so it is loaded again. None where the
    archive is not a regular file here. Every command line is given this name (the agent's
    run, preflight's presence, digest, env and in-image probe)."""
    if not archive(runtime, image):
        return image
    try:
        st = stat(image)
    except (OSError, ValueError):
        return None
    if not statmod.S_ISREG(st.st_mode):
        return None
    key = "%s\0%d\0%d" % (os.path.normpath(image), st.st_size, st.st_mtime_ns)
    return "%s:%s" % (ARCHIVE_REPO, hashlib.sha256(key.encode()).hexdigest()[:20])


def loaded_ref(text):
    """The first image `podman load` / `docker load` says it loaded (a name, or an id where
    the archive was saved by id), as it may stand in tag_argv; None where it names none.
    Reads at most LOAD_OUTPUT_BYTES of the output; never raises."""
    if not isinstance(text, str):
        return None
    for line in text[:LOAD_OUTPUT_BYTES].splitlines():
        found = _LOADED.match(line.strip())
        if found:
            ref = found.group(1).split(",")[0].strip()  # (podman 1-3: "A,B" on one line)
            return ref if _REF_OK.match(ref) else None
    return None


def _sets(options, flag):
    """Whether container_options give `flag` (as `--flag value` or `--flag=value`)."""
    return any(o == flag or o.startswith(flag + "=") for o in options)


def run_env(runtime, env, gpus):
    """(names passed into the container, the variables the runtime's process gets besides the
    agent's own): docker, podman and enroot copy each named variable from their environment;
    apptainer takes APPTAINERENV_<NAME> (with --cleanenv, so the host's PATH and
    LD_LIBRARY_PATH never reach the image)."""
    env = dict(env)
    if gpus and runtime == "enroot":  # enroot's nvidia hook runs where these are set
        env = dict(GPU_ENV, **env)
    if runtime == "apptainer":
        return [], {APPTAINER_ENV_PREFIX + k: v for k, v in env.items()}
    return sorted(env), env


def _limits(runtime, options):
    """What podman's and docker's containers of the run get besides its network, preflight's
    probe container too (so a host whose runtime refuses them fails preflight, not the launch):
    the host's IPC, unless a --shm-size or --ipc of yours replaces it (a cluster that forbids
    --ipc host; podman and docker refuse --shm-size beside it); an unlimited memlock (RDMA),
    unless a --ulimit of yours replaces it (a sandbox may refuse memlock=-1); and for podman no
    process cap, unless yours: podman caps a container at 2048 processes (containers.conf's
    pids_limit; threads count on cgroup v2), which 8 ranks with NCCL's and OpenMP's threads and
    DataLoader workers pass mid-epoch ("can't start new thread"); docker sets none."""
    argv = []
    if not (_sets(options, "--shm-size") or _sets(options, "--ipc")):
        argv += ["--ipc", "host"]
    if not _sets(options, "--ulimit"):
        argv += ["--ulimit", "memlock=-1"]
    if runtime == "podman" and not _sets(options, "--pids-limit"):
        argv += ["--pids-limit", "-1"]
    return argv


def run_argv(runtime, image, cname, command, env_names, run_mounts, options=(), gpus=False,
             ib=False, workdir=None):
    """The runtime's command line that runs `command` (torchrun's argv) in the image
    (podman's and docker's limits: _limits)."""
    options = list(options)
    if runtime in ("podman", "docker"):
        argv = [runtime, "run", "--rm", "--name", cname, "--network", "host"]
        argv += _limits(runtime, options)
        if gpus:
            argv += ["--gpus", "all"] if runtime == "docker" else ["--device", "nvidia.com/gpu=all"]
        if ib:
            argv += ["--device", IB_DEVICE]
        for key in env_names:
            argv += ["--env", key]
        for src, dst in run_mounts:
            argv += ["--volume", "%s:%s" % (src, dst)]
        if workdir:
            argv += ["--workdir", workdir]
        # The image's entrypoint (NGC's prints a banner, then execs its argv) is kept.
        return argv + options + [image] + list(command)
    if runtime == "apptainer":
        # exec shares the host's network, IPC and PID namespaces by default; /dev is the
        # host's (so /dev/infiniband is there) and limits are the agent's own (memlock).
        argv = ["apptainer", "exec", "--cleanenv"]
        if gpus:
            argv.append("--nv")
        for src, dst in run_mounts:
            argv += ["--bind", "%s:%s" % (src, dst)]
        if workdir:
            argv += ["--pwd", workdir]
        return argv + options + [image] + list(command)
    if runtime == "enroot":
        # enroot start shares the host's network, IPC and PID namespaces and /dev; the
        # container was made by create_argv. It has no working directory option: env -C.
        argv = ["enroot", "start", "--rw"]
        for key in env_names:
            argv += ["--env", key]
        for src, dst in run_mounts:
            argv += ["--mount", "%s:%s" % (src, dst)]
        argv += options + [cname]
        return argv + (["env", "-C", workdir] if workdir else []) + list(command)
    raise ValueError("unknown container runtime %r" % runtime)


def create_argv(runtime, image, cname, cache_dir=ENROOT_IMAGES):
    """What makes the container before run_argv or in_image_argv (enroot only: create from
    the squashfs, enroot_image's)."""
    if runtime == "enroot":
        return ["enroot", "create", "--force", "--name", cname, enroot_image(image, cache_dir)]
    return None


def remove_argv(runtime, cname):
    """What removes the run's container by name (None where its processes are the host's
    and nothing else is left: apptainer)."""
    if runtime == "podman":  # (--time 0: killed at once; the run's stop already waited)
        return ["podman", "rm", "--force", "--time", "0", cname]
    if runtime == "docker":  # (docker's rm --force kills at once)
        return ["docker", "rm", "--force", cname]
    if runtime == "enroot":
        return ["enroot", "remove", "--force", cname]
    return None


def pid_argv(runtime, cname):
    """Prints the host PID of the container's first process (torchrun): podman and docker."""
    if runtime in ("podman", "docker"):
        return [runtime, "inspect", "--format", "{{.State.Pid}}", cname]
    return None


def list_argv(runtime, prefix=NAME_PREFIX):
    """Names of the containers whose name starts with `prefix` (podman, docker, enroot)."""
    if runtime in ("podman", "docker"):
        return [runtime, "ps", "--all", "--filter", "name=^" + prefix, "--format", "{{.Names}}"]
    if runtime == "enroot":
        return ["enroot", "list"]
    return None


def version_argv(runtime):
    """A runtime's own answer that it works (docker's needs its daemon)."""
    if runtime == "docker":
        return ["docker", "info", "--format", "{{.ServerVersion}}"]
    return [runtime, "version"] if runtime != "enroot" else ["enroot", "version"]


def present_argv(runtime, image):
    """Succeeds when the image is on the host (None: apptainer and enroot files are paths,
    checked as files)."""
    if runtime in ("podman", "docker"):
        return [runtime, "image", "inspect", "--format", "{{.Id}}", image]
    return None


def pull_argv(runtime, image, output=None):
    """Brings the image to the host: podman's and docker's pull; enroot's import of a
    registry reference into `output` (the probe's temporary name, renamed to enroot_image's
    once complete: enroot refuses an output that exists, and a half-written file is never
    taken for the image)."""
    if runtime in ("podman", "docker"):
        return [runtime, "pull", "--quiet", image]
    if runtime == "enroot" and not enroot_is_file(image):
        return ["enroot", "import", "--output", output or enroot_image(image), enroot_uri(image)]
    return None


def load_argv(runtime, path):
    """Loads an archive (archive()) into the runtime's storage; its output names the image
    (loaded_ref())."""
    if runtime in ("podman", "docker"):
        return [runtime, "load", "--quiet", "--input", path]
    return None


def tag_argv(runtime, ref, local):
    """Gives the image the load named its local_image() name."""
    if runtime in ("podman", "docker"):
        return [runtime, "tag", ref, local]
    return None


def digest_argv(runtime, image):
    """Prints what identifies the image's content on a host: its id (the config's digest,
    the same wherever the same image is pulled or imported) for podman and docker."""
    if runtime in ("podman", "docker"):
        return [runtime, "image", "inspect", "--format", "{{.Id}}", image]
    return None


def env_argv(runtime, image):
    """Prints the image's env as a JSON list of KEY=VALUE (its CUDA_VERSION: container.driver)
    for podman and docker; apptainer and enroot images are read by the Python probe only."""
    if runtime in ("podman", "docker"):
        return [runtime, "image", "inspect", "--format", "{{json .Config.Env}}", image]
    return None


def in_image_argv(runtime, image, command, run_mounts=(), options=(), cname=None):
    """A throwaway container that runs `command` in the image (preflight's Python probe): no
    GPUs, the mounts read-only, nothing kept; container_options too (a host's runtime may need
    them for any container: --ulimit host, --security-opt). enroot starts `cname`, made by
    create_argv and removed by remove_argv around it (host/image.py's runner); podman and
    docker also get no network (enroot's --net is too recent to count on; the probe uses none)."""
    if runtime in ("podman", "docker"):
        argv = [runtime, "run", "--rm", "--network", "none"] + _limits(runtime, options)
        for src, dst in run_mounts:
            argv += ["--volume", "%s:%s:ro" % (src, dst)]
        return argv + list(options) + [image] + list(command)
    if runtime == "apptainer":  # (--bind src:dest:opts, opts ro or rw)
        argv = ["apptainer", "exec", "--cleanenv"]
        for src, dst in run_mounts:
            argv += ["--bind", "%s:%s:ro" % (src, dst)]
        return argv + list(options) + [image] + list(command)
    if runtime == "enroot":
        # The root filesystem is read-only without --rw; a mount is an fstab line with ':'
        # between its fields (its options as run_argv's default, rbind,x-create=auto, plus ro).
        argv = ["enroot", "start"]
        for pair in PROBE_ENV:
            argv += ["--env", pair]
        for src, dst in run_mounts:
            argv += ["--mount", "%s:%s:none:rbind,x-create=auto,ro" % (src, dst)]
        return argv + list(options) + [cname] + list(command)
    return None


def srun_argv(image, run_mounts, command, nnodes, workdir=None, options=()):
    """Slurm with pyxis: one task per node started in the image, the way the cluster already
    starts images (srun --container-image); pyxis shares the host's network and IPC and runs
    enroot's GPU hooks itself."""
    argv = ["srun", "--nodes", str(nnodes), "--ntasks-per-node", "1",
            "--container-image", image]
    if run_mounts:
        argv.append("--container-mounts=" + ",".join("%s:%s" % m for m in run_mounts))
    if workdir:
        argv.append("--container-workdir=" + workdir)
    return argv + list(options) + list(command)
