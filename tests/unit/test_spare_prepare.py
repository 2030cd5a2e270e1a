"""spare_prepare: a detached import on the spare, its record, its bound; never a failure."""
from __future__ import annotations

import json
import os
import sys

from ansible_collections.torchfleet.fleet.plugins.modules import spare_prepare

from .modules import run_module
from .test_gpuwatch import until


def record_when(path, key):
    def read():
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return rec if key in rec else None
    return until(read, 60)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open("/proc/%d/stat" % pid) as f:  # a zombie (this test's child) is gone for a user
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_the_imports_run_detached_and_say_how_long_they_took(tmp_path, capsys):
    path = tmp_path / "run" / "node5" / "spare_prepare_0.json"
    result = run_module(spare_prepare, {"python": sys.executable, "path": str(path),
                                        "imports": ["json", "sqlite3"]}, capsys)
    assert result["prepared"] and result["changed"] and result["record"] == str(path)
    rec = record_when(path, "ok")
    assert rec["ok"] is True and rec["pid"] == result["pid"] and rec["seconds"] >= 0
    assert rec["imports"] == ["json", "sqlite3"]
    until(lambda: not alive(result["pid"]), 60)
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"


def test_an_import_that_fails_is_said_in_the_record(tmp_path, capsys):
    path = tmp_path / "prep.json"
    result = run_module(spare_prepare, {"python": sys.executable, "path": str(path),
                                        "imports": ["json", "no_such_module_here"]}, capsys)
    rec = record_when(path, "ok")
    assert result["prepared"] and rec["ok"] is False
    assert rec["error"].startswith("ModuleNotFoundError: No module named 'no_such_module_here'")


def test_an_import_that_never_ends_ends_at_its_bound(tmp_path, capsys):
    """A spare whose storage hangs: the process ends itself at timeout_s, its PID on record.
    The module is found through the run's env (its PYTHONPATH), as the ranks would find it."""
    slow = tmp_path / "mods"
    slow.mkdir()
    (slow / "hangs_forever.py").write_text("import time\ntime.sleep(3600)\n")
    path = tmp_path / "prep.json"
    result = run_module(spare_prepare, {"python": sys.executable, "path": str(path),
                                        "imports": ["hangs_forever"], "timeout_s": 1,
                                        "env": {"PYTHONPATH": str(slow)}}, capsys)
    assert result["prepared"]
    assert json.loads(path.read_text())["pid"] == result["pid"]
    until(lambda: not alive(result["pid"]), 30)
    assert "ok" not in json.loads(path.read_text())  # ended by its bound: no verdict invented


def test_a_missing_interpreter_is_said_not_failed(tmp_path, capsys):
    path = tmp_path / "prep.json"
    result = run_module(spare_prepare, {"python": str(tmp_path / "no-python"),
                                        "path": str(path)}, capsys)
    assert not result.get("failed") and result["prepared"] is False and result["pid"] is None
    assert "no-python: not prepared:" in result["msg"] and not path.exists()


def test_an_earlier_record_is_not_taken_for_this_one(tmp_path, capsys):
    path = tmp_path / "prep.json"
    path.write_text(json.dumps({"pid": 1, "ok": True, "seconds": 0.1}))
    result = run_module(spare_prepare, {"python": sys.executable, "path": str(path),
                                        "imports": ["json"]}, capsys)
    assert record_when(path, "ok")["pid"] == result["pid"]


def test_check_mode_starts_nothing(tmp_path, capsys):
    path = tmp_path / "prep.json"
    result = run_module(spare_prepare, {"python": sys.executable, "path": str(path),
                                        "_ansible_check_mode": True}, capsys)
    assert result["prepared"] is False and not path.exists()


def test_a_bound_below_a_second_is_refused(tmp_path, capsys):
    result = run_module(spare_prepare, {"python": sys.executable,
                                        "path": str(tmp_path / "p.json"), "timeout_s": 0}, capsys)
    assert result["failed"] and "timeout_s must be at least 1 (it is 0)" in result["msg"]
