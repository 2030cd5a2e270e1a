"""The stdout callback (plugins/callback/torchfleet.py) on a real ansible-playbook run: what a
task shows on purpose (debug), every failure in full with the default callback's text under
its banners, one line per task with counts with -v (and in the run's play.log), and
ANSIBLE_STDOUT_CALLBACK=default gives Ansible's own."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import ROOT
from torchfleet import ansible_cli

HOSTS = ["h%02d" % i for i in range(8)]
FAILING = ["h03", "h07"]
PLAY = [{"name": "A play over many hosts", "hosts": "all", "gather_facts": False, "tasks": [
    {"name": "Count this host", "ansible.builtin.set_fact": {"tf_seen": True}},
    {"name": "Fail on two hosts", "ansible.builtin.fail": {"msg": "broken on purpose"},
     "when": "inventory_hostname in %s" % FAILING},
    {"name": "Show a table", "ansible.builtin.debug": {"msg": "TABLE-LINE-1\nTABLE-LINE-2"},
     "run_once": True},
]}]


def playbook(tmp_path: Path, play: list, hosts, callback: str | None = None,
             *args: str) -> subprocess.CompletedProcess:
    """ansible-playbook of `play` on local `hosts` with the project's ansible.cfg (its stdout
    callback, torchfleet's, unless `callback`)."""
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {
        h: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
        for h in hosts}}}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    env.pop("ANSIBLE_STDOUT_CALLBACK", None)
    if callback:
        env["ANSIBLE_STDOUT_CALLBACK"] = callback
    return subprocess.run([*ansible_cli.command("ansible-playbook"), "-i",
                           str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml"), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)


def run(tmp_path: Path, callback: str | None, *args: str) -> str:
    proc = playbook(tmp_path, PLAY, HOSTS, callback, *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr  # two hosts failed
    return proc.stdout


def test_what_a_task_says_and_every_failure_in_full_the_rest_with_v(tmp_path):
    out = run(tmp_path, None)  # the project's ansible.cfg chooses torchfleet
    lines = out.splitlines()
    assert not [line for line in lines if line.startswith("TASK [Count this host]")]
    # No line per host: the debug task's message alone, shown on purpose.
    assert not [line for line in lines if line.startswith("ok: [h")]
    assert lines.index("TABLE-LINE-1") + 1 == lines.index("TABLE-LINE-2")
    for host in FAILING:  # in full, as the default callback words it, under its banners
        assert "fatal: [%s]: FAILED! => " % host in out
    assert out.index("PLAY [A play over many hosts]") < out.index("TASK [Fail on two hosts]") \
        < out.index("fatal: [h03]")
    assert "  => ok 0, skipped %d, failed 2" % (len(HOSTS) - 2) in lines
    assert "(every task's line: -v)" in lines  # (this play writes no report: no run directory)
    recap = out.split("PLAY RECAP", 1)[1].splitlines()[1:]
    assert [line.split()[0] for line in recap if line.startswith("h")] == FAILING
    others = len(HOSTS) - 2  # one ok each, the debug's once, one skipped each
    assert "%d other host(s) : ok=%d changed=0 unreachable=0 failed=0 skipped=%d" % (
        others, others + 1, others) in out
    verbose = run(tmp_path, None, "-v").splitlines()
    # With -v every task's banner, its hosts' results and its counts, as before.
    count = verbose.index("  => ok %d, failed 0" % len(HOSTS))
    banner = max(i for i, line in enumerate(verbose[:count])
                 if line.startswith("TASK [Count this host] "))
    assert {"ok: [%s] => " % h for h in HOSTS} <= set(verbose[banner:count])


def test_ansible_stdout_callback_default_gives_ansibles_own(tmp_path):
    ours, default = run(tmp_path, None), run(tmp_path, "default")
    assert "ok: [h05]" in default and "ok: [h05]" not in ours
    assert ours.count("broken on purpose") == default.count("broken on purpose")
    # The default prints a line per host per task and in the recap; ours does not grow so.
    assert len(ours.splitlines()) < len(default.splitlines()) - 2 * len(HOSTS)
