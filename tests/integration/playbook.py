"""Run the real entry playbooks from the repository root, as a user would."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT
from torchfleet import ansible_cli

BIN = Path(sys.executable).parent
# One row of Ansible's PLAY RECAP: "<host> : ok=N changed=N unreachable=N failed=N ...".
RECAP_ROW = re.compile(r"^(\S.*?)\s*:\s+((?:[a-z]+=[0-9]+\s*)+)$")


@dataclass
class Run:
    rc: int
    out: str
    run_dir: Path
    stderr: str = ""  # what the command wrote to stderr alone (also inside `out`)

    def report(self, name="preflight.json"):
        return json.loads((self.run_dir / name).read_text())

    def failing(self, name="preflight.json"):
        """Sorted (check id, host) of every failed check of severity error."""
        return sorted((c["id"], c["host"]) for c in self.report(name)["checks"]
                      if not c["ok"] and c["severity"] == "error")

    def recap(self):
        """{host: {ok, changed, unreachable, failed, ...}} from the PLAY RECAP's own rows: the
        lines after its banner up to the first that is not a row, so that whatever follows on
        stderr (a library's warning at exit) is never read as a host."""
        rows = {}
        for line in self.out.split("PLAY RECAP", 1)[-1].splitlines()[1:]:
            row = RECAP_ROW.match(line.rstrip())
            if row is None:
                if rows:
                    break
                continue
            rows[row.group(1)] = {k: int(v) for k, v in
                                  (field.split("=") for field in row.group(2).split())}
        return rows


def playbook(name, tmp_path, *args, inventory=None, timeout_s=300):
    run_dir = tmp_path / "run"
    argv = [*ansible_cli.command("ansible-playbook"), name, "-e", "run_dir=%s" % run_dir, *args]
    if inventory is not None:
        argv += ["-i", str(inventory)]
    env = dict(os.environ, PATH="%s:%s" % (BIN, os.environ.get("PATH", "")),
               ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout_s, stdin=subprocess.DEVNULL)
    # What ran: every task's line, which the run's play.log keeps (printed with -v); first,
    # so that the output's own recap stays last.
    tasks = run_dir / "play.log"
    return Run(proc.returncode, (tasks.read_text() if tasks.exists() else "")
               + proc.stdout + proc.stderr, run_dir, proc.stderr)


def local_inventory(tmp_path, hosts):
    """An inventory like inventory/local.yml with per-host variables: {name: {var: value}}."""
    import yaml

    group_vars = yaml.safe_load((ROOT / "inventory" / "local.yml").read_text())
    nodes = group_vars["all"]["children"]["nodes"]
    nodes["hosts"] = {name: (hostvars or None) for name, hostvars in hosts.items()}
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(group_vars))
    return path
