"""Bad input: one clear sentence naming the variable and the fix, a non-zero exit, and
nothing started on any host."""
from __future__ import annotations

import json

import pytest

from tests.conftest import FIXTURES
from tests.integration.playbook import playbook

pytestmark = pytest.mark.integration


def assert_no_host_touched(run):
    assert "Probe the host" not in run.out and "Start torchrun" not in run.out


@pytest.mark.parametrize("value", ["0", "-1"])
def test_nnodes_below_one(tmp_path, value):
    run = playbook("train.yml", tmp_path, "-e", "nnodes=%s" % value)
    assert run.rc != 0
    assert run.failing() == [("world.size", "controller")]
    assert "nnodes=%s: at least one node is needed" % value in run.out
    assert_no_host_touched(run)


def test_nnodes_not_a_number(tmp_path):
    run = playbook("preflight.yml", tmp_path, "-e", "nnodes=two")
    assert run.rc != 0 and "nnodes" in run.out and "int" in run.out
    assert_no_host_touched(run)


def table_rows(out):
    """(host, check, verdict, detail) of each row of the preflight's table in `out`, a cell's
    wrapped lines joined again (reports/table.py wraps long cells between words)."""
    lines = out.splitlines()
    top = next(i for i, line in enumerate(lines) if line.split()[:4] == [
        "HOST", "CHECK", "VERDICT", "DETAIL"])
    starts = [0] + [i + 2 for i, c in enumerate(lines[top + 1]) if c == " "
                    and lines[top + 1][i + 1:i + 2] == " "]
    rows = []
    for line in lines[top + 2:]:
        if not line.strip():
            break
        cells = [line[a:b].strip() for a, b in zip(starts, starts[1:] + [None], strict=True)]
        if cells[0]:
            rows.append(cells)
        else:  # a continuation line: each cell's next words
            rows[-1] = [(old + " " + new).strip() for old, new in zip(rows[-1], cells, strict=True)]
    return [tuple(r[:4]) for r in rows]


# Every value the controller refuses before it touches a host (run_plan's input.* checks), many
# in one run: input_errors reports each bad value of a run, so a run with several is as many
# failing checks, each with its own sentence (tests/unit/test_run_plan.py checks each sentence
# alone). A variable holds one value a run, hence three runs; each of the three entry playbooks
# takes one (they share preflight's run_plan). spares=1 is too many only beside nnodes=2 and
# collective_isolate nothing to pair only beside nnodes=1: not in the same run.
HCA_PWN = "mlx5_0;touch /tmp/tf-pwned"
BAD_TOGETHER = {
    "train.yml": (
        ["-e", "master_port=0", "-e", "spares=1", "-e", "max_restarts=-1",
         "-e", "restart_on=often", "-e", "nproc_per_node=0", "-e", "data_paths=notalist",
         "-e", "collective_isolate=true", "-e", "collective_isolate_schedule=star",
         "-e", json.dumps({"network": "ib", "nccl_ib_hca": HCA_PWN}), "-e", "health=deep"],
        [("input.master_port", "master_port=0 is not a TCP port"),
         ("input.spares", "spares=1 with nnodes=2 needs 3 hosts, and group `nodes` has 2"),
         ("input.max_restarts", "max_restarts=-1 is not a whole number from 0 to 5"),
         ("input.restart_on", "restart_on=often is neither host nor any"),
         ("input.nproc_per_node", "nproc_per_node=0 is not a positive number"),
         # -e data_paths=notalist arrives as a string, which an argument spec would turn into
         # a one-element list and preflight report as a missing path.
         ("input.data_paths", "data_paths=notalist is not a list of paths"),
         ("input.collective_isolate_schedule",
          "collective_isolate_schedule=star is not a schedule"),
         ("input.nccl_ib_hca", "nccl_ib_hca=%s is not a list of HCA names" % HCA_PWN),
         ("input.health", "health=deep is not a level")]),
    "preflight.yml": (
        ["-e", "master_port=70000", "-e", "spares=two", "-e", "max_restarts=two",
         "-e", "nproc_per_node=eight",
         "-e", json.dumps({"data_paths": ["/data/ok", "shards/train"]}),
         "-e", json.dumps({"network": "ib", "nccl_ib_hca": "$(id)",
                           "nccl_ib_gid_index": "three"}),
         "-e", "health_slow_pct=fast"],
        [("input.master_port", "master_port=70000 is not a TCP port"),
         ("input.spares", "spares=two is not a whole number >= 0"),
         ("input.max_restarts", "max_restarts=two is not a whole number from 0 to 5"),
         ("input.nproc_per_node", "nproc_per_node=eight is not a positive number"),
         ("input.data_paths", "data_paths holds relative path(s) shards/train: each host "
          "would resolve them against a different directory"),
         ("input.nccl_ib_hca", "nccl_ib_hca=$(id) is not a list of HCA names"),
         ("input.nccl_ib_gid_index", "nccl_ib_gid_index=three is not a GID table index"),
         ("input.health", "health_slow_pct=fast is not a number >= 0")]),
    "collective.yml": (
        ["-e", "nnodes=1", "-e", "collective_isolate=true", "-e", "spares=-1",
         "-e", "health_xid_window_s=-5", "-e", "container_image=nvcr.io/nvidia/pytorch:24.05-py3",
         "-e", json.dumps({"container_mounts": ["/opt/venv", "data"]})],
        [("input.collective_isolate",
          "collective_isolate pairs hosts, and nnodes=1 leaves nothing to pair"),
         ("input.spares", "spares=-1 is not a whole number >= 0"),
         ("input.health", "health_xid_window_s=-5 is not a whole number >= 0"),
         ("input.container", "container_mounts entry 'data' is not an absolute path or an "
          "/host/path:/container/path pair")]),
}


