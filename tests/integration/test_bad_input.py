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


@pytest.mark.parametrize("value", ["0", "70000"])
def test_master_port_out_of_range(tmp_path, value):
    run = playbook("train.yml", tmp_path, "-e", "master_port=%s" % value)
    assert run.rc != 0
    assert run.failing() == [("input.master_port", "controller")]
    assert "master_port=%s is not a TCP port" % value in run.out
    assert_no_host_touched(run)


@pytest.mark.parametrize("value,detail", [
    ("-1", "spares=-1 is not a whole number >= 0"),
    ("two", "spares=two is not a whole number >= 0"),
    ("1", "spares=1 with nnodes=2 needs 3 hosts, and group `nodes` has 2")])
def test_spares_not_a_count_the_inventory_holds(tmp_path, value, detail):
    run = playbook("train.yml", tmp_path, "-e", "spares=%s" % value)
    assert run.rc != 0
    assert run.failing() == [("input.spares", "controller")]
    assert [c["detail"] for c in run.report("preflight.json")["checks"] if not c["ok"]] == [detail]
    assert_no_host_touched(run)


@pytest.mark.parametrize("var,value,check_id,detail", [
    ("max_restarts", "-1", "input.max_restarts", "max_restarts=-1 is not a whole number from 0 to 5"),
    ("max_restarts", "two", "input.max_restarts", "max_restarts=two is not a whole number from 0 to 5"),
    ("restart_on", "often", "input.restart_on", "restart_on=often is neither host nor any")])
def test_restarts_not_a_count_or_a_cause(tmp_path, var, value, check_id, detail):
    run = playbook("train.yml", tmp_path, "-e", "%s=%s" % (var, value))
    assert run.rc != 0
    assert run.failing() == [(check_id, "controller")]
    assert [c["detail"] for c in run.report("preflight.json")["checks"] if not c["ok"]] == [detail]
    assert_no_host_touched(run)


@pytest.mark.parametrize("value", ["0", "eight"])
def test_nproc_per_node_not_positive(tmp_path, value):
    run = playbook("train.yml", tmp_path, "-e", "nproc_per_node=%s" % value)
    assert run.rc != 0
    assert run.failing() == [("input.nproc_per_node", "controller")]
    assert_no_host_touched(run)


def test_nproc_per_node_larger_than_the_gpus(tmp_path):
    run = playbook("train.yml", tmp_path, "-e", "backend=nccl", "-e", "nproc_per_node=4")
    assert run.rc != 0
    assert ("gpu.count", "node0") in run.failing()
    assert "Start torchrun" not in run.out


def test_a_script_missing_on_the_hosts_starts_nothing(tmp_path):
    run = playbook("train.yml", tmp_path, "-e", "script=%s" % (tmp_path / "nope.py"))
    assert run.rc != 0
    assert run.failing() == [("script.missing", "node0"), ("script.missing", "node1")]
    assert "Start torchrun" not in run.out and not (tmp_path / "run" / "train.json").exists()


def test_data_paths_not_a_list(tmp_path):
    run = playbook("preflight.yml", tmp_path, "-e", json.dumps({"data_paths": {"a": 1}}))
    assert run.rc != 0 and "data_paths" in run.out and "list" in run.out
    assert_no_host_touched(run)


@pytest.mark.parametrize("value, sentence", [
    ("notalist", "data_paths=notalist is not a list of paths"),
    ({"data_paths": ["/data/ok", "shards/train"]},
     "data_paths holds relative path(s) shards/train"),
])
def test_data_paths_a_string_or_relative_is_refused_naming_data_paths(tmp_path, value, sentence):
    # -e data_paths=notalist arrives as a string, which the argument spec would turn into a
    # one-element list and preflight report as a missing path.
    extra = "data_paths=%s" % value if isinstance(value, str) else json.dumps(value)
    run = playbook("preflight.yml", tmp_path, "-e", extra)
    assert run.rc != 0
    assert run.failing() == [("input.data_paths", "controller")]
    (bad,) = [c for c in run.report()["checks"] if c["id"] == "input.data_paths"]
    assert sentence in bad["detail"]
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


@pytest.mark.parametrize("extra, check_id, sentence", [
    (["-e", "nnodes=1", "-e", "collective_isolate=true"], "input.collective_isolate",
     "collective_isolate pairs hosts, and nnodes=1 leaves nothing to pair"),
    (["-e", "collective_isolate=true", "-e", "collective_isolate_schedule=star"],
     "input.collective_isolate_schedule", "collective_isolate_schedule=star is not a schedule"),
])
def test_pair_rounds_asked_for_one_host_or_an_unknown_schedule(tmp_path, extra, check_id,
                                                                sentence):
    run = playbook("collective.yml", tmp_path, *extra)
    assert run.rc != 0
    assert run.failing() == [(check_id, "controller")]
    (bad,) = [c for c in run.report()["checks"] if c["id"] == check_id]
    assert sentence in bad["detail"] and check_id in run.out
    assert_no_host_touched(run)


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


@pytest.mark.parametrize("var, value, cid", [
    ("nccl_ib_hca", "mlx5_0;touch /tmp/tf-pwned", "input.nccl_ib_hca"),
    ("nccl_ib_hca", "$(id)", "input.nccl_ib_hca"),
    ("nccl_ib_gid_index", "three", "input.nccl_ib_gid_index"),
])
def test_an_hca_or_gid_index_that_is_not_a_name_or_integer(tmp_path, var, value, cid):
    run = playbook("train.yml", tmp_path, "-e", json.dumps({"network": "ib", var: value}))
    assert run.rc != 0
    assert run.failing() == [(cid, "controller")]
    assert "%s=%s is not" % (var, value) in run.out
    assert_no_host_touched(run)


@pytest.mark.parametrize("var,value,detail", [
    ("health", "deep", "health=deep is not a level"),
    ("health_slow_pct", "fast", "health_slow_pct=fast is not a number >= 0"),
    ("health_xid_window_s", "-5", "health_xid_window_s=-5 is not a whole number >= 0")])
def test_a_health_level_or_threshold_that_makes_no_sense(tmp_path, var, value, detail):
    run = playbook("preflight.yml", tmp_path, "-e", "%s=%s" % (var, value))
    assert run.rc != 0
    assert run.failing() == [("input.health", "controller")]
    assert [c["detail"] for c in run.report("preflight.json")["checks"] if not c["ok"]] == [detail]
    assert_no_host_touched(run)
