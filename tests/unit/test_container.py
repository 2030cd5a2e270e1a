"""container_image: every runtime's command line as run/container.py builds it (docs/containers.md
shows these), the settings' one-sentence errors, the preflight checks container.runtime,
container.pull and container.digest, and what stop paths remove."""
from __future__ import annotations

import json
import os
import socket
import subprocess
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.torchfleet.fleet.plugins.module_utils.host import image, pystack
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.preflight import container_checks
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import container, plan, stop

NGC = "nvcr.io/nvidia/pytorch:24.05-py3"
TORCHRUN = ["python", "-m", "torch.distributed.run", "--nnodes", "2", "train.py"]
MOUNTS = [("/code", "/code"), ("/runs/r1/node0", "/runs/r1/node0")]
NAME = "torchfleet-r1-node0"


def test_podman_gets_the_hosts_network_ipc_memlock_no_pids_cap_cdi_gpus_ib_env_and_mounts():
    assert container.run_argv("podman", NGC, NAME, TORCHRUN, ["NCCL_DEBUG", "TORCHFLEET_RUN_ID"],
                              MOUNTS, ["--security-opt", "label=disable"], gpus=True, ib=True,
                              workdir="/code") == [
        "podman", "run", "--rm", "--name", NAME, "--network", "host", "--ipc", "host",
        "--ulimit", "memlock=-1", "--pids-limit", "-1", "--device", "nvidia.com/gpu=all",
        "--device", "/dev/infiniband", "--env", "NCCL_DEBUG", "--env", "TORCHFLEET_RUN_ID",
        "--volume", "/code:/code", "--volume", "/runs/r1/node0:/runs/r1/node0",
        "--workdir", "/code", "--security-opt", "label=disable", NGC] + TORCHRUN


@pytest.mark.parametrize("options", [["--shm-size", "16g"], ["--shm-size=16g"],
                                     ["--ipc", "private", "--shm-size", "16g"]])
def test_a_shm_size_or_ipc_of_yours_replaces_the_hosts_ipc(options):
    # (podman and docker refuse --shm-size beside --ipc host: a cluster that forbids the
    # host's IPC sizes the container's own /dev/shm instead)
    argv = container.run_argv("docker", NGC, NAME, TORCHRUN, ["A"], [], options, gpus=True)
    assert argv == ["docker", "run", "--rm", "--name", NAME, "--network", "host",
                    "--ulimit", "memlock=-1", "--gpus", "all", "--env", "A"] + options + [
                        NGC] + TORCHRUN


def test_auto_takes_the_runtime_a_file_image_needs_before_podman():
    everything = set(container.RUNTIMES).__contains__
    assert container.resolve("auto", everything, "/images/pytorch.sif") == "apptainer"
    assert container.resolve("auto", everything, "/images/pytorch.sqsh") == "enroot"
    assert container.resolve("auto", everything, "/images/pytorch.tar") == "podman"
    assert container.resolve("auto", {"podman", "docker"}.__contains__, "/i/p.sif") is None
    # apptainer starts a .sif only: a reference is never handed to it by auto
    assert container.resolve("auto", {"apptainer", "enroot"}.__contains__, NGC) == "enroot"
    assert container.resolve("auto", {"apptainer"}.__contains__, "docker://" + NGC) is None


def test_no_gpus_no_ib_and_a_ulimit_of_yours_replaces_memlock():
    argv = container.run_argv("podman", NGC, NAME, TORCHRUN, [], [], ["--ulimit", "host"])
    assert "memlock=-1" not in argv and "--device" not in argv and "--gpus" not in argv
    assert argv[-len(TORCHRUN) - 3:] == ["--ulimit", "host", NGC] + TORCHRUN


def test_apptainer_exec_cleanenv_nv_binds_and_env_through_apptainerenv():
    assert container.run_argv("apptainer", "/images/pt.sif", NAME, TORCHRUN, [], MOUNTS,
                              gpus=True, workdir="/code") == [
        "apptainer", "exec", "--cleanenv", "--nv", "--bind", "/code:/code",
        "--bind", "/runs/r1/node0:/runs/r1/node0", "--pwd", "/code", "/images/pt.sif"] + TORCHRUN
    names, env = container.run_env("apptainer", {"NCCL_DEBUG": "WARN"}, gpus=True)
    assert names == [] and env == {"APPTAINERENV_NCCL_DEBUG": "WARN"}


def test_enroot_creates_starts_by_name_with_the_gpu_hooks_env_and_removes():
    names, env = container.run_env("enroot", {"A": "1"}, gpus=True)
    assert names == ["A", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_VISIBLE_DEVICES"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert container.create_argv("enroot", "/i/pt.sqsh", NAME) == [
        "enroot", "create", "--force", "--name", NAME, "/i/pt.sqsh"]
    assert container.run_argv("enroot", "/i/pt.sqsh", NAME, TORCHRUN, names, MOUNTS[:1],
                              workdir="/code") == [
        "enroot", "start", "--rw", "--env", "A", "--env", "NVIDIA_DRIVER_CAPABILITIES",
        "--env", "NVIDIA_VISIBLE_DEVICES", "--mount", "/code:/code", NAME,
        "env", "-C", "/code"] + TORCHRUN
    assert container.remove_argv("enroot", NAME) == ["enroot", "remove", "--force", NAME]


