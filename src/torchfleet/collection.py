"""`torchfleet collection build DIR`: the Ansible collection torchfleet.fleet, assembled from
the same sources as the repository's tree (nothing to maintain twice).

    library/*.py                  -> plugins/modules/
    action_plugins/*.py           -> plugins/action/
    inventory_plugins/*.py        -> plugins/inventory/ (plugin: torchfleet.fleet.slurm)
    callback_plugins/*.py         -> plugins/callback/ (stdout_callback torchfleet.fleet.torchfleet)
    module_utils/torchfleet/*.py  -> plugins/module_utils/torchfleet/
    roles/                        -> roles/
    playbooks/*.yml               -> playbooks/   (torchfleet.fleet.preflight, .train, ...)
    src/torchfleet/workloads/     -> roles/launch/files/workloads/

The changes on the way are names: the import path of the shared code, `ansible.module_utils.
torchfleet.X` (how the repository's modules import it), becomes `ansible_collections.
torchfleet.fleet.plugins.module_utils.torchfleet.X`, and a module named in documentation,
M(torchrun_job), becomes M(torchfleet.fleet.torchrun_job). tests/sanity/ignore-<ansible>.txt
is written for ansible-test sanity (the modules are Apache-2.0, not GPLv3; _torchfleet.py is
the action plugins' shared base, not a plugin). `ansible-galaxy collection build` then packs
DIR/torchfleet-fleet-<version>.tar.gz.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from torchfleet import __version__
from torchfleet.paths import ansible_root

NAMESPACE, NAME = "torchfleet", "fleet"
OLD_IMPORT = re.compile(r"\bansible\.module_utils\.torchfleet\b")
NEW_IMPORT = "ansible_collections.%s.%s.plugins.module_utils.torchfleet" % (NAMESPACE, NAME)
WORKLOADS = Path(__file__).resolve().parent / "workloads"

GALAXY = """\
namespace: {ns}
name: {name}
version: {version}
readme: README.md
authors:
  - torchfleet developers
description: Preflight, launch and watch multi-node torchrun (PyTorch) jobs, fail-fast.
license:
  - Apache-2.0
tags: [pytorch, torchrun, distributed, gpu, nccl]
dependencies: {{}}
repository: https://github.com/torchfleet/torchfleet
build_ignore: ["**/__pycache__", "*.pyc"]
"""

README = """\
# torchfleet.fleet

torchfleet as an Ansible collection, built by `torchfleet collection build DIR` from the
torchfleet package {version}.

    ansible-galaxy collection install torchfleet-fleet-{version}.tar.gz
    ansible-doc torchfleet.fleet.node_probe
    ansible-playbook -i INVENTORY torchfleet.fleet.preflight
    ansible-playbook -i INVENTORY torchfleet.fleet.train -e nnodes=2 -e script=/path/train.py

Playbooks: preflight, train, collective, stop. Roles: torchfleet.fleet.preflight, .launch,
.results. Modules: {modules}. Inventory plugin: torchfleet.fleet.slurm (a running Slurm
job's nodes; a source file holding `plugin: torchfleet.fleet.slurm`, named *slurm.yml).
The inventory needs group `nodes` (rank order = its order);
every variable, check id and output is described in torchfleet's README.
"""


def _copy_py(src: Path, dest: Path, modules: list[str]) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    text = OLD_IMPORT.sub(NEW_IMPORT, src.read_text())
    text = re.sub(r"\bM\((%s)\)" % "|".join(modules), r"M(%s.%s.\1)" % (NAMESPACE, NAME), text)
    dest.write_text(text)


def _sanity_ignores(modules: list[str]) -> str:
    lines = ["plugins/modules/%s.py validate-modules:missing-gplv3-license  # Apache-2.0" % m
             for m in modules]
    lines.append("plugins/inventory/slurm.py validate-modules:missing-gplv3-license  # Apache-2.0")
    lines.append("plugins/callback/torchfleet.py validate-modules:missing-gplv3-license  "
                 "# Apache-2.0")
    lines.append("plugins/action/_torchfleet.py action-plugin-docs  # the plugins' shared base")
    return "\n".join(lines) + "\n"


def assemble(dest: Path, root: Path | None = None) -> Path:
    """Write the collection's tree into dest (ansible_collections/torchfleet/fleet layout
    inside it is the caller's choice); returns dest."""
    root = root or ansible_root()
    modules = sorted(p.stem for p in (root / "library").glob("*.py"))
    for here, there in (("library", "plugins/modules"), ("action_plugins", "plugins/action"),
                        ("inventory_plugins", "plugins/inventory"),
                        ("callback_plugins", "plugins/callback"),
                        ("module_utils/torchfleet", "plugins/module_utils/torchfleet")):
        for src in sorted((root / here).glob("*.py")):
            _copy_py(src, dest / there / src.name, modules)
    shutil.copytree(root / "roles", dest / "roles",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copytree(WORKLOADS, dest / "roles" / "launch" / "files" / "workloads",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "__init__.py"))
    (dest / "playbooks").mkdir(parents=True, exist_ok=True)
    for src in sorted((root / "playbooks").glob("*.yml")):
        shutil.copy2(src, dest / "playbooks" / src.name)
    (dest / "meta").mkdir(exist_ok=True)
    (dest / "meta" / "runtime.yml").write_text('---\nrequires_ansible: ">=2.19.0"\n')
    (dest / "galaxy.yml").write_text(GALAXY.format(ns=NAMESPACE, name=NAME,
                                                   version=__version__))
    sanity = dest / "tests" / "sanity"
    sanity.mkdir(parents=True, exist_ok=True)
    (sanity / ("ignore-%s.txt" % ansible_minor())).write_text(_sanity_ignores(modules))
    (dest / "README.md").write_text(README.format(version=__version__,
                                                  modules=", ".join(modules)))
    return dest


def ansible_minor() -> str:
    """This ansible-core's X.Y, the suffix of ansible-test's ignore file."""
    from ansible.release import __version__ as ansible_version

    return ".".join(ansible_version.split(".")[:2])


def build(out_dir: str | Path) -> Path:
    """Build DIR/torchfleet-fleet-<version>.tar.gz; returns its path."""
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    galaxy = shutil.which("ansible-galaxy") or str(Path(sys.executable).parent / "ansible-galaxy")
    with tempfile.TemporaryDirectory(prefix="torchfleet-collection-") as tmp:
        tree = assemble(Path(tmp) / "ansible_collections" / NAMESPACE / NAME)
        proc = subprocess.run([galaxy, "collection", "build", str(tree), "--output-path",
                               str(out_dir), "--force"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError("ansible-galaxy collection build failed: %s"
                           % (proc.stderr or proc.stdout).strip()[-2000:])
    return out_dir / ("%s-%s-%s.tar.gz" % (NAMESPACE, NAME, __version__))
