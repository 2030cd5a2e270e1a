"""Where the Ansible tree (ansible.cfg, playbooks, roles, library) lives.

In a clone it is the repository root; in an installed wheel it is torchfleet/ansible/.
"""
from __future__ import annotations

from pathlib import Path

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
