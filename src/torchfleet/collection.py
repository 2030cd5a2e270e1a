"""`torchfleet collection build DIR`: the Ansible collection torchfleet.fleet packed as
DIR/torchfleet-fleet-<version>.tar.gz.

The collection's folder (src/ansible_collections/torchfleet/fleet in a clone, the installed
package's ansible_collections/torchfleet/fleet) is its real tree: modules, module_utils,
action, callback and inventory plugins, roles (the workloads are the launch role's files) and
playbooks, importing each other by the one route ansible_collections.torchfleet.fleet...
ansible-galaxy packs it as it is; nothing is copied or rewritten on the way.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from torchfleet import ansible_cli
from torchfleet.paths import collection_root


def version() -> str:
    return str(yaml.safe_load((collection_root() / "galaxy.yml").read_text())["version"])


def build(out_dir: str | Path) -> Path:
    """Build DIR/torchfleet-fleet-<version>.tar.gz; returns its path."""
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([*ansible_cli.command("ansible-galaxy"), "collection", "build", str(collection_root()),
                           "--output-path", str(out_dir), "--force"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError("ansible-galaxy collection build failed: %s"
                           % (proc.stderr or proc.stdout).strip()[-2000:])
    return out_dir / ("torchfleet-fleet-%s.tar.gz" % version())
