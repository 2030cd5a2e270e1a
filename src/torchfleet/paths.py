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
def shared_module(name: str, folder: str = "module_utils/torchfleet") -> ModuleType:
    """<folder>/<name>.py of the Ansible tree, loaded by path: the package reads the same file
    the modules and plugins do (module_utils files that import nothing of Ansible's: checks.py,
    procs.py; or a plugin, such as inventory_plugins/slurm.py)."""
    path = ansible_root() / folder / (name + ".py")
    spec = importlib.util.spec_from_file_location(
        "torchfleet_shared_%s_%s" % (folder.replace("/", "_"), name), path)
    if spec is None or spec.loader is None:
        raise ImportError("cannot load %s: the Ansible tree is incomplete" % path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