def test_stop_paths_remove_exactly_the_runs_container_by_name():
    assert container.name("r1", "node0") == NAME
    assert container.name("r1", "gpu 7/a", attempt=2) == "torchfleet-r1-gpu_7_a-a2"
    assert container.remove_argv("podman", NAME) == ["podman", "rm", "--force", "--time", "0",
                                                     NAME]
    assert container.remove_argv("docker", NAME) == ["docker", "rm", "--force", NAME]
    assert container.remove_argv("apptainer", NAME) is None  # its processes are the host's
    assert container.pid_argv("podman", NAME) == ["podman", "inspect", "--format",
                                                  "{{.State.Pid}}", NAME]


def test_pyxis_srun_starts_the_image_on_every_node():
    assert container.srun_argv(NGC, MOUNTS, TORCHRUN, 2, workdir="/code") == [
        "srun", "--nodes", "2", "--ntasks-per-node", "1", "--container-image", NGC,
        "--container-mounts=/code:/code,/runs/r1/node0:/runs/r1/node0",
        "--container-workdir=/code"] + TORCHRUN


def test_the_runs_paths_are_mounted_at_the_same_paths_each_once():
    assert container.mounts(["/code", "", "relative", "/code/"], ["/data", "/scratch:/code",
                                                                   "/opt:/opt/x"]) == [
        ("/code", "/code"), ("/data", "/data"), ("/opt", "/opt/x")]


@pytest.mark.parametrize("image, runtime, mounts, options, words", [
    (NGC, "lxc", [], [], "container_runtime='lxc' is not one of"),
    ("a b", "auto", [], [], "is not an image reference"),
    ("--privileged", "podman", [], [], "is not an image reference"),
    ("/i/pt.sif", "podman", [], [], "container_runtime=podman loads archives of `podman save`"),
    ("docker://" + NGC, "apptainer", [], [], "run `apptainer pull /path/image.sif docker://IMAGE`"),
    (NGC, "apptainer", [], [], "container_runtime=apptainer starts a .sif file"),
    ("/i/pt.sqsh", "docker", [], [], "set container_runtime=enroot"),
    ("/images/pt.sif", "enroot", [], [], "nvcr.io#nvidia/pytorch:24.05-py3"),
    ("oras://ghcr.io/x/pt:1", "enroot", [], [], "imports a registry reference"),
    (NGC, "podman", ["data"], [], "container_mounts entry 'data'"),
    (NGC, "podman", ["/a:/b:/c"], [], "container_mounts entry"),
    (NGC, "podman", "/data", [], "must be a list"),
    (NGC, "podman", [], "--privileged", "container_options must be a list"),
])
def test_each_wrong_setting_is_one_sentence_with_its_fix(image, runtime, mounts, options, words):
    why = container.validate(image, runtime, mounts, options)
    assert words in why and why.count(". ") == 0


def test_enroot_takes_a_squashfs_file_or_a_reference_as_pyxis_does():
    """Issue 68: container_runtime=enroot refused anything but a .sqsh; a cluster with pyxis
    names its images nvcr.io#nvidia/pytorch:24.05-py3 (or docker://...)."""
    for img in ("nvcr.io#nvidia/pytorch:24.05-py3", "docker://nvcr.io#nvidia/pytorch:24.05-py3",
                NGC, "ubuntu:22.04", "dockerd://pt:1", "/images/pt.sqsh", "./pt.sqsh",
                "/images/pt.squashfs"):
        assert container.validate(img, "enroot", [], []) is None, img


def test_one_function_maps_an_enroot_image_to_its_squashfs_file(tmp_path):
    cache = str(tmp_path / "enroot")
    ref = "nvcr.io#nvidia/pytorch:24.05-py3"
    path = container.enroot_image(ref, cache)
    assert path.startswith(cache + "/nvcr.io+nvidia+pytorch+24.05-py3-") and path.endswith(".sqsh")
    # The same reference with its scheme is the same image, the same file; pyxis's rule.
    assert container.enroot_image("docker://" + ref, cache) == path
    assert container.enroot_uri(ref) == "docker://" + ref
    assert container.enroot_uri("dockerd://pt:1") == "dockerd://pt:1"
    # Written as docker writes it, the registry gets enroot's '#' (else enroot asks Docker Hub
    # for nvcr.io/nvidia/pytorch), and it is the same image, the same file.
    assert container.enroot_uri(NGC) == "docker://" + ref
    assert container.enroot_image(NGC, cache) == path
    assert container.enroot_uri("localhost:5000/pt:1") == "docker://localhost:5000#pt:1"
    assert container.enroot_uri("localhost/pt:1") == "docker://localhost#pt:1"
    assert container.enroot_uri("nvidia/cuda:12.4.1-base") == "docker://nvidia/cuda:12.4.1-base"
    assert container.enroot_uri("ubuntu:22.04") == "docker://ubuntu:22.04"
    # (Docker Hub is enroot's default: its name as a registry would be asked at docker.io)
    assert container.enroot_uri("docker.io/library/ubuntu:22.04") == "docker://library/ubuntu:22.04"
    # References whose readable names agree never share a file; a file is itself.
    assert container.enroot_image("a/b:c", cache) != container.enroot_image("a:b/c", cache)
    assert container.enroot_image("/images/pt.sqsh", cache) == "/images/pt.sqsh"
    # The probe's import, the probe's container and the agent's container read that file.
    assert container.pull_argv("enroot", ref, output=path + ".7.part") == [
        "enroot", "import", "--output", path + ".7.part", "docker://" + ref]
    assert container.pull_argv("enroot", "/images/pt.sqsh") is None
    assert container.create_argv("enroot", ref, NAME, cache) == [
        "enroot", "create", "--force", "--name", NAME, path]


