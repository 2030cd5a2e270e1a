"""The `torchfleet` command as a user runs it: exit status 0/1/2 and --json on stdout."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from lab.ports import free_port

pytestmark = pytest.mark.integration

CHECK_KEYS = {"host", "id", "ok", "detail", "hint", "severity", "gpu"}  # preflight.json's own
RESULT_KEYS = {"kind", "ok", "run_id", "run_dir", "checks", "hosts", "ranks", "busbw",
               "isolation", "first_failure", "preflight", "cancelled", "detached",
               "ansible_status", "ansible_rc", "failures", "verdict", "attempts", "drain",
               "hardware", "hardware_dropped", "stragglers", "straggle", "goodput", "actions"}


def torchfleet(*args, cwd):
    exe = shutil.which("torchfleet") or sys.exit("torchfleet is not installed")
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_preflight_json_ok_exits_0_and_parses_as_the_documented_schema(tmp_path):
    proc = torchfleet("preflight", "--json", "-e", "master_port=%d" % free_port(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # nothing but the JSON on stdout
    assert set(result) == RESULT_KEYS
    assert result["kind"] == "preflight" and result["ok"] is True and result["failures"] == []
    assert all(set(c) == CHECK_KEYS for c in result["checks"])
    assert result["run_dir"] == str(tmp_path / "runs" / result["run_id"])
    assert os.path.isfile(os.path.join(result["run_dir"], "preflight.json"))
    # The same run directory contract as the playbooks': 0750, runs/latest moved to it.
    assert os.stat(result["run_dir"]).st_mode & 0o777 == 0o750
    assert os.path.realpath(tmp_path / "runs" / "latest") == result["run_dir"]


def test_failed_check_exits_1_and_names_host_check_and_fix(tmp_path):
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = torchfleet("preflight", "-e", "master_port=%d" % port, cwd=tmp_path)
        as_json = torchfleet("preflight", "--json", "-e", "master_port=%d" % port, cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stdout.startswith("torchfleet preflight failed: 1 problem(s) on node0 (port.in_use)")
    assert "fix:" in proc.stdout
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout)["verdict"] == "preflight failed: 1 problem(s) on node0 (port.in_use)"
    assert [(f["host"], f["id"]) for f in json.loads(as_json.stdout)["failures"]] == [
        ("node0", "port.in_use")]


@pytest.mark.parametrize("args, message", [
    (["preflight", "-i", "/nonexistent.yml"], "does not exist"),
    (["preflight", "-e", "novalue"], "KEY=VALUE"),
    (["launch"], "invalid choice"),
    (["report", "/nonexistent-run-dir"], "no preflight.json"),
    (["preflight", "--runs-root", "/dev/null/runs"],
     "cannot create the run directory /dev/null/runs/"),
])
def test_usage_errors_exit_2_with_one_sentence(tmp_path, args, message):
    proc = torchfleet(*args, cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert not (tmp_path / "runs").exists()  # nothing was started


def test_report_writes_html_for_a_run(tmp_path, collective_run):
    result, _ = collective_run
    proc = torchfleet("report", str(result.run_dir), "-o", str(tmp_path / "r.html"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / "r.html")
    html = (tmp_path / "r.html").read_text()
    assert "busbw-chart" in html and "<script" not in html and "http://" not in html.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")
