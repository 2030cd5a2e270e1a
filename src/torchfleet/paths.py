"""Where the Ansible side lives.

The collection torchfleet.fleet (plugins, roles, playbooks) is the Python package
`ansible_collections.torchfleet.fleet`, imported by one route everywhere: installed beside
`torchfleet` by the wheel, and under src/ in a clone (an editable install puts src/ on the path).
The entry tree (ansible.cfg, the root playbooks, the default inventory) is the repository root
in a clone and torchfleet/ansible/ in an installed wheel.
"""
from __future__ import annotations

from pathlib import Path

import ansible_collections.torchfleet.fleet as _collection

_PACKAGE = Path(__file__).resolve().parent


def ansible_root() -> Path:
    bundled = _PACKAGE / "ansible"
    if (bundled / "ansible.cfg").is_file():
        return bundled
    clone = _PACKAGE.parents[1]
    if (clone / "ansible.cfg").is_file():
        return clone
    raise FileNotFoundError(
        "torchfleet's Ansible tree is missing from %s; reinstall the package" % _PACKAGE)


def collection_root() -> Path:
    """The collection's folder: .../ansible_collections/torchfleet/fleet."""
    return Path(next(iter(_collection.__path__))).resolve()


def collections_path() -> Path:
    """The folder that holds ansible_collections/, for ANSIBLE_COLLECTIONS_PATH."""
    return collection_root().parents[2]