def test_without_an_image_nothing_is_checked_or_changed():
    assert container.validate("", "lxc", "x", "y") is None
    assert plan.container_errors({"container_image": "", "container_runtime": "lxc",
                                  "container_mounts": [], "container_options": []}) == []


def test_a_wrong_setting_is_input_container_before_any_host_is_touched():
    [error] = plan.container_errors({"container_image": NGC, "container_runtime": "lxc",
                                     "container_mounts": [], "container_options": []})
    assert error["id"] == "input.container" and "lxc" in error["detail"]
    assert "leave it auto" in error["hint"]


def test_auto_takes_the_first_runtime_present():
    assert container.resolve("auto", {"docker", "enroot"}.__contains__) == "docker"
    assert container.resolve("auto", lambda r: False) is None
    assert container.resolve("enroot", lambda r: False) == "enroot"


class FakeRun:
    """command.bounded's runner: answers by argv's first two words."""

    def __init__(self, answers):
        self.answers, self.calls = answers, []

    def __call__(self, argv, timeout_s=None, data=None):
        self.calls.append((argv, timeout_s))
        return self.answers.get(tuple(argv[:3]), self.answers.get(tuple(argv[:2]), ("", None)))


def test_image_probe_pulls_a_missing_image_with_its_timeout_and_reads_its_id():
    run = FakeRun({("podman", "image", "inspect"): (None, "no such image"),
                   ("podman", "pull"): ("sha256:aa\n", None)})
    # (the inspect answers "missing" both times here: the id is then unknown, never made up)
    facts = image.probe(NGC, "auto", run, which=lambda r: "/usr/bin/" + r, pull_timeout_s=7)
    assert facts["runtime"] == "podman" and facts["pulled"] and facts["pull_error"] is None
    assert (["podman", "pull", "--quiet", NGC], 7) in run.calls
    assert facts["digest"] is None


def test_image_probe_names_the_registrys_error_and_a_missing_runtime():
    run = FakeRun({("podman", "image", "inspect"): (None, "no such image"),
                   ("podman", "pull"): (None, "dial tcp: lookup nvcr.io: no such host")})
    facts = image.probe(NGC, "podman", run, which=lambda r: "/usr/bin/" + r)
    assert "no such host" in facts["pull_error"] and image.runner(facts, run) is None
    facts = image.probe(NGC, "docker", run, which=lambda r: None)
    assert facts["error"] == "docker is not installed here"
    facts = image.probe(NGC, "auto", run, which=lambda r: None)
    assert "none of podman, docker" in facts["error"]


def test_the_python_probe_runs_in_the_image_and_reads_its_last_line():
    answer = {"executable": "/usr/bin/python3", "torch_version": "2.4.0a0+07cecf4"}
    run = FakeRun({("podman", "run", "--rm"): ("=== NVIDIA banner ===\n" + json.dumps(answer),
                                               None)})
    facts = {"runtime": "podman", "image": NGC, "local": NGC, "error": None, "pull_error": None}
    got = pystack.probe_python("python3", run, in_image=image.runner(facts, run, [("/v", "/v")]))
    assert got == answer
    argv = run.calls[0][0]
    # (the run's limits too: a host whose runtime refuses them fails preflight, not the launch)
    assert argv[:13] == ["podman", "run", "--rm", "--network", "none", "--ipc", "host",
                         "--ulimit", "memlock=-1", "--pids-limit", "-1", "--volume", "/v:/v:ro"]
    assert argv[13:15] == [NGC, "python3"]


# An archive of `podman save` (podman 4.3's `podman load --quiet` output for it, for one saved
# by id, podman 1-3's form and docker's for an image saved by id).
ARCHIVE = "/images/pytorch-24.05.tar"
LOADED = {"Loaded image: localhost/exp:one\n": "localhost/exp:one",
          "Loaded image: sha256:a875028454963b5d8667dc93b59d82405878a64567287ee3be900fb34b7b509b\n":
          "sha256:a875028454963b5d8667dc93b59d82405878a64567287ee3be900fb34b7b509b",
          "Loaded image(s): localhost/a:1,localhost/b:2\n": "localhost/a:1",
          "Loaded image ID: sha256:0123abcd\n": "sha256:0123abcd",
          "Copying blob sha256:0c23\nWriting manifest\nLoaded image: nvcr.io/nvidia/pytorch:24.05-py3\n":
          NGC,
          "Loaded image: --privileged\n": None, "no image\n": None, "": None}


