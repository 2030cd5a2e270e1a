"""The lab as a non-root login (tflab<N>-user on every node), as real clusters log in: the
collective test, a hang with its stacks, and stop, through that user's SSH and venv. The stop's
ranks import no torch (steps_notorch.py: only the control plane is under test; a stop of real
torch ranks is test_launch_local's); the collective and the hang run real torch."""
from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import stat
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from tests.integration.playbook import Run, playbook
from tests.lab.conftest import runs_root
from tests.lab.test_reliability_lab import NOTORCH, processes_of, start_long_train, wait_until
from lab import netns as labmod
from lab import podman as labpodman
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import container, stacks

# slow: docs/testing.md's tiers (bash tests/run --all, or --touching a source it covers)
pytestmark = [pytest.mark.lab, pytest.mark.slow]


REMOTE_RUNS = runs_root(Path(__file__).stem)  # the root login's remote_runs_root


def user_runs(lab):
    return lab.user_dir / "home" / ".torchfleet" / "runs"


def user_script(lab, name):
    """A test script where the user can read it (the clone may be in root's home)."""
    folder = lab.user_dir / "scripts"
    folder.mkdir(mode=0o755, exist_ok=True)
    path = folder / name
    shutil.copy(FIXTURES / "scripts" / name, path)
    path.chmod(0o644)
    return path


def test_collective_as_a_non_root_user_in_private_run_directories(healthy_lab, tmp_path):
    run = playbook("collective.yml", tmp_path, "-e", "nnodes=2", "-e", "collective_sizes=4K",
                   "-e", "collective_iters=3", inventory=healthy_lab.user_inventory)
    assert run.rc == 0, run.out[-3000:]
    report = run.report("collective.json")
    assert report["ok"] and {h["outcome"] for h in report["hosts"]} == {"succeeded"}
    uid = pwd.getpwnam(labmod.user_name(healthy_lab.tag)).pw_uid
    host_dir = user_runs(healthy_lab) / report["run_id"] / "node0"
    for path in (host_dir, host_dir.parent):  # this host's part and the run's directory
        assert path.stat().st_uid == uid and stat.S_IMODE(path.stat().st_mode) == 0o700
    # What preflight says of py-spy here follows the kernel's rules for this user.
    facts = stacks.attach_facts(str(healthy_lab.user_python), cap_eff=False)  # (uid: not root)
    verdicts = {c["host"]: c["ok"] for c in run.report()["checks"] if c["id"] == "hang.stacks"}
    assert verdicts == {"node0": facts["can_attach"], "node1": facts["can_attach"]}
    # And of the kernel log a run's agent follows for hardware events: kernel.dmesg_restrict.
    restricted = Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() == "1"
    kmsg = {c["host"]: c for c in run.report()["checks"] if c["id"] == "host.kmsg"}
    assert set(kmsg) == ({"node0", "node1"} if restricted else set()), kmsg
    assert all(c["severity"] == "warning" and "dmesg_restrict" in c["hint"]
               for c in kmsg.values())


def test_a_hang_as_a_non_root_user_is_diagnosed_with_stacks(healthy_lab, tmp_path):
    script = user_script(healthy_lab, "hang_rank1.py")
    run = playbook("train.yml", tmp_path, "-e", "nnodes=2", "-e", "script=%s" % script,
                   "-e", "hang_timeout_s=6", inventory=healthy_lab.user_inventory)
    assert run.rc != 0
    report = run.report("train.json")
    assert {h["outcome"] for h in report["hosts"]} == {"hung"}, report["hosts"]
    dumps = sorted(run.run_dir.glob("logs/*/attempt_0/*/py-spy-dump.txt"))
    assert len(dumps) == 2
    texts = [d.read_text() for d in dumps]
    assert any("hang_rank1.py:9" in t or 'hang_rank1.py", line 9' in t for t in texts), texts
    assert wait_until(lambda: not processes_of(report["run_id"]), 60)


def test_stop_as_a_non_root_user(healthy_lab, tmp_path):
    proc, run_id = start_long_train(healthy_lab, tmp_path, inventory=healthy_lab.user_inventory,
                                    runs=user_runs(healthy_lab),
                                    script=user_script(healthy_lab, "steps_notorch.py"))
    try:
        stop = playbook("stop.yml", tmp_path / "stop", "-e", "run_id=%s" % run_id,
                        inventory=healthy_lab.user_inventory)
        assert stop.rc == 0, stop.out[-3000:]
        assert "stopped run(s) %s" % run_id in stop.out
        assert wait_until(lambda: not processes_of(run_id), 60), processes_of(run_id)
    finally:
        proc.kill()
        proc.communicate(timeout=120)
    assert json.loads((user_runs(healthy_lab) / run_id / "node0" / "torchrun.pid")
                      .read_text())["run_id"] == run_id


# ---- Containers (container_image; docs/containers.md): podman in the lab's hosts --------------
# This lab's hosts also serve the root login (lab.inventory); each test below gives the hosts it
# uses the lab's podman settings (lab/podman.py: runc, no rlimits, storage of its own) through
# sshd's SetEnv, which the healthy_lab fixture's heal() takes away again; the runs' extra vars
# are lab/podman.py's (the image, the venv mounted, --ulimit host), as the bench's are.
CONTAINER = labpodman.EXTRA_VARS


