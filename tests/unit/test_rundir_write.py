"""rundir.write_json, the one writer of the files other processes read while they change (the
master's control.json and a run's pid and exit files, the looks' stop_request.json and
detached, the controller's run.json and attempt state): a reader sees the old file or the new
one, whole, and two writers at once both succeed."""
from __future__ import annotations

import os

import pytest

from ansible_collections.torchfleet.fleet.plugins.module_utils.run import rundir


def test_two_writers_of_one_file_at_once_both_succeed_and_leave_it_whole(tmp_path, monkeypatch):
    """Another writer replaces the file between this writer's write and its rename (two looks
    writing stop_request.json, a stop and a controller's end): with one temporary name for
    both, the other's open truncated this one's half and its rename took the file away
    (FileNotFoundError in this one's rename)."""
    path, real, first = str(tmp_path / "stop_request.json"), os.replace, []

    def replace(src, dst):
        if not first:
            first.append(src)
            rundir.write_json(path, {"why": "b"})  # the other writer, in between
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    mine = {"why": "a", "pad": "x" * 65536}
    rundir.write_json(path, mine)
    assert rundir.read_json(path) == mine
    assert os.listdir(tmp_path) == ["stop_request.json"]


def test_a_reader_between_the_write_and_the_rename_sees_the_old_file_whole(tmp_path,
                                                                          monkeypatch):
    path, real, seen = str(tmp_path / "torchrun.pid"), os.replace, []
    rundir.write_json(path, {"pid": 1})

    def replace(src, dst):
        seen.append(rundir.read_json(path))
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    rundir.write_json(path, {"pid": 2})
    assert seen == [{"pid": 1}] and rundir.read_json(path) == {"pid": 2}


def test_a_write_that_fails_leaves_the_old_file_and_nothing_beside_it(tmp_path):
    path = str(tmp_path / "control.json")
    rundir.write_json(path, {"phase": "running"}, indent=1)
    with pytest.raises(TypeError):
        rundir.write_json(path, {"bad": object()})
    assert rundir.read_json(path) == {"phase": "running"}
    assert os.listdir(tmp_path) == ["control.json"]
    assert os.stat(path).st_mode & 0o777 == 0o600