@pytest.mark.parametrize("text, ref", LOADED.items())
def test_the_load_output_names_the_first_image_it_loaded(text, ref):
    assert container.loaded_ref(text) == ref


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=400), st.lists(st.tuples(
    st.sampled_from(["", "(s)", " ID"]), st.text(max_size=60))).map(
        lambda lines: "".join("Loaded image%s: %s\n" % line for line in lines))))
def test_hostile_load_output_never_raises_and_never_gives_an_option(text):
    ref = container.loaded_ref(text)
    assert ref is None or (not ref.startswith("-") and not any(c.isspace() for c in ref))


def fake_stat(size=1000, mtime_ns=1700000000000000000, mode=0o100644):
    """os.stat where only ARCHIVE is (a regular file by default)."""
    def stat(path):
        if path != ARCHIVE:
            raise FileNotFoundError(path)
        return SimpleNamespace(st_mode=mode, st_size=size, st_mtime_ns=mtime_ns)
    return stat


def test_an_archive_is_known_by_a_tag_of_its_path_size_and_mtime():
    stat = fake_stat()
    local = container.local_image("podman", ARCHIVE, stat=stat)
    assert local.startswith(container.ARCHIVE_REPO + ":") and len(local.split(":")[1]) == 20
    assert container.local_image("docker", ARCHIVE, stat=stat) == local  # (the file's, the same)
    assert container.local_image("podman", ARCHIVE, stat=fake_stat(size=1001)) != local
    assert container.local_image("podman", ARCHIVE, stat=fake_stat(mtime_ns=1)) != local
    assert container.local_image("podman", "/images/other.tar", stat=stat) is None  # (missing)
    assert container.local_image("podman", ARCHIVE, stat=fake_stat(mode=0o040755)) is None
    # A reference, or a file apptainer and enroot start themselves, is its own name.
    for runtime, img in (("podman", NGC), ("docker", NGC), ("apptainer", "/i/pt.sif"),
                         ("enroot", "/i/pt.sqsh")):
        assert container.local_image(runtime, img, stat=stat) == img
    assert container.load_argv("podman", ARCHIVE) == ["podman", "load", "--quiet", "--input",
                                                      ARCHIVE]
    assert container.tag_argv("docker", "sha256:0123", local) == ["docker", "tag", "sha256:0123",
                                                                  local]


def test_image_probe_loads_an_archive_tags_it_and_reads_the_loaded_image(tmp_path):
    archive = tmp_path / "pt.tar"
    archive.write_bytes(b"x" * 10)
    local = container.local_image("podman", str(archive))
    run = FakeRun({("podman", "image", "inspect"): (None, "image not known"),
                   ("podman", "load"): ("Loaded image: localhost/exp:one\n", None)})
    facts = image.probe(str(archive), "podman", run, which=lambda r: "/usr/bin/" + r,
                        pull_timeout_s=7)
    assert facts["pulled"] and facts["pull_error"] is None and facts["local"] == local
    argvs = [argv for argv, _t in run.calls]
    assert (["podman", "load", "--quiet", "--input", str(archive)], 7) in run.calls
    assert ["podman", "tag", "localhost/exp:one", local] in argvs
    assert not [a for a in argvs if a[1] == "pull"]
    # presence, the id (container.digest) and the env (container.driver) read the tag
    assert [a[-1] for a in argvs if a[:3] == ["podman", "image", "inspect"]] == [local] * 3
    [record] = [r for r in container_checks({"n0": {"container": facts}}, "n0")
                if r["id"] == "container.pull"]
    assert record["ok"] and record["detail"] == "%s loaded as %s" % (archive, local)
    # the in-image probe too
    ran = FakeRun({})
    pystack.probe_python("python3", ran, in_image=image.runner(facts, ran))
    assert ran.calls[0][0][11:13] == [local, "python3"]
    # present already (loaded by an earlier preflight): not loaded again
    run = FakeRun({("podman", "image", "inspect"): ("sha256:aa\n", None)})
    facts = image.probe(str(archive), "podman", run, which=lambda r: "/usr/bin/" + r)
    assert not facts["pulled"] and not [a for a, _t in run.calls if a[1] in ("load", "tag")]


def test_a_missing_archive_and_a_load_error_are_container_pull_with_the_host(tmp_path):
    archive = tmp_path / "pt.tar"
    run = FakeRun({})
    facts = image.probe(str(archive), "podman", run, which=lambda r: "/usr/bin/" + r)
    [record] = [r for r in container_checks({"n3": {"container": facts}}, "n3")
                if r["id"] == "container.pull"]
    assert not record["ok"] and record["detail"] == "%s: %s is not a file here" % (archive,
                                                                                  archive)
    assert "copy the archive to %s on n3" % archive in record["hint"]
    assert image.runner(facts, None) is None
    archive.write_bytes(b"x" * 10)
    # podman 4.3's own error for a gzip'd archive (its load reads no compressed archive)
    error = ("Error: payload does not match any of the supported image formats:\n * oci: ...\n"
             " * docker-archive: loading tar component manifest.json: unexpected EOF\n" * 20)
    run = FakeRun({("podman", "image", "inspect"): (None, "image not known"),
                   ("podman", "load"): (None, error[-300:])})
    facts = image.probe(str(archive), "podman", run, which=lambda r: "/usr/bin/" + r)
    assert facts["pull_error"].startswith("not loaded here, and podman load failed: ")
    assert "unexpected EOF" in facts["pull_error"] and len(facts["pull_error"]) < 400
    run = FakeRun({("podman", "image", "inspect"): (None, "image not known"),
                   ("podman", "load"): ("Storing signatures\n", None)})
    facts = image.probe(str(archive), "podman", run, which=lambda r: "/usr/bin/" + r)
    assert facts["pull_error"] == "podman load named no image it loaded: 'Storing signatures\\n'"