def with_podman(lab, storages):
    """Give each host its podman settings ({host: storage}); skip where podman cannot run."""
    reason = labpodman.unavailable()
    if reason:
        pytest.skip(reason)
    labpodman.use_on(lab, storages)


def test_training_inside_a_podman_image_from_an_archive_on_two_hosts_leaves_no_container(
        healthy_lab, tmp_path):
    """The image given as an archive of `podman save` (container_image=/path/image.tar):
    node0's storage holds the image already (the load only adds the archive's tag), node1's
    is empty; preflight loads the archive on both, the ranks run in the loaded image."""
    with_podman(healthy_lab, {"node0": "main", "node1": "fresh"})
    archive = labpodman.archive()
    local = container.local_image("podman", str(archive))
    labpodman.podman("untag", local, check=False)  # (loaded by this run, not an earlier one)
    labpodman.podman("rmi", "--all", "--force", storage="fresh")
    run = playbook("train.yml", tmp_path, "-e", "nnodes=2", "-e", "train_steps=20",
                   "-e", "container_image=%s" % archive, *CONTAINER[2:],
                   inventory=healthy_lab.inventory)
    assert run.rc == 0, run.out[-3000:]
    report = run.report("train.json")
    assert report["ok"] and [(r["host"], r["rank"]) for r in report["ranks"]] == [
        ("node0", 0), ("node1", 1)]
    checks = {(c["id"], c["host"]): c for c in run.report()["checks"]}
    image_id = labpodman.ensure_image()
    for host in ("node0", "node1"):
        assert checks[("container.runtime", host)]["ok"]
        assert checks[("container.pull", host)]["detail"] == "%s loaded as %s" % (archive, local)
        assert checks[("container.digest", host)]["detail"] == "image id %s" % image_id[:19]
        assert checks[("python.torch", host)]["ok"]  # read in the image
    # node1 had no image: the one it ran is the archive's, under the archive's tag
    assert labpodman.podman("image", "inspect", "--format", "{{.Id}}", local,
                            storage="fresh").stdout.strip() == image_id
    pidfile = json.loads(next(REMOTE_RUNS.glob("%s/node1/torchrun.pid" % report["run_id"]))
                         .read_text())
    name = "torchfleet-%s-node1" % report["run_id"]
    assert pidfile["container"] == {"runtime": "podman", "name": name}
    argv = pidfile["argv"]
    assert argv[:5] == ["podman", "run", "--rm", "--name", name]
    assert argv[argv.index(local) + 1:][:3] == [sys.executable, "-m", "torch.distributed.run"]
    for storage in ("main", "fresh"):
        assert labpodman.containers("torchfleet-" + report["run_id"], storage) == []


def test_a_rank_failing_in_its_container_stops_the_other_hosts_container(healthy_lab, tmp_path):
    with_podman(healthy_lab, {"node0": "main", "node1": "main"})
    go = tmp_path / "go"  # (tmp_path is mounted: the ranks see the file appear)
    proc, run_id = start_long_train(
        healthy_lab, tmp_path, *CONTAINER[:4], "-e", json.dumps({
            "container_mounts": [sys.prefix, str(tmp_path)],
            "container_options": ["--ulimit", "host"], "script_args": [str(go), "1"]}),
        script=NOTORCH, go=go, runs=REMOTE_RUNS)
    try:
        running = labpodman.containers("torchfleet-" + run_id)
        assert sorted(running) == ["torchfleet-%s-node%d" % (run_id, i) for i in (0, 1)]
        go.write_text("go")  # rank 1 (node1) exits 3; rank 0 steps on until it is stopped
        out, _ = proc.communicate(timeout=180)
    finally:
        proc.kill()
    run = Run(proc.returncode, out, tmp_path / "run")
    assert run.rc != 0
    report = run.report("train.json")
    assert report["first_failure"]["host"] == "node1" and report["first_failure"]["rank"] == 1
    assert {h["host"]: h["outcome"] for h in report["hosts"]}["node0"] == "aborted"
    assert labpodman.containers("torchfleet-" + run_id) == []
    assert wait_until(lambda: not processes_of(run_id), 30), processes_of(run_id)


def test_another_image_on_one_host_is_container_digest_and_none_on_another_is_pull(
        healthy_lab, tmp_path):
    with_podman(healthy_lab, {"node0": "main", "node1": "other", "node2": "bare"})
    run = playbook("preflight.yml", tmp_path, "-e", "nnodes=3", *CONTAINER,
                   inventory=healthy_lab.inventory)
    assert run.rc != 0
    # (node2 has no image, so its Python cannot be read in it either: python.torch says so,
    # and its versions are none, as on a host without Python)
    assert run.failing() == [("container.digest", "node1"), ("container.pull", "node2"),
                             ("python.torch", "node2"), ("version.python", "node2"),
                             ("version.torch", "node2")]
    checks = {(c["id"], c["host"]): c for c in run.report()["checks"]}
    other = labpodman.ensure_image("other", marker="other")
    digest = checks[("container.digest", "node1")]["detail"]
    assert digest.startswith("image id %s here" % other[:19]) and digest.endswith("on node0")
    pull = checks[("container.pull", "node2")]
    # No registry is reachable here: the pull's own error is named, with the host.
    assert pull["detail"].startswith("%s: not here, and podman pull failed: " % labpodman.IMAGE)
    assert "node2" in pull["hint"]


