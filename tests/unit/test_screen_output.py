"""What the plays print at their end, read off the screen of a real ansible-playbook run (the
project's ansible.cfg and stdout callback): the summary tasks of the results and preflight roles,
taken as they are from their task files, end with a blank line and `report: <path>`, never with
a backslash and an n (issue 67: the README's first command printed
`goodput 22 %; no failure\\n\\nreport: .../train.json`)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import ROOT
from torchfleet import ansible_cli

ROLES = ROOT / "src" / "ansible_collections" / "torchfleet" / "fleet" / "roles"
TABLE = "HOST  OUTCOME\nnode0 ok\n\ntrain ok\ngoodput 22 %; no failure"
# (task file, task name, the variables its message reads)
SHOWN = [
    ("results/tasks/main.yml", "Show the run's summary",
     {"results_summary": {"table": TABLE, "report": "/runs/r1/train.json"},
      "results_preflight": {"ok": True}, "results_attempts": [{"attempt": 0}]}),
    ("preflight/tasks/report.yml", "Show the preflight summary",
     {"preflight_result": {"table": TABLE, "report": "/runs/r1/train.json", "retest": []}}),
    ("preflight/tasks/recheck.yml", None,
     {"preflight_decision": {"table": TABLE, "report": "/runs/r1/train.json"}}),
]


def task(path, name):
    """The task file's task of that name (None: its debug task), as written there."""
    for t in yaml.safe_load((ROLES / path).read_text()):
        if t.get("name") == name or name is None and "ansible.builtin.debug" in t:
            return {"name": t["name"], "ansible.builtin.debug": t["ansible.builtin.debug"],
                    **({"vars": t["vars"]} if "vars" in t else {})}
    raise AssertionError("no task %r in %s" % (name, path))


def test_the_summary_ends_with_a_blank_line_and_the_reports_path_on_the_screen(tmp_path):
    plays = [{"name": "show %s" % path, "hosts": "localhost", "gather_facts": False,
              "vars": variables, "tasks": [task(path, name)]} for path, name, variables in SHOWN]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(plays, sort_keys=False))
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    env.pop("ANSIBLE_STDOUT_CALLBACK", None)
    proc = subprocess.run([*ansible_cli.command("ansible-playbook"), "-i",
                           str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    screen = proc.stdout
    assert proc.returncode == 0, screen + proc.stderr
    assert "\\n" not in screen, screen
    # Each summary as a person reads it: the table's lines, a blank line, the report's path.
    assert screen.count("goodput 22 %; no failure\n\nreport: /runs/r1/train.json\n") == 3, screen
    assert screen.count("restart: the remaining candidates checked again\nHOST  OUTCOME\n") == 1


def test_no_play_hands_jinja_a_backslash_escape_in_a_block_scalar():
    """Every debug message in the collection's plays and roles: a `\\n` in a folded or literal
    block reaches Jinja as a backslash and an n, which ansible-core 2.19 prints as such; only a
    double-quoted YAML string turns it into a newline."""
    offenders = []
    tree = ROOT / "src" / "ansible_collections" / "torchfleet" / "fleet"
    for path in sorted(list(tree.glob("roles/*/tasks/*.yml")) + list(tree.glob("playbooks/*.yml"))):
        text = path.read_text()
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if line.rstrip().endswith(("msg: >-", "msg: >", "msg: |", "msg: |-")):
                indent = len(line) - len(line.lstrip())
                for body in lines[i + 1:]:
                    if body.strip() and len(body) - len(body.lstrip()) <= indent:
                        break
                    if "\\n" in body or "\\t" in body:
                        offenders.append("%s:%d" % (Path(path).relative_to(ROOT), i + 1))
    assert offenders == []