def test_the_agent_starts_the_image_loaded_from_the_archive_or_says_it_is_missing(tmp_path):
    from ansible_collections.torchfleet.fleet.plugins.module_utils.run import agent
    archive = tmp_path / "pt.tar"
    archive.write_bytes(b"x" * 10)
    p = {"container_runtime": "docker", "container_image": str(archive), "run_id": "r1",
         "host": "node0", "attempt": 0, "run_dir": str(tmp_path / "run"), "chdir": "",
         "data_paths": [], "container_mounts": [], "container_options": [],
         "container_gpus": False, "network": "tcp", "checkpoint_dir": "", "flight_recorder": 0,
         "env": {}}
    box = agent.Box(p, "/srv/train/train.py")
    argv, _env = box.wrap(["python3", "train.py"], {})
    local = container.local_image("docker", str(archive))
    assert argv[-3:] == [local, "python3", "train.py"] and str(archive) not in argv
    archive.unlink()
    assert agent.Box(p, "/srv/train/train.py").image is None  # (the agent reports it not started)

ENROOT_FACTS = {"runtime": "enroot", "image": "/images/pt.sqsh", "error": None,
                "pull_error": None}


def test_enroots_python_probe_runs_in_a_throwaway_container_of_its_own(monkeypatch):
    """Issue 68: with enroot the Python probe read the host's Python (no container to run it
    in): python.torch and version.* said nothing of the image. A container of the probe's own
    is created from the squashfs, started read-only with the mounts read-only, removed."""
    answer = {"executable": "/usr/bin/python3", "torch_version": "2.4.0a0+07cecf4"}
    run = FakeRun({("enroot", "start"): (json.dumps(answer) + "\n", None)})
    got = pystack.probe_python("python3", run, in_image=image.runner(
        ENROOT_FACTS, run, [("/v", "/v")], ["--conf", "/etc/x.conf"]))
    assert got == answer
    (create, _t1), (start, timeout_s), (remove, _t2) = run.calls
    cname = create[4]
    assert cname.startswith("torchfleet-probe-")
    assert create == ["enroot", "create", "--force", "--name", cname, "/images/pt.sqsh"]
    assert start[:8] == ["enroot", "start", "--env", "NVIDIA_VISIBLE_DEVICES=void", "--mount",
                         "/v:/v:none:rbind,x-create=auto,ro", "--conf", "/etc/x.conf"]
    assert "--rw" not in start and start[8:10] == [cname, "python3"] and timeout_s == 20
    assert remove == ["enroot", "remove", "--force", cname]
    # Each probe's container is its own.
    pystack.probe_python("python3", run, in_image=image.runner(ENROOT_FACTS, run))
    assert run.calls[3][0][4] != cname


class TimesOut(FakeRun):
    """command.bounded's answer for a command killed at its timeout, or a runner that raises
    (the module itself interrupted)."""

    def __init__(self, word, how):
        super().__init__({})
        self.word, self.how = word, how

    def __call__(self, argv, timeout_s=None, data=None):
        self.calls.append((argv, timeout_s))
        if argv[:2] == ["enroot", self.word]:
            if self.how == "raise":
                raise subprocess.TimeoutExpired(argv, timeout_s)
            return None, "%s did not answer within %g s" % (argv[0], timeout_s)
        return "", None


@pytest.mark.parametrize("word, how", [("start", "answer"), ("start", "raise"),
                                       ("create", "answer")])
def test_enroots_probe_container_is_removed_whatever_became_of_the_probe(word, how):
    run = TimesOut(word, how)
    in_image = image.runner(ENROOT_FACTS, run)
    if how == "raise":
        with pytest.raises(subprocess.TimeoutExpired):
            pystack.probe_python("python3", run, in_image=in_image)
    else:
        got = pystack.probe_python("python3", run, in_image=in_image)
        assert "did not answer" in got["error"] and "in the image" in got["error"]
    cname = run.calls[0][0][4]
    assert run.calls[-1][0] == ["enroot", "remove", "--force", cname]
    assert [argv[1] for argv, _t in run.calls] == (["create", "start", "remove"] if word == "start"
                                                   else ["create", "remove"])
    if word == "create":
        assert run.calls[0][1] == image.CREATE_TIMEOUT_S