def test_stop_yml_and_a_killed_controllers_lease_leave_no_container(healthy_lab, tmp_path):
    with_podman(healthy_lab, {"node0": "main", "node1": "main"})
    extra = ["-e", "lease_s=10", *CONTAINER]
    proc, run_id = start_long_train(healthy_lab, tmp_path / "a", *extra, script=NOTORCH,
                                    runs=REMOTE_RUNS)
    try:
        stop = playbook("stop.yml", tmp_path / "stop", "-e", "run_id=%s" % run_id,
                        inventory=healthy_lab.inventory)
        assert stop.rc == 0, stop.out[-3000:]
        assert wait_until(lambda: not labpodman.containers("torchfleet-" + run_id), 60)
        assert wait_until(lambda: not processes_of(run_id), 60), processes_of(run_id)
    finally:
        proc.kill()
        proc.communicate(timeout=120)
    # The controller dies without a word: the master stops the run after the lease, and every
    # host's agent removes its container.
    proc, run_id = start_long_train(healthy_lab, tmp_path / "b", *extra, script=NOTORCH,
                                    runs=REMOTE_RUNS)
    assert len(labpodman.containers("torchfleet-" + run_id)) == 2
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert wait_until(lambda: not labpodman.containers("torchfleet-" + run_id), 120), \
        labpodman.containers("torchfleet-" + run_id)
    assert wait_until(lambda: not processes_of(run_id), 60), processes_of(run_id)


def test_a_collective_test_and_a_hangs_stacks_inside_the_image(healthy_lab, tmp_path):
    with_podman(healthy_lab, {"node0": "main", "node1": "main"})
    run = playbook("collective.yml", tmp_path / "collective", "-e", "nnodes=2",
                   "-e", "collective_sizes=4K", "-e", "collective_iters=3", *CONTAINER,
                   inventory=healthy_lab.inventory)
    assert run.rc == 0, run.out[-3000:]
    report = run.report("collective.json")
    assert report["ok"] and {h["outcome"] for h in report["hosts"]} == {"succeeded"}
    assert labpodman.containers("torchfleet-" + report["run_id"]) == []
    # A hang: py-spy on the host reads every rank in its container by its host PID.
    run = playbook("train.yml", tmp_path / "hang", "-e", "nnodes=2",
                   "-e", "script=%s" % (FIXTURES / "scripts" / "hang_rank1.py"),
                   "-e", "hang_timeout_s=6", *CONTAINER, inventory=healthy_lab.inventory)
    assert run.rc != 0
    report = run.report("train.json")
    assert {h["outcome"] for h in report["hosts"]} == {"hung"}, report["hosts"]
    dumps = sorted(run.run_dir.glob("logs/*/attempt_0/*/py-spy-dump.txt"))
    assert len(dumps) == 2
    texts = [d.read_text() for d in dumps]
    assert any("hang_rank1.py:9" in t or 'hang_rank1.py", line 9' in t for t in texts), texts
    assert labpodman.containers("torchfleet-" + report["run_id"]) == []
    assert wait_until(lambda: not processes_of(report["run_id"]), 60)


def test_a_rank_the_oom_killer_ends_in_its_containers_memory_limit_is_named(healthy_lab,
                                                                            tmp_path):
    """Each container limited to 1.5 GiB (--memory, the container's own memory cgroup); rank 1
    allocates past it at step 5 and the kernel's OOM killer ends it: the host's agent reads the
    kernel's line in /dev/kmsg, whose PID is the rank's host PID."""
    with_podman(healthy_lab, {"node0": "main", "node1": "main"})
    run = playbook("train.yml", tmp_path, "-e", "nnodes=2", "-e", "nproc_per_node=1",
                   "-e", "script=%s" % (FIXTURES / "scripts" / "oom_rank.py"),
                   "-e", '{"script_args": ["1", "5"]}', *CONTAINER[:4],
                   "-e", json.dumps({"container_mounts": [sys.prefix], "container_options": [
                       "--ulimit", "host", "--memory", "1536m"]}),
                   inventory=healthy_lab.inventory)
    assert run.rc != 0
    report = run.report("train.json")
    assert report["verdict"].startswith(
        "train failed: node1 rank 1 was killed by the kernel's OOM killer (memory cgroup, "
        "anon-rss "), report["verdict"]
    event = report["first_failure"]["event"]
    assert event["kind"] == "oom" and event["line"].startswith(
        "Memory cgroup out of memory: Killed process %d (" % event["pid"])
    assert labpodman.containers("torchfleet-" + report["run_id"]) == []
    assert wait_until(lambda: not processes_of(report["run_id"]), 60)
