"""The line the stdout callback (plugins/callback/torchfleet.py) says while preflight's probes
pull container_image (issue 68, container.pull): how many hosts' probes returned and pulled,
which it still waits on, how many wait for a fork, bounded at 512 hosts; said every every_s
from a thread that ends with the probe's task and never says a line after it. The last test runs
a real ansible-playbook with the callback, preflight's own announcement and line, and a probe
stand-in that sleeps past a period on one host."""
from __future__ import annotations

import re
import threading
from types import SimpleNamespace

import yaml

from ansible_collections.torchfleet.fleet.plugins.callback import torchfleet as callback
from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from tests.conftest import COLLECTION
from tests.unit.test_stdout_callback import playbook

IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"
ANNOUNCED = {"image": IMAGE, "hosts": 8, "timeout_s": 1800.0, "every_s": 30.0}
# A node_probe result's image facts (host/image.py probe()), as the probe returns them.
PULLED = {"container": {"image": IMAGE, "runtime": "podman", "error": None, "pull_error": None,
                        "pulled": True, "digest": "sha256:" + "a" * 64, "cuda": None}}
PRESENT = {"container": dict(PULLED["container"], pulled=False)}
REFUSED = {"container": dict(PULLED["container"], pulled=False, digest=None, pull_error=(
    "not here, and podman pull failed: Error: initializing source docker://nvcr.io/nvidia/"
    "pytorch:24.05-py3: reading manifest 24.05-py3 in nvcr.io/nvidia/pytorch: unauthorized"))}


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_line_counts_the_hosts_done_pulled_refused_and_names_those_still_out():
    clock, said = Clock(), []
    pull = callback.PullProgress(ANNOUNCED, said.append, forks=64, clock=clock)
    for host in ("node%d" % i for i in range(8)):
        pull.started(host)
    pull.returned("node0", PULLED)
    pull.returned("node1", PRESENT)
    pull.returned("node2", REFUSED)
    pull.returned("node3", {"unreachable": True, "msg": "ssh: connect to host node3"})
    pull.returned("node6", PULLED)
    clock.now += 60
    assert pull.line() == (
        "pulling %s: 5 of 8 hosts done (2 pulled, 1 could not pull), waiting on node4, node5, "
        "node7 for 60 s (timeout 1800 s)" % IMAGE)
    assert said == []  # nothing is said but by the timer


def test_at_512_hosts_the_line_names_three_and_counts_the_rest_and_those_past_the_forks():
    clock = Clock()
    names = ["gpu-node-%03d.cluster.example.org" % i for i in range(512)]
    pull = callback.PullProgress(dict(ANNOUNCED, hosts=512), None, forks=64, clock=clock)
    for host in names[:64]:
        pull.started(host)
    for host in names[:3]:
        pull.returned(host, PULLED)
    for host in names[64:67]:  # a fork each, freed by the three that returned
        pull.started(host)
    clock.now += 125
    line = pull.line()
    assert line == (
        "pulling %s: 3 of 512 hosts done (3 pulled), waiting on %s, %s, %s (+61 more); "
        "445 wait for a fork (64 at a time) for 125 s (timeout 1800 s)" % ((IMAGE,) + tuple(
            names[3:6])))
    # Bounded whatever the names and the image: three names of 64 characters at most.
    long = callback.PullProgress(dict(ANNOUNCED, hosts=512, image="r.example/" + "i" * 900),
                                 None, forks=None, clock=clock)
    for i in range(512):
        long.started("n%d-" % i + "x" * 300)
    assert len(long.line()) < 600, len(long.line())
    assert re.findall(r"n\d-x{58}\.\.\.", long.line()) == [
        "n%d-" % i + "x" * 58 + "..." for i in range(3)]
    assert "+509 more" in long.line()


