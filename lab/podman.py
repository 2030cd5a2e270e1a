"""podman for the lab's hosts: a test image imported from a root filesystem this machine makes,
and the settings every podman of the lab runs with (tests/lab/test_user_lab.py's container
tests, bench/container_launch.py; docs/containers.md). No registry is reachable from the machines the tests run on.

- The image holds this machine's Python (sys.base_prefix's interpreter and standard library)
  and the shared libraries it and torch load; the venv with torch is mounted read-only at its
  own path (container_mounts), as the nodes share this machine's filesystem. Imported with
  `podman import` from a tar kept under CACHE, made once per Python.
- Every podman of the lab (the nodes' agents and probes through sshd's SetEnv, the tests' own
  looks) reads CONTAINERS_CONF and CONTAINERS_STORAGE_CONF from CACHE, never the machine's
  /etc/containers: runc (crun refuses this machine's hybrid cgroup hierarchy), no default
  rlimits and no pids limit (the sandbox refuses the rlimits podman sets; the tests also pass
  --ulimit host), and storage of its own. A second storage ("other") holds a different image
  under the same name: a host that reads it has another image id (container.digest).
- archive(): IMAGE as `podman save` writes it (a docker-archive), as a user ships an image
  without a registry (container_image=/path/image.tar), kept under CACHE by the image's id.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

CACHE = Path("/var/cache/torchfleet-test/podman")
RUNROOT = Path("/run/torchfleet-test-podman")
IMAGE = "localhost/torchfleet-test:lab"
# A playbook's extra vars that run its ranks (and preflight's probe) in IMAGE with podman: the
# image holds this machine's Python, the venv with torch is mounted at its own path, and the
# sandbox refuses every rlimit a container asks for, so --ulimit host (which also replaces
# torchfleet's --ulimit memlock=-1: a ulimit of yours wins). The lab tests and the bench's
# container_launch run with these.
EXTRA_VARS = ["-e", "container_image=%s" % IMAGE, "-e", "container_runtime=podman",
              "-e", json.dumps({"container_mounts": [sys.prefix],
                                "container_options": ["--ulimit", "host"]})]
CONTAINERS_CONF = """[containers]
default_ulimits = []
pids_limit = 0
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""
STORAGE_CONF = """[storage]
driver = "overlay"
graphroot = "{graphroot}"
runroot = "{runroot}"
"""


def unavailable() -> str | None:
    missing = [t for t in ("podman", "runc", "tar", "ldd") if not shutil.which(t)]
    if missing:
        return "podman tests need %s (.ci/run installs podman and runc)" % ", ".join(missing)
    return None


def env(storage: str = "main") -> dict[str, str]:
    """What every podman of the lab runs with (the storage: main, or other)."""
    conf = CACHE / "containers.conf"
    sconf = CACHE / ("storage-%s.conf" % storage)
    CACHE.mkdir(parents=True, exist_ok=True)
    if not conf.exists() or conf.read_text() != CONTAINERS_CONF:
        conf.write_text(CONTAINERS_CONF)
    text = STORAGE_CONF.format(graphroot=CACHE / ("storage-" + storage),
                               runroot=RUNROOT / storage)
    if not sconf.exists() or sconf.read_text() != text:
        sconf.write_text(text)
    return {"CONTAINERS_CONF": str(conf), "CONTAINERS_STORAGE_CONF": str(sconf)}


def podman(*args: str, storage: str = "main", timeout_s: float = 300,
           check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], env=dict(os.environ, **env(storage)),
                          capture_output=True, text=True, timeout=timeout_s, check=check,
                          stdin=subprocess.DEVNULL)


def use_on(lab, storages: dict[str, str]) -> None:
    """Give each lab host its podman settings ({host: storage}) through sshd's SetEnv, with the
    machine's cgroup hierarchies (the runtime's), until the lab's heal(); the image is imported
    into each storage first (bare: a storage without the image; fresh: one the test empties
    itself). The caller has checked unavailable()."""
    for storage in set(storages.values()) - {"bare", "fresh"}:
        ensure_image(storage, marker="" if storage == "main" else storage)
    for host, storage in storages.items():
        lab.set_env(host, *("%s=%s" % kv for kv in env(storage).items()), cgroups=True)


