"""Every module renders in ansible-doc, as a user reads it: DOCUMENTATION, EXAMPLES and RETURN
parse, with every description text (a stray ': ' in YAML turns one into a mapping, which
ansible-doc refuses)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from torchfleet import ansible_cli

MODULES = sorted(p.stem for p in (ROOT / "library").glob("*.py"))
BIN = Path(sys.executable).parent


def test_every_module_renders_in_ansible_doc():
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([*ansible_cli.command("ansible-doc"), "-M", str(ROOT / "library"), "--json",
                           *MODULES], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "ERROR" not in proc.stderr, proc.stderr[-3000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-3000:]  # e.g. a duplicate mapping key
    docs = json.loads(proc.stdout)
    assert sorted(docs) == MODULES
    for name, doc in docs.items():
        assert doc["doc"]["module"] == name
        assert doc["examples"].strip() and doc["return"], name


def texts(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("description", "short_description"):
                yield from (value if isinstance(value, list) else [value])
            else:
                yield from texts(value)
    elif isinstance(node, list):
        for value in node:
            yield from texts(value)


@pytest.mark.parametrize("name", MODULES)
def test_every_description_is_text(name):
    import importlib

    module = importlib.import_module("ansible_collections.torchfleet.fleet.plugins.modules." + name)
    for part in ("DOCUMENTATION", "RETURN"):
        doc = yaml.safe_load(getattr(module, part))
        bad = [t for t in texts(doc) if not isinstance(t, str)]
        assert bad == [], "%s %s: a description parsed as %r" % (name, part, bad[:1])
    assert yaml.safe_load(module.EXAMPLES)


def test_the_slurm_inventory_plugin_renders_in_ansible_doc():
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([*ansible_cli.command("ansible-doc"), "-t", "inventory", "--json", "torchfleet.fleet.slurm"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "WARNING" not in proc.stderr, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)["torchfleet.fleet.slurm"]
    assert set(doc["doc"]["options"]) == {"plugin", "job_id", "scontrol", "ssh_retries"}
    assert doc["examples"].strip()