def test_the_timer_says_a_line_each_period_and_none_after_stop():
    said, ticked = [], threading.Event()

    def say(text):
        said.append(text)
        ticked.set()

    pull = callback.PullProgress(dict(ANNOUNCED, every_s=0.05), say)
    pull.started("node4")
    pull.start()
    assert ticked.wait(10), "no line in 10 s at a 0.05 s period"
    pull.stop()
    count = len(said)
    assert pull._thread is None and not [t for t in threading.enumerate()
                                         if t.name == "torchfleet-pull"]
    threading.Event().wait(0.3)  # six periods: none says a line
    assert len(said) == count and said[0].startswith("pulling %s: 0 of 8 hosts done, waiting on "
                                                     "node4; 7 wait for a fork for 0 s" % IMAGE), said


def test_a_screen_that_fails_ends_the_line_without_raising():
    calls = []

    def say(text):
        calls.append(text)
        raise BrokenPipeError("the screen went away")

    pull = callback.PullProgress(dict(ANNOUNCED, every_s=0.01), say)
    pull.start()
    thread = pull._thread
    thread.join(10)
    assert not thread.is_alive() and len(calls) == 1
    pull.stop()


class Display:
    def __init__(self):
        self.lines, self.verbosity = [], 0

    def display(self, text, **kwargs):
        self.lines.append(text)

    def banner(self, text, **kwargs):
        self.lines.append(text)


def task(action, name):
    return SimpleNamespace(action=action, _uuid=name, get_name=lambda: name)


def result(host, action, res):
    return SimpleNamespace(_host=SimpleNamespace(get_name=lambda: host),
                           _task=task(action, "t"), _result=res, result=res)


def test_the_callback_starts_the_line_at_the_probe_and_stops_it_at_its_end_and_the_plays():
    cb = callback.CallbackModule()
    cb._display = Display()
    cb.v2_playbook_on_play_start(SimpleNamespace(get_name=lambda: "preflight"))
    cb.v2_playbook_on_task_start(task("ansible.builtin.set_fact", "Resolve"), False)
    cb.v2_runner_on_ok(result("node0", "ansible.builtin.set_fact", {"ansible_facts": {
        "preflight_probe_run": {"run_id": "r1", "pull": dict(ANNOUNCED, every_s=3600.0)}}}))
    cb.v2_playbook_on_task_start(task("ansible.builtin.debug", "Say what the probes pull"), False)
    assert cb._pull is None  # the debug says the line before; the probe pulls
    cb.v2_playbook_on_task_start(task("torchfleet.fleet.node_probe", "Probe"), False)
    pull = cb._pull
    assert pull is not None and pull._thread.is_alive()
    cb.v2_runner_on_start(SimpleNamespace(get_name=lambda: "node0"), None)
    cb.v2_runner_on_start(SimpleNamespace(get_name=lambda: "node1"), None)
    cb.v2_runner_on_ok(result("node0", "torchfleet.fleet.node_probe", PULLED))
    assert pull.line().startswith("pulling %s: 1 of 8 hosts done (1 pulled), waiting on node1; "
                                  "6 wait for a fork" % IMAGE)
    cb.v2_playbook_on_task_start(task("ansible.builtin.set_fact", "Gather"), False)
    assert cb._pull is None and pull._stopped.is_set() and pull._thread is None
    # A play that ends at the probe (the play's next start, the recap) stops it too.
    for end in (lambda: cb.v2_playbook_on_play_start(SimpleNamespace(get_name=lambda: "next")),
                lambda: cb.v2_playbook_on_stats(SimpleNamespace(processed={}))):
        cb._announced(result("node0", "ansible.builtin.set_fact", {"ansible_facts": {
            "preflight_probe_run": {"pull": dict(ANNOUNCED, every_s=3600.0)}}}))
        cb.v2_playbook_on_task_start(task("torchfleet.fleet.node_probe", "Probe again"), False)
        pull = cb._pull
        end()
        assert cb._pull is None and pull._stopped.is_set(), end
    # Without container_image the fact's pull is none: no line.
    cb.v2_playbook_on_task_start(task("ansible.builtin.set_fact", "Resolve"), False)
    cb.v2_runner_on_ok(result("node0", "ansible.builtin.set_fact", {"ansible_facts": {
        "preflight_probe_run": {"pull": None}}}))
    cb.v2_playbook_on_task_start(task("torchfleet.fleet.node_probe", "Probe"), False)
    assert cb._pull is None


