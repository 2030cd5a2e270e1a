"""The tiers' map (tests/tiers.py) names every module that has slow tests, so that
`bash tests/run --touching PATH` can find each of them."""
from __future__ import annotations

from tests.conftest import ROOT
from tests.tiers import SLOW_COVERS, touching


def test_every_module_with_slow_or_alone_tests_is_in_the_map():
    marked = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
              if "mark.slow" in p.read_text() or "mark.alone" in p.read_text()}
    marked.discard("tests/unit/test_tiers.py")
    assert marked - set(SLOW_COVERS) == set()
    assert all((ROOT / module).exists() for module in SLOW_COVERS)


def test_a_source_finds_the_slow_modules_that_cover_it():
    m = "src/ansible_collections/torchfleet/fleet/plugins/module_utils"
    assert "tests/lab/test_ledger_lab.py" in touching([m + "/reports/ledger.py"])
    assert "tests/lab/test_straggler_lab.py" in touching(["./" + m + "/run/straggle.py"])
    assert "tests/lab/test_straggler_lab.py" not in touching([m + "/reports/ledger.py"])
    assert touching(["tests/lab/test_guard_lab.py"]) == ["tests/lab/test_guard_lab.py"]
    assert touching(["docs/testing.md"]) == []