def _libraries(files: list[str]) -> list[str]:
    """The shared libraries `files` load, as ldd resolves them (outside the venv and Python's
    own prefix, which the image holds or mounts)."""
    found = set()
    for start in range(0, len(files), 200):
        out = subprocess.run(["ldd", *files[start:start + 200]], capture_output=True, text=True,
                             check=False).stdout
        for line in out.splitlines():
            parts = line.split("=>")
            if len(parts) == 2 and parts[1].split() and parts[1].split()[0].startswith("/"):
                found.add(parts[1].split()[0])
            elif line.strip().startswith("/") and "ld-linux" in line:
                found.add(line.split()[0])
    return sorted(found)


def rootfs_tar(marker: str = "") -> Path:
    """The image's root filesystem as a tar, made once per Python (and marker) and kept."""
    base = Path(sys.base_prefix)
    stdlib = Path(sysconfig.get_paths(vars={"installed_base": str(base),
                                            "base": str(base)})["stdlib"])
    key = hashlib.sha256(("%s|%s|%s|%s" % (sys.version, base, stdlib, marker)).encode())
    tar = CACHE / ("rootfs-%s.tar" % key.hexdigest()[:16])
    if tar.exists():
        return tar
    CACHE.mkdir(parents=True, exist_ok=True)
    binaries = sorted(str(p) for p in (base / "bin").glob("python3*") if p.is_file())
    shared = sorted(str(p) for p in (base / "lib").glob("libpython3*.so*"))
    torch_libs = []
    try:
        import torch  # noqa: F401 (only where its libraries are)
        torch_libs = [str(p) for p in (Path(torch.__file__).parent / "lib").glob("*.so*")]
    except ImportError:
        pass
    dynload = [str(p) for p in (stdlib / "lib-dynload").glob("*.so")]
    libs = [lib for lib in _libraries([os.path.realpath(sys.executable), *shared, *dynload,
                                       *torch_libs])
            if not lib.startswith((str(base) + "/", sys.prefix + "/"))]  # (in the tar already)
    with tempfile.TemporaryDirectory() as tmp:
        skeleton = Path(tmp)
        for d in ("tmp", "etc", "dev", "proc", "sys", "run", "root"):
            (skeleton / d).mkdir()
        (skeleton / "tmp").chmod(0o1777)
        (skeleton / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        (skeleton / "etc" / "group").write_text("root:x:0:\n")
        (skeleton / "etc" / "torchfleet-test-image").write_text(marker + "\n")
        partial = tar.with_suffix(".partial")
        subprocess.run(
            ["tar", "-cf", str(partial), "-C", str(skeleton), ".",
             "--exclude", "*/site-packages", "--exclude", "*/dist-packages",
             "--exclude", "*/__pycache__", "--exclude", str(stdlib / "test").lstrip("/"),
             "-C", "/", *[p.lstrip("/") for p in binaries + shared + [str(stdlib)]],
             # libraries through their links (the image has no /lib -> /usr/lib link)
             "--dereference", *[p.lstrip("/") for p in libs]],
            check=True, capture_output=True)
        partial.rename(tar)
    return tar


def ensure_image(storage: str = "main", marker: str = "") -> str:
    """IMAGE in `storage`, imported from rootfs_tar(marker) unless it is there; its id."""
    found = podman("image", "inspect", "--format", "{{.Id}}", IMAGE, storage=storage,
                   check=False)
    if found.returncode == 0 and found.stdout.strip():
        return found.stdout.strip()
    podman("import", "--quiet", str(rootfs_tar(marker)), IMAGE, storage=storage)
    return podman("image", "inspect", "--format", "{{.Id}}", IMAGE,
                  storage=storage).stdout.strip()


def archive(storage: str = "main") -> Path:
    """IMAGE saved by `podman save` into a file under CACHE, once per image id."""
    image_id = ensure_image(storage)
    path = CACHE / ("archive-%s.tar" % image_id.split(":")[-1][:16])
    if not path.exists():
        partial = path.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        podman("save", "--quiet", "--output", str(partial), IMAGE, storage=storage)
        partial.rename(path)
    return path


def containers(prefix: str, storage: str = "main") -> list[str]:
    """Names of the containers (running or not) whose name starts with prefix."""
    out = podman("ps", "--all", "--format", "{{.Names}}", storage=storage).stdout
    return [n for n in out.split() if n.startswith(prefix)]
