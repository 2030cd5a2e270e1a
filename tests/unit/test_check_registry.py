"""One unit per check: the registry (plugins/module_utils/reports/checks.py) is what docs/checks.md's
tables show, holds every id DESIGN.md and the rules use, and check() refuses any other id."""
from __future__ import annotations

import re

import pytest

from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import checks
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.preflight import check
from tests.conftest import COLLECTION, ROOT
from torchfleet.cli import checks_text, main

DESIGN = ROOT.parent / "shared" / "DESIGN.md"
CODE = [p for p in (ROOT / "src").rglob("*") if p.suffix in (".py", ".yml")
        and p.name != "checks.py"]
ID = re.compile(r"`([a-z_]+\.[a-z_<>]+)`")
# DESIGN.md ids whose checks are not built yet, with the open issue that builds them. Each must
# still be missing from the registry: building one means taking it off this list.
PLANNED: dict[str, int] = {}


def test_the_docs_tables_are_the_registry():
    page = (ROOT / "docs" / "checks.md").read_text()
    for phases in checks.TABLES:
        assert checks.markdown(phases) in page, "docs/checks.md table for %s: run `torchfleet " \
            "checks --markdown` and paste it" % (phases,)
    assert checks_text(markdown=True).count("| id |") == len(checks.TABLES)


@pytest.mark.skipif(not DESIGN.exists(), reason="../shared/DESIGN.md is beside the clone in CI")
def test_every_design_id_is_registered():
    table = DESIGN.read_text().split("Check ids are stable", 1)[1].split("\n\n", 2)[1]
    ids = {i for line in table.splitlines() if line.startswith("| `")
           for i in ID.findall(line.split(" | ")[0])}
    assert ids, "no ids read from DESIGN.md"
    assert set(PLANNED) <= ids and not set(PLANNED) & checks.IDS
    for cid in ids - set(PLANNED):
        if cid.endswith(".<name>"):
            assert any(i.startswith(cid[:-6]) for i in checks.IDS), cid
        else:
            assert cid in checks.IDS, cid


def test_every_input_id_the_run_plan_names_is_registered():
    text = (COLLECTION / "plugins" / "module_utils" / "run" / "plan.py").read_text()
    named = set(re.findall(r'"(input\.[a-z_]+)"', text))
    assert len(named) >= 6 and named <= checks.IDS, named - checks.IDS


def test_every_registered_id_is_used_by_some_rule():
    text = "\n".join(p.read_text() for p in CODE)
    for cid in sorted(checks.IDS):
        prefix, name = cid.split(".", 1)
        # Literal, or built from its prefix ("version." + name, "run." + reason).
        used = cid in text or ('"%s."' % prefix in text and '"%s"' % name in text)
        assert used, "%s is registered but no rule reports it" % cid


def test_check_refuses_an_unregistered_id():
    assert check("port.blocked", "node0", True)["id"] == "port.blocked"
    with pytest.raises(ValueError, match="not in plugins/module_utils/reports/checks.py"):
        check("port.blokced", "node0", False, "typo")


def test_the_cli_lists_every_check(capsys):
    assert main(["checks"]) == 0
    out = capsys.readouterr().out
    assert all(cid in out for cid in checks.IDS)
