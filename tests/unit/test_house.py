"""The house rules of the tree (docs/architecture.md), checked on every file: one import route,
nothing edits sys.path or a package's __path__, no role reads another role's facts through
hostvars, plays name torchfleet's modules and roles by FQCN."""
from __future__ import annotations

import re

from tests.conftest import COLLECTION, ROOT

PY = [p for d in ("src", "lab", "bench", "tests") for p in (ROOT / d).rglob("*.py")
      if "fixtures" not in p.parts and p != ROOT / "tests" / "unit" / "test_house.py"]
YML = [p for p in COLLECTION.rglob("*.yml")] + list((ROOT / "molecule").rglob("*.yml"))
ROLES = sorted(p.name for p in (COLLECTION / "roles").iterdir())
MODULES = sorted(p.stem for p in (COLLECTION / "plugins" / "modules").glob("*.py"))


def test_nothing_edits_sys_path_or_a_packages_path():
    edits = re.compile(r"sys\.path\.(insert|append)|__path__\.(append|insert|extend)"
                       r"|spec_from_file_location")
    assert [str(p.relative_to(ROOT)) for p in PY if edits.search(p.read_text())] == []


def test_the_shared_code_has_one_import_route():
    # The old routes: ansible.module_utils.torchfleet (ansible.cfg's module_utils path), a
    # loader by file path, bare imports of a module or module_utils file by its file name.
    old = re.compile(r"ansible\.module_utils\.torchfleet|shared_module\(|^\s*import (%s)$"
                     % "|".join(MODULES), re.M)
    assert [str(p.relative_to(ROOT)) for p in PY if old.search(p.read_text())] == []
    cfg = (ROOT / "ansible.cfg").read_text()
    assert not re.search(r"^(library|module_utils|action_plugins|roles_path)\s*=", cfg, re.M)


def test_no_role_reads_another_roles_facts_through_hostvars():
    read = re.compile(r"hostvars\[[^\]]+\]\s*(?:\[\s*'|\.)(%s)_" % "|".join(ROLES))
    crossing = []
    for role in ROLES:
        for path in (COLLECTION / "roles" / role).rglob("*.yml"):
            for other in read.findall(path.read_text()):
                if other != role:
                    crossing.append("%s reads %s_*" % (path.relative_to(COLLECTION), other))
    assert crossing == []


def test_plays_name_torchfleets_modules_and_roles_by_fqcn():
    short = re.compile(r"^\s*(?:- )?(%s):|^\s*name: (%s)$" % ("|".join(MODULES), "|".join(ROLES)),
                       re.M)
    assert [str(p.relative_to(ROOT)) for p in YML if short.search(p.read_text())] == []


def test_bench_and_the_product_import_nothing_from_tests_and_the_wheel_no_lab():
    outside = [p for p in PY if p.parts[len(ROOT.parts)] in ("bench", "src", "lab")]
    from_tests = re.compile(r"^\s*(from|import) tests\b", re.M)
    assert [str(p.relative_to(ROOT)) for p in outside if from_tests.search(p.read_text())] == []
    product = [p for p in PY if p.parts[len(ROOT.parts)] == "src"]
    from_lab = re.compile(r"^\s*(from|import) lab\b", re.M)
    assert [str(p.relative_to(ROOT)) for p in product if from_lab.search(p.read_text())] == []


def test_one_file_per_benchmark_beside_a_shared_harness():
    from bench.__main__ import BENCHES

    for name, run in BENCHES.items():
        assert run.__module__ == "bench." + name and (ROOT / "bench" / (name + ".py")).is_file()


def test_the_collection_is_the_packages_version_and_its_readme_names_every_module():
    import yaml

    import torchfleet
    from torchfleet import collection

    assert collection.version() == torchfleet.__version__
    assert yaml.safe_load((COLLECTION / "galaxy.yml").read_text())["version"] == \
        re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    readme = (COLLECTION / "README.md").read_text()
    assert [m for m in MODULES if m not in readme] == []