class Imports(FakeRun):
    """enroot's import as it behaves: refuses an output that exists, writes it otherwise; or
    fails with the registry's error."""

    def __init__(self, error=None):
        super().__init__({})
        self.error = error

    def __call__(self, argv, timeout_s=None, data=None):
        self.calls.append((argv, timeout_s))
        if argv[:2] == ["enroot", "import"]:
            out = argv[argv.index("--output") + 1]
            if self.error:
                open(out, "w").write("half")  # (cut off: a partial file is left)
                return None, self.error
            assert not os.path.exists(out), "File already exists: " + out
            open(out, "w").write("hsqs")
        return "", None


def test_enroot_imports_a_reference_once_per_host_and_names_its_error(tmp_path):
    ref = "nvcr.io#nvidia/pytorch:24.05-py3"
    cache = str(tmp_path / "cache" / "enroot")
    run = Imports()
    facts = image.probe(ref, "enroot", run, which=lambda r: "/usr/bin/" + r, pull_timeout_s=7,
                        enroot_images=cache)
    path = container.enroot_image(ref, cache)
    assert facts["pulled"] and facts["pull_error"] is None and os.path.isfile(path)
    [(argv, timeout_s)] = [c for c in run.calls if c[0][1] == "import"]
    assert argv[-1] == "docker://" + ref and argv[3].startswith(path) and timeout_s == 7
    # (the partial file is the host's and the probe's own: on a shared home two hosts with
    # one pid import at once)
    assert argv[3].startswith("%s.%s.%d." % (path, socket.gethostname(), os.getpid()))
    assert os.listdir(cache) == [os.path.basename(path)]  # (the partial name is renamed)
    # A later probe finds the file: nothing imported again.
    run = Imports()
    facts = image.probe(ref, "enroot", run, which=lambda r: "/usr/bin/" + r, enroot_images=cache)
    assert not facts["pulled"] and facts["pull_error"] is None
    assert not [c for c in run.calls if c[0][1] == "import"]
    # The registry's error, and nothing left that a later probe would take for the image.
    run = Imports("[ERROR] URL https://nvcr.io/proxy_auth returned error code: 401 Unauthorized")
    facts = image.probe(ref + "x", "enroot", run, which=lambda r: "/usr/bin/" + r,
                        enroot_images=cache)
    assert "enroot import failed: [ERROR] URL https://nvcr.io" in facts["pull_error"]
    assert "401" in facts["pull_error"] and len(facts["pull_error"]) < 400
    assert os.listdir(cache) == [os.path.basename(path)] and image.runner(facts, run) is None
    # A squashfs file is never imported: it is there or container.pull says it is missing.
    facts = image.probe(str(tmp_path / "pt.sqsh"), "enroot", run,
                        which=lambda r: "/usr/bin/" + r, enroot_images=cache)
    assert facts["pull_error"] == "%s does not exist here" % (tmp_path / "pt.sqsh")


def probe(digest=None, error=None, pull_error=None, pulled=False):
    return {"container": {"image": NGC, "runtime": "podman", "error": error,
                          "pull_error": pull_error, "pulled": pulled, "digest": digest}}


def test_container_digest_names_the_host_with_another_image_like_code_sync():
    records = container_checks({"n0": probe("sha256:" + "a" * 64), "n1": probe("sha256:" + "b" * 64),
                                "n2": probe("sha256:" + "a" * 64)}, "n0")
    bad = [r for r in records if not r["ok"]]
    assert [(r["id"], r["host"]) for r in bad] == [("container.digest", "n1")]
    assert "on n0, n2" in bad[0]["detail"] and "n1" in bad[0]["hint"]


def test_container_runtime_and_pull_name_the_host_and_the_error():
    records = container_checks({"n0": probe(error="docker info: Cannot connect to the Docker "
                                                  "daemon"),
                                "n1": probe(pull_error="not here, and podman pull failed: 401"),
                                "n2": {}}, "n0")
    assert [(r["id"], r["host"], r["ok"]) for r in records] == [
        ("container.runtime", "n0", False), ("container.runtime", "n1", True),
        ("container.pull", "n1", False)]
    assert "401" in records[2]["detail"]


def auto(runtime, installed):
    facts = probe("sha256:" + "a" * 64)
    facts["container"].update(runtime=runtime, installed=installed)
    return facts


def test_auto_that_took_another_runtime_on_one_host_is_container_runtime_with_the_common_one():
    # n2 has podman too, so auto took podman there; docker is on every host: the fix says so.
    records = container_checks({"n0": auto("docker", ["docker"]), "n1": auto("docker", ["docker"]),
                                "n2": auto("podman", ["podman", "docker"])}, "n0")
    [bad] = [r for r in records if not r["ok"]]
    assert (bad["id"], bad["host"]) == ("container.runtime", "n2")
    assert bad["detail"] == ("auto took podman here and docker on n0, n1: one run runs one "
                             "runtime on every host")
    assert bad["hint"] == "set -e container_runtime=docker (installed on every host)"


