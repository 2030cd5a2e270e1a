"""Where the Ansible tree (ansible.cfg, playbooks, roles, library) lives.

In a clone it is the repository root; in an installed wheel it is torchfleet/ansible/.
"""
from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

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


@functools.cache
def shared_module(name: str) -> ModuleType:
    """module_utils/torchfleet/<name>.py, loaded by path: the package reads the same file the
    modules do (only for files that import nothing of Ansible's: checks.py, procs.py)."""
    path = ansible_root() / "module_utils" / "torchfleet" / (name + ".py")
    spec = importlib.util.spec_from_file_location("torchfleet_shared_" + name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
