"""Where Ansible's commands are: the one lookup for the package, its tests and bench.

The script installed beside this interpreter first (a venv's `.venv/bin/torchfleet` is often
run without the venv on PATH), else the one the user's PATH finds, else Ansible run through
this interpreter (`python -m ansible playbook`: ansible-core installed with `pip --target`
has no script where either looks)."""
from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path


def command(name: str) -> list[str]:
    """The argv that starts Ansible's `name` (ansible-playbook, ansible-galaxy, ...)."""
    beside = os.path.join(os.path.dirname(sys.executable), name)
    if os.access(beside, os.X_OK):
        return [beside]
    found = shutil.which(name)
    if found:
        return [found]
    # ansible-core's own dispatcher names its commands without the prefix ('ansible': adhoc).
    return [sys.executable, "-m", "ansible", name.removeprefix("ansible-").replace(
        "ansible", "adhoc")]


def executable(name: str, folder: Path) -> str:
    """One executable file that starts `name` (what ansible-runner takes): the script found,
    else a small one written into `folder` that runs it through this interpreter (named as the
    command, so that its processes are found by that name)."""
    argv = command(name)
    if len(argv) == 1:
        return argv[0]
    path = folder / name
    path.write_text("#!%s\nimport runpy, sys\nsys.argv[1:1] = [%r]\n"
                    "runpy.run_module('ansible', run_name='__main__')\n"
                    % (shlex.quote(sys.executable), argv[-1]))
    path.chmod(0o700)
    return str(path)