def test_auto_with_no_runtime_on_every_host_names_the_few_against_the_most():
    records = container_checks({"n0": auto("podman", ["podman"]), "n1": auto("docker", ["docker"]),
                                "n2": auto("podman", ["podman"])}, "n1")
    [bad] = [r for r in records if not r["ok"]]
    assert (bad["id"], bad["host"]) == ("container.runtime", "n1")
    assert bad["hint"] == "install podman on n1, or set -e container_runtime=..."
    # An explicit runtime everywhere, or one host's broken runtime, is no disagreement.
    assert all(r["ok"] for r in container_checks({"n0": auto("podman", ["podman"]),
                                                  "n1": auto("podman", ["podman", "docker"])},
                                                 "n0"))


def test_stop_removes_only_a_container_named_as_torchfleets(monkeypatch):
    ran = []

    def fake(argv, **kw):
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout=b"torchfleet-r1-node0\n")
    monkeypatch.setattr(subprocess, "run", fake)
    assert stop.remove_container({"runtime": "podman", "name": NAME}) == NAME
    assert stop.remove_container({"runtime": "podman", "name": "someone-elses"}) is None
    assert stop.remove_container(None) is None
    assert ran == [["podman", "rm", "--force", "--time", "0", NAME]]



def test_docs_containers_md_shows_each_runtimes_line_as_built(monkeypatch):
    import shlex

    from tests.conftest import ROOT
    page = (ROOT / "docs" / "containers.md").read_text()
    cname = container.name("20261207-1003-ab12", "gpu01")
    run_mounts = container.mounts(["/home/me/.torchfleet/runs/20261207-1003-ab12/gpu01",
                                   "/srv/train", "/data/shards"])
    torchrun = ["python3", "-m", "torch.distributed.run", "--nnodes", "2", "...",
                "/srv/train/train.py"]
    env = {"NCCL_SOCKET_IFNAME": "eth0", "TORCHFLEET_RUN_ID": "x"}
    for runtime, img in (("podman", NGC), ("docker", NGC), ("apptainer", "/images/pytorch-24.05.sif"),
                         ("enroot", "/images/pytorch-24.05.sqsh")):
        names, _env = container.run_env(runtime, env, True)
        lines = [container.create_argv(runtime, img, cname),
                 container.run_argv(runtime, img, cname, torchrun, names, run_mounts, gpus=True,
                                    ib=True, workdir="/srv/train"),
                 container.remove_argv(runtime, cname)]
        for argv in filter(None, lines):
            assert "    " + shlex.join(argv) + "\n" in page, (runtime, shlex.join(argv))
    archive = "/images/pytorch-24.05.tar"
    local = container.local_image("podman", archive, stat=lambda path: SimpleNamespace(
        st_mode=0o100644, st_size=9876543210, st_mtime_ns=1733565600 * 10**9))
    for argv in (container.present_argv("podman", local), container.load_argv("podman", archive),
                 container.tag_argv("podman", NGC, local)):
        assert "    " + shlex.join(argv) + "\n" in page, shlex.join(argv)
    srun = container.srun_argv(NGC, run_mounts, torchrun, 2, workdir="/srv/train")
    assert shlex.join(srun) in (ROOT / "docs" / "slurm.md").read_text()
    # enroot with pyxis's reference (the run user's cache under /home/me), and the probes.
    monkeypatch.setenv("HOME", "/home/me")
    ref = "nvcr.io#nvidia/pytorch:24.05-py3"
    probe_name = container.probe_name("gpu01", 4242, "1a2b3c4d")
    probe = ["python3", "-c", "<probe>"]
    venv = [("/opt/venv", "/opt/venv")]
    for argv in (container.pull_argv("enroot", ref), container.create_argv("enroot", ref, cname),
                 container.in_image_argv("podman", NGC, probe, venv),
                 container.in_image_argv("apptainer", "/images/pytorch-24.05.sif", probe, venv),
                 container.create_argv("enroot", "/images/pytorch-24.05.sqsh", probe_name),
                 container.in_image_argv("enroot", "/images/pytorch-24.05.sqsh", probe, venv,
                                         cname=probe_name),
                 container.remove_argv("enroot", probe_name)):
        assert "    " + shlex.join(argv) + "\n" in page, shlex.join(argv)


# A CDI spec as `nvidia-ctk cdi generate` writes it (its first lines).
CDI_SPEC = b"""---
cdiVersion: 0.5.0
containerEdits:
  deviceNodes:
  - path: /dev/nvidia-modeset
devices:
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
  name: "0"
kind: nvidia.com/gpu
"""


def test_container_gpu_podman_needs_a_cdi_spec_of_kind_nvidia_gpu(tmp_path):
    etc, run = tmp_path / "etc-cdi", tmp_path / "run-cdi"
    etc.mkdir()
    (etc / "other.yaml").write_bytes(b"kind: vendor.com/fpga\n")
    why = image.gpu_error("podman", cdi_dirs=(str(etc), str(run)))
    assert why == "no CDI spec of kind nvidia.com/gpu in %s or %s" % (etc, run)
    (etc / "nvidia.yaml").write_bytes(CDI_SPEC)
    assert image.gpu_error("podman", cdi_dirs=(str(etc), str(run))) is None


