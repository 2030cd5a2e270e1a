"""The one lookup of Ansible's commands (torchfleet.ansible_cli), with ansible-core installed as
pip --target installs it (a GPU host's Python: no script beside the interpreter, none on PATH):
the commands still run, through the interpreter."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from torchfleet import ansible_cli

# Run in an interpreter whose folder holds no Ansible script and whose PATH finds none.
LOOKUP = """
import json, sys
sys.executable = sys.argv[1]
from torchfleet import ansible_cli
print(json.dumps([ansible_cli.command(n) for n in ("ansible-playbook", "ansible")]))
"""


def test_commands_beside_the_interpreter_are_found_first():
    assert ansible_cli.command("ansible-playbook") == [
        os.path.join(os.path.dirname(sys.executable), "ansible-playbook")]


def test_without_any_script_ansible_runs_through_the_interpreter(tmp_path):
    bare = tmp_path / "bin" / "python3"
    bare.parent.mkdir()
    bare.symlink_to(sys.executable)
    out = subprocess.run([sys.executable, "-c", LOOKUP, str(bare)], capture_output=True,
                         text=True, check=True, env=dict(os.environ, PATH=str(tmp_path))).stdout
    playbook, adhoc = json.loads(out)
    assert playbook == [str(bare), "-m", "ansible", "playbook"]
    assert adhoc == [str(bare), "-m", "ansible", "adhoc"]
    # That command really is ansible-playbook; and the file ansible-runner is given runs it too.
    version = subprocess.run([sys.executable, "-m", "ansible", "playbook", "--version"],
                             capture_output=True, text=True, check=True).stdout
    assert version.startswith("ansible-playbook [core ")
    folder = tmp_path / "private"
    folder.mkdir()
    script = subprocess.run(
        [sys.executable, "-c", "import sys; sys.executable = sys.argv[1]\n"
         "from pathlib import Path\nfrom torchfleet import ansible_cli\n"
         "print(ansible_cli.executable('ansible-playbook', Path(sys.argv[2])))",
         str(bare), str(folder)], capture_output=True, text=True, check=True,
        env=dict(os.environ, PATH=str(tmp_path))).stdout.strip()
    assert script == str(folder / "ansible-playbook")
    # As on that host: the packages on PYTHONPATH (pip --target), the interpreter bare.
    import ansible

    site = os.path.dirname(os.path.dirname(ansible.__file__))
    ran = subprocess.run([script, "--version"], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=site))
    assert ran.stdout.startswith("ansible-playbook [core ")
