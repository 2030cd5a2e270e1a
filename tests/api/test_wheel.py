"""The wheel, installed in a fresh venv away from the clone: the API, the CLI and the report
work from the package's bundled playbooks.

The venv is a controller's: the wheel and its requirements except the hosts' own (torch,
py-spy), which the two nodes of the embedded inventory take from `python` = this test's
interpreter, as a controller without torch driving GPU hosts would."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import venv
import zipfile

import pytest

from lab.ports import free_port
from tests.conftest import ROOT

# slow: docs/testing.md's tiers (bash tests/run --all, or --touching a source it covers)
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def run(argv, cwd, timeout=900):
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, "%s\n%s\n%s" % (argv, proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    base = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", base / "dist", ROOT],
        cwd=base)
    (wheel,) = (base / "dist").glob("torchfleet-*.whl")
    venv.create(base / "venv", with_pip=True)
    py = base / "venv" / "bin" / "python"
    with zipfile.ZipFile(wheel) as zf:
        meta = next(zf.read(n).decode() for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        tops = {n.split("/", 1)[0] for n in zf.namelist()}
    # The product: the package and the collection; the lab, bench and tests stay in the clone.
    assert tops - {n for n in tops if n.endswith(".dist-info")} == {"torchfleet",
                                                                    "ansible_collections"}
    requires = [r for r in re.findall(r"^Requires-Dist: (.+)$", meta, re.M)
                if "extra ==" not in r and not re.match(r"(torch|py-spy)\b", r)]
    assert any(r.startswith("ansible-core") for r in requires), requires
    run([py, "-m", "pip", "install", "-q", *requires], cwd=base)
    run([py, "-m", "pip", "install", "-q", "--no-deps", wheel], cwd=base)
    assert run([py, "-c", "import importlib.util as u; print(u.find_spec('torch'))"],
               cwd=base).stdout.strip() == "None"
    work = base / "elsewhere"
    work.mkdir()
    return py, work


def test_api_from_the_installed_wheel(installed):
    py, work = installed
    code = ("import json, torchfleet, torchfleet.paths as p\n"
            "r = torchfleet.preflight(master_port=%d, python=%r)\n"
            "print(json.dumps({'ok': r.ok, 'root': str(p.ansible_root()), 'dir': str(r.run_dir),"
            " 'hosts': [h.host for h in r.hosts]}))" % (free_port(), sys.executable))
    out = json.loads(run([py, "-c", code], cwd=work).stdout.strip().splitlines()[-1])
    assert out["ok"] is True and out["hosts"] == ["node0", "node1"]
    assert "site-packages/torchfleet/ansible" in out["root"]  # not the clone
    assert out["dir"].startswith(str(work / "runs"))


def test_cli_and_report_from_the_installed_wheel(installed):
    py, work = installed
    exe = py.parent / "torchfleet"
    result = json.loads(run([exe, "collective", "--json", "-e", "master_port=%d" % free_port(),
                             "-e", "python=%s" % sys.executable], cwd=work).stdout)
    assert result["ok"] is True and {r["op"] for r in result["busbw"]} >= {"all_reduce", "gather"}
    page = run([exe, "report", result["run_dir"]], cwd=work).stdout.strip()
    assert page.endswith("report.html") and "busbw-chart" in open(page).read()
