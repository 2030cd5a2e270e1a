"""Every public variable's default is written once (plugins/module_utils/defaults.py): the
roles' argument_specs, the modules' argument specs, the API and the docs' variables table
agree with it, and no play writes a default of its own for a public variable."""
from __future__ import annotations

import importlib
import re

import pytest
import yaml

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from tests.conftest import COLLECTION, ROOT
from torchfleet import variables

ROLE_SPECS = sorted((COLLECTION / "roles").glob("*/meta/argument_specs.yml"))
MODULES = sorted(p.stem for p in (COLLECTION / "plugins" / "modules").glob("*.py"))


def public_entries():
    for path in ROLE_SPECS:
        role = path.parents[1].name
        for entry, spec in yaml.safe_load(path.read_text())["argument_specs"].items():
            for name, option in (spec.get("options") or {}).items():
                if not name.startswith(role + "_"):
                    yield "%s %s %s" % (role, entry, name), name, option


@pytest.mark.parametrize("where, name, option", list(public_entries()),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_each_roles_argument_spec_states_the_homes_default_and_type(where, name, option):
    home = defaults.BY_NAME.get(name)
    assert home is not None, "%s is not a public variable of defaults.py" % where
    assert option.get("type", "str") == home.type, where
    assert option.get("elements") == home.elements, where
    assert tuple(option.get("choices") or ()) == tuple(home.choices or ()), where
    if defaults.stated(home) is None:
        assert "default" not in option, "%s: states a default the home does not have" % where
    else:
        assert option.get("default") == home.default, where


@pytest.mark.parametrize("name", MODULES)
def test_each_modules_spec_takes_a_public_variables_default_from_the_home(name):
    module = importlib.import_module("ansible_collections.torchfleet.fleet.plugins.modules."
                                     + name)
    spec = module.ARGUMENT_SPEC if hasattr(module, "ARGUMENT_SPEC") else {}
    for option, entry in spec.items():
        # A default of None in the home is computed where the variable is used.
        if option in defaults.BY_NAME and "default" in entry \
                and defaults.default(option) is not None:
            assert entry["default"] == defaults.default(option), (name, option)


def test_no_play_writes_a_default_of_its_own_for_a_public_variable():
    names = [n for n, o in defaults.BY_NAME.items() if o.default is not None]
    literal = re.compile(r"(?<![.\]\w])(%s) \| default\((?!omit\))" % "|".join(names))
    found = ["%s: %s" % (p.relative_to(COLLECTION), m.group(0))
             for p in COLLECTION.rglob("*.yml") for m in literal.finditer(p.read_text())]
    assert found == []


def test_the_api_and_the_docs_table_read_the_home():
    spec = variables.public_spec()
    assert set(spec) == set(defaults.BY_NAME) - variables.INTERNAL
    assert spec["lost_after_s"]["default"] == defaults.default("lost_after_s")
    table = variables.markdown()
    assert "| `lost_after_s` | int | `30` |" in table
    assert table in (ROOT / "docs" / "variables.md").read_text(), \
        "docs/variables.md: run `torchfleet variables --markdown` and paste it"