def test_container_gpu_docker_and_enroot_need_nvidias_hooks(tmp_path):
    assert "nvidia-container-runtime-hook" in image.gpu_error("docker", which=lambda t: None)
    assert image.gpu_error("docker", which=lambda t: "/usr/bin/" + t) is None
    hook = tmp_path / "98-nvidia.sh"
    assert "hook" in image.gpu_error("enroot", which=lambda t: "/usr/bin/" + t,
                                     enroot_hook=str(hook))
    hook.write_text("#!/bin/sh\n")
    assert image.gpu_error("enroot", which=lambda t: "/usr/bin/" + t, enroot_hook=str(hook)) \
        is None
    assert image.gpu_error("apptainer", which=lambda t: None) is None  # (--nv binds the libs)


def test_container_gpu_is_judged_only_with_nccl_on_hosts_with_gpus():
    bad = dict(probe(digest="sha256:" + "a" * 64)["container"], gpu_error="no CDI spec")
    good = dict(bad, gpu_error=None)
    probes = {"n0": {"container": good}, "n1": {"container": bad},
              "n2": probe(digest="sha256:" + "a" * 64)}  # (no GPUs: not probed)
    gpu = [(r["host"], r["ok"]) for r in container_checks(probes, "n0", "nccl")
           if r["id"] == "container.gpu"]
    assert gpu == [("n0", True), ("n1", False)]
    assert not [r for r in container_checks(probes, "n0", "gloo") if r["id"] == "container.gpu"]
    [record] = [r for r in container_checks(probes, "n0", "nccl")
                if r["id"] == "container.gpu" and not r["ok"]]
    assert "nvidia-ctk cdi generate" in record["hint"]


def test_the_agent_passes_the_runs_env_by_name_never_a_value_on_the_command_line(tmp_path):
    from ansible_collections.torchfleet.fleet.plugins.module_utils.run import agent
    p = {"container_runtime": "podman", "container_image": NGC, "run_id": "r1", "host": "node0",
         "attempt": 0, "run_dir": str(tmp_path / "run"), "chdir": "/srv/train",
         "data_paths": ["/data/shards"], "container_mounts": ["/opt/venv"],
         "container_options": [], "container_gpus": True, "network": "ib",
         "checkpoint_dir": "ckpt", "flight_recorder": 0,
         "env": {"WANDB_API_KEY": "s3cret-value", "NCCL_DEBUG": "WARN"}}
    box = agent.Box(p, "/srv/train/train.py")
    extra = agent.rank_env(p, box)
    argv, runtime_env = box.wrap(["python3", "-m", "torch.distributed.run", "train.py"], extra)
    assert not any("s3cret-value" in a for a in argv)
    assert argv[argv.index("WANDB_API_KEY") - 1] == "--env" and "TORCHFLEET_RUN_ID" in argv
    assert runtime_env["WANDB_API_KEY"] == "s3cret-value"
    volumes = [argv[i + 1] for i, a in enumerate(argv) if a == "--volume"]
    assert volumes == ["%s:%s" % (tmp_path / "run", tmp_path / "run"), "/srv/train:/srv/train",
                       "/srv/train/ckpt:/srv/train/ckpt", "/data/shards:/data/shards",
                       "/opt/venv:/opt/venv"]
    assert argv[argv.index("--workdir") + 1] == "/srv/train"
    assert "nvidia.com/gpu=all" in argv and "/dev/infiniband" in argv
    assert box.name == NAME


def test_a_pull_the_registry_refuses_for_a_moment_is_tried_again_and_a_missing_image_is_not():
    # 512 hosts pulling at once: nvcr.io's 429 to some of them passes; a 404 does not.
    slept = []
    for errors, tries, ok in (
            (["Error: initializing source docker://nvcr.io/nvidia/pytorch:24.05-py3: reading "
              "manifest 24.05-py3 in nvcr.io/nvidia/pytorch: toomanyrequests: 429 Too Many "
              "Requests"], 2, True),
            (["received unexpected HTTP status: 503 Service Unavailable"] * 3, 3, False),
            (["Error: initializing source docker://nvcr.io/nvidia/pytorch:99.99: reading manifest "
              "99.99 in nvcr.io/nvidia/pytorch: manifest unknown"], 1, False),
            # (a tag's number is no HTTP status)
            (["reading manifest build-503 in reg.example/pt: manifest unknown"], 1, False)):
        answers = list(errors) + [None]
        calls = []

        def run(argv, timeout_s, calls=calls, answers=answers):
            calls.append(argv)
            return "", answers.pop(0)
        why = image.pull("podman", NGC, NGC, run, 1800.0, sleep=slept.append)
        assert len(calls) == tries and calls[0] == ["podman", "pull", "--quiet", NGC]
        assert (why is None) == ok
        if not ok:
            assert why.startswith("not here, and podman pull failed") and errors[-1][:40] in why
    assert len(slept) == 3 and all(10 <= s <= 60 for s in slept)
    # No retry where less than a minute of the pull's time would be left.
    calls = []
    why = image.pull("podman", NGC, NGC, lambda argv, timeout_s: calls.append(argv) or (
        "", "429 Too Many Requests"), 30.0, sleep=slept.append)
    assert len(calls) == 1 and "429" in why