def test_probe_yml_announces_the_pull_the_callback_reads_with_the_one_default_period():
    tasks = yaml.safe_load((COLLECTION / "roles" / "preflight" / "tasks" / "probe.yml").read_text())
    resolve = next(t for t in tasks if t["name"] == "Resolve the probe's run-wide arguments once")
    fact, key = callback.PULL_FACT
    pull = resolve["ansible.builtin.set_fact"][fact][key]
    for name in ("'image'", "'hosts'", "'timeout_s'", "'every_s'", "'container_pull_say_s'"):
        assert name in pull
    assert defaults.TIMINGS["container_pull_say_s"] == defaults.CONTAINER_PULL_SAY_S == 30.0
    names = [t["name"] for t in tasks]
    # The debug that says the line before, then the probe that pulls.
    assert names.index("Resolve the probe's run-wide arguments once") < names.index(
        "Say what the probes pull") == names.index(
        "Probe the host in one call (NICs, GPUs, versions, shm, env, code, data)") - 1


def test_a_real_playbook_says_the_line_while_one_host_is_out_and_none_after(tmp_path):
    """probe.yml's own announcement (its pull expression, the period made 1 s) and before-line;
    a stand-in probe on 6 hosts with 2 forks where h02 sleeps 4 s."""
    tasks = yaml.safe_load((COLLECTION / "roles" / "preflight" / "tasks" / "probe.yml").read_text())
    resolve = next(t for t in tasks if t["name"] == "Resolve the probe's run-wide arguments once")
    said = next(t for t in tasks if t["name"] == "Say what the probes pull")
    expr = resolve["ansible.builtin.set_fact"]["preflight_probe_run"]["pull"].strip()
    assert expr.startswith("{{") and expr.endswith("}}")
    hosts = ["h%02d" % i for i in range(6)]
    play = [{"name": "Pull", "hosts": "all", "gather_facts": False, "tasks": [
        {"name": "Announce", "run_once": True, "vars": resolve["vars"],
         "ansible.builtin.set_fact": {"preflight_probe_run": {"pull": "{{ (%s) | combine("
                                                              "{'every_s': 1.0}) }}" % expr[2:-2]}}},
        said,
        {"name": "Stand in for the probe",
         "ansible.builtin.command": {"argv": ["sleep", "{{ 4 if inventory_hostname == 'h02' "
                                                       "else 0 }}"]}},
        {"name": "After", "ansible.builtin.debug": {"msg": "AFTER-THE-PROBES"}, "run_once": True},
    ]}]
    proc = playbook(tmp_path, play, hosts, None, "-f", "2",
                    "-e", "container_image=reg.example/img:1")
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    lines = out.splitlines()
    assert "pulling reg.example/img:1 where missing on 6 hosts (timeout 1800 s)" in lines, out
    progress = [i for i, line in enumerate(lines) if line.startswith("pulling reg.example/img:1: ")]
    assert progress, out
    # Every line in its shape; h02, out for 4 s, named while it is out (the others are quick).
    pattern = re.compile(r"pulling reg\.example/img:1: [0-6] of 6 hosts done(, waiting on "
                         r"h0\d(, h0\d){0,2})?(; [1-6] wait for a fork \(2 at a time\))? "
                         r"for \d+ s \(timeout 1800 s\)$")
    assert all(pattern.match(lines[i]) for i in progress), out
    assert any("waiting on" in lines[i] and "h02" in lines[i] for i in progress), out
    assert max(progress) < lines.index("AFTER-THE-PROBES"), out