@pytest.mark.parametrize("name", list(BAD_TOGETHER))
def test_every_bad_value_of_a_run_is_a_check_of_its_own_naming_it(tmp_path, name):
    extra, expected = BAD_TOGETHER[name]
    run = playbook(name, tmp_path, *extra)
    assert run.rc != 0
    assert run.failing() == sorted((cid, "controller") for cid, _ in expected)
    assert sorted((c["id"], c["detail"]) for c in run.report()["checks"]
                  if not c["ok"]) == sorted(expected)
    # What the user reads: a row of the preflight's table for each, with its sentence.
    rows = table_rows(run.out)
    for cid, detail in expected:
        assert ("controller", cid, "FAIL", detail) in rows, (cid, detail, run.out[-5000:])
    assert_no_host_touched(run)


def test_too_few_gpus_and_a_script_missing_on_the_hosts_start_nothing(tmp_path):
    """What only the hosts can tell, both in one run: each host's probe reports every check."""
    run = playbook("train.yml", tmp_path, "-e", "backend=nccl", "-e", "nproc_per_node=4",
                   "-e", "script=%s" % (tmp_path / "nope.py"))
    assert run.rc != 0
    assert run.failing() == [("gpu.count", "node0"), ("gpu.count", "node1"),
                             ("script.missing", "node0"), ("script.missing", "node1")]
    assert "Start torchrun" not in run.out and not (tmp_path / "run" / "train.json").exists()


def test_data_paths_not_a_list(tmp_path):
    """A mapping is refused by the role's argument spec, before run_plan (and its input.*
    checks) runs: a run of its own."""
    run = playbook("preflight.yml", tmp_path, "-e", json.dumps({"data_paths": {"a": 1}}))
    assert run.rc != 0 and "data_paths" in run.out and "list" in run.out
    assert_no_host_touched(run)


@pytest.mark.parametrize("inventory_text", ["", "all:\n  children:\n    workers:\n      hosts:\n"
                                                "        w0:\n          ansible_connection: local\n"])
def test_inventory_without_group_nodes(tmp_path, inventory_text):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(inventory_text)
    run = playbook("preflight.yml", tmp_path, inventory=inventory)
    assert run.rc != 0
    assert "The inventory has no hosts in group `nodes`" in run.out
    assert_no_host_touched(run)


def test_run_dir_not_writable(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    run = playbook("preflight.yml", tmp_path, "-e", "run_dir=%s/run" % blocker)
    assert run.rc != 0
    assert "cannot write preflight.json in %s/run" % blocker in run.out
    assert "-e run_dir=" in run.out


def test_hostile_data_paths_are_only_looked_at(tmp_path):
    canary = tmp_path / "canary"
    # Absolute (relative ones are refused before any host): they reach every host's probe.
    hostile = ["/$(touch %s)" % canary, "/`touch %s`" % canary, "/; touch %s" % canary,
               "/-rf", "/a path with spaces"]
    run = playbook("preflight.yml", tmp_path, "-e", json.dumps({"data_paths": hostile}))
    assert run.rc != 0
    assert run.failing() == [("data.missing", "node0"), ("data.missing", "node1")]
    assert not canary.exists()


def test_a_run_id_used_before_is_named_before_anything_starts(tmp_path):
    run_id = "reused-%d" % tmp_path.stat().st_ino
    first = playbook("train.yml", tmp_path / "a", "-e", "run_id=%s" % run_id,
                     "-e", "script=%s" % (FIXTURES / "scripts" / "steps_notorch.py"),
                     "-e", json.dumps({"script_args": ["/"]}))  # (no torch; / exists: it ends)
    assert first.rc == 0, first.out[-3000:]
    again = playbook("train.yml", tmp_path / "b", "-e", "run_id=%s" % run_id,
                     "-e", "train_steps=5")
    assert again.rc != 0
    assert again.failing() == [("run_id.used", "node0"), ("run_id.used", "node1")]
    assert "Start this host's agent" not in again.out
