"""A 40-node lab of its own, brought up for this module and removed after it: rank order is
inventory order on its first 12 nodes, where the string order of the addresses (10.77.3.1,
.10, .11, .12, .2, ...) is not (c10d's rendezvous would have given the tenth host rank 1); and
the CLI's progress fits a real 24-row terminal (tmux) while it checks all 40."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_processes
from tests.integration.playbook import BIN, ROOT, Run, playbook
from tests.lab.test_reliability_lab import wait_until
from torchfleet import ansible_cli

# slow: docs/testing.md's tiers (bash tests/run --all, or --touching a source it covers)
pytestmark = [pytest.mark.lab, pytest.mark.slow]
NODES = 12  # the rank-order run's (of the module's 40-node lab: tests/lab/conftest.py)
# Attempt 0 has 250 steps to go when its checkpoint of step 50 is seen (~30 steps/s here).
RESTART_STEPS = 300
SCRIPT = Path(__file__).resolve().parents[1] / "fixtures" / "scripts" / "rank_identity.py"


def train_with_spares(lab, tmp_path, *args):
    run = playbook("train.yml", tmp_path, "-e", "nnodes=4", "-e", "spares=2",
                   "-e", "script=%s" % SCRIPT, "-e", "remote_runs_root=%s" % (tmp_path / "remote"),
                   *args, inventory=lab.inventory)
    return run, run.report("preflight.json")


def ranks_of(run):
    return [(h["host"], h["node_rank"]) for h in run.report("train.json")["hosts"]]


def test_a_broken_first_host_makes_the_second_the_master(lab, tmp_path):
    lab.unreachable("node0")
    try:
        # forks 2: the one port round runs in fork batches, node1's listener up for the others
        # only if node1's probe is in the first.
        run, pre = train_with_spares(lab, tmp_path, "-f", "2")
    finally:
        lab.heal()
    assert run.rc == 0, run.out[-4000:]
    assert ranks_of(run) == [("node1", 0), ("node2", 1), ("node3", 2), ("node4", 3)]
    # The ports were tested against node1, which the run then used as its master (node5 too:
    # a healthy spare left over).
    assert pre["master_addr"] == lab.node("node1").address
    assert [c["host"] for c in pre["checks"] if c["id"] == "port.blocked" and c["ok"]] == [
        "node1", "node2", "node3", "node4", "node5"]
    assert pre["spares"]["skipped"] == {"node0": ["host.unreachable"]}
    # node0 was found unreachable before any probe: the five others were probed once, their
    # ports tested in that one round against node1 (no second probe against a new master).
    probes = [line for line in (run.run_dir / "play.log").read_text().splitlines()
              if "Probe the host in one call" in line]
    assert len(probes) == 1 and probes[0].endswith("ok 5, failed 0"), probes
    assert run_processes(pre["run_id"]) == []


def node2_cut_after_the_first_checkpoint(lab, tmp_path, *extra, inventory=None):
    """train.yml (the built-in workload, max_restarts=1, lost_after_s=5) with node2's network
    cut once the first checkpoint exists; the lab healed after the play ends. An inventory
    given sets max_restarts itself."""
    ckpt, remote = tmp_path / "ckpt", tmp_path / "remote"
    proc = subprocess.Popen(
        [*ansible_cli.command("ansible-playbook"), "train.yml", "-i", str(inventory or lab.inventory),
         *extra, *([] if inventory else ["-e", "max_restarts=1"]), "-e", "lost_after_s=5",
         "-e", "train_steps=%d" % RESTART_STEPS, "-e", "train_checkpoint_dir=%s" % ckpt,
         "-e", "remote_runs_root=%s" % remote, "-e", "run_dir=%s" % (tmp_path / "run")],
        cwd=ROOT, env=dict(os.environ, PATH="%s:%s" % (BIN, os.environ["PATH"])),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not (ckpt / "ddp_train.pt").exists() and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (ckpt / "ddp_train.pt").exists(), "attempt 0 never saved a checkpoint"
        lab.cut_network("node2")
        out, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        lab.heal()
    return Run(proc.returncode, out, tmp_path / "run")


def test_spares_skip_a_firewalled_worker_and_replace_one_cut_off_mid_run_from_its_checkpoint(
        lab, tmp_path):
    # One run, two faults: node1 cannot reach the master's port (preflight skips it: the run
    # uses node0, node2, node3, node4), then node2's network is cut once the built-in DDP
    # workload saved its first checkpoint (every 50 steps, on storage every host sees): the
    # restart re-checks node1 (still skipped) and takes node5. lost_after_s=5: the mechanism is
    # the default 30 s's, the test 25 s shorter.
    lab.block_egress("node1", 29500)
    jobs = tmp_path / "async"  # Ansible's async job records, every host's (one filesystem)
    # max_restarts from the inventory, as a fleet sets it (a play's hosts cannot look it up).
    inventory = yaml.safe_load(lab.inventory.read_text())
    inventory["all"].setdefault("vars", {})["max_restarts"] = 1
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory, sort_keys=False))
    run = node2_cut_after_the_first_checkpoint(lab, tmp_path, "-e", "nnodes=4", "-e", "spares=2",
                                               "-e", "ansible_async_dir=%s" % jobs,
                                               inventory=tmp_path / "inventory.yml")
    remote = tmp_path / "remote"
    assert run.rc == 0, run.out[-5000:]
    # Preflight: the firewalled worker is named and skipped, in inventory order.
    pre = run.report("preflight.json")
    skipped = [(c["host"], c["severity"], c["detail"]) for c in pre["checks"]
               if c["id"] == "host.skipped" and not c["ok"]]
    assert skipped == [("node1", "warning", "not used: failed port.blocked; the run uses node0, "
                                            "node2, node3, node4")]
    assert pre["spares"]["skipped"] == {"node1": ["port.blocked"]}
    assert "not used: node1 (port.blocked), node5 (healthy spare)" in run.out
    # The restart: node2 lost, node5 in its place, node1 still skipped by the re-check.
    report = run.report("train.json")
    assert report["verdict"] == "train ok after 1 restart: node2 host.lost, replaced by node5"
    first, second = report["attempts"]
    assert (first["hosts"], first["phase"], first["outcomes"]["node2"]) == (
        ["node0", "node2", "node3", "node4"], "lost", "lost")
    assert (second["hosts"], second["ok"]) == (["node0", "node3", "node4", "node5"], True)
    assert ranks_of(run) == [("node0", 0), ("node3", 1), ("node4", 2), ("node5", 3)]
    recheck = json.loads((run.run_dir / "attempt_1" / "preflight.json").read_text())
    assert recheck["spares"]["skipped"] == {"node1": ["port.blocked"]}
    assert [(c["host"], c["severity"]) for c in report["checks"] if c["id"] == "run.restart"] \
        == [("node2", "warning")]
    # Attempt 1 loaded attempt 0's checkpoint: its ranks know their attempt and where they began.
    seen = [json.loads(p.read_text()) for p in
            (remote / report["run_id"]).glob("*/attempt_1/results/rank-*.json")]
    assert sorted(s["rank"] for s in seen) == [0, 1, 2, 3]
    assert {s["attempt"] for s in seen} == {1} and min(s["resumed_from_step"] for s in seen) >= 50
    # The restart probed again only what the cut could have changed: the master's port (node0)
    # and the candidates attempt 0 did not use (node1, still skipped, and node5); node3 and
    # node4, whose agents stopped their ranks, kept their probe and were stopped and gathered
    # after the restart.
    assert "probed again: node0, node1, node5, the others kept their last probe" in run.out
    # Every attempt's logs are kept apart; logs/ is the last attempt's.
    for host in ("node0", "node3", "node4"):
        assert (run.run_dir / "attempt_0" / "logs" / host / "torchrun.log").exists(), host
    assert (run.run_dir / "logs" / "node5" / "torchrun.log").exists()
    assert os.readlink(run.run_dir / "logs") == "attempt_1/logs"
    # node2, cut off, stops its own torchrun once it cannot hear the master.
    assert wait_until(lambda: not run_processes(report["run_id"]), 60), \
        run_processes(report["run_id"])
    # While attempt 0 trained, its healthy spare imported torch (node5; node1 was skipped);
    # attempt 1, the last one max_restarts allows, prepared none.
    prepared = remote / report["run_id"] / "node5" / "spare_prepare_0.json"
    assert wait_until(lambda: prepared.exists() and "ok" in json.loads(prepared.read_text()),
                      60), prepared
    assert json.loads(prepared.read_text())["ok"] is True
    assert sorted(p.relative_to(remote / report["run_id"]).as_posix()
                  for p in (remote / report["run_id"]).glob("*/spare_prepare_*")) == [
        "node5/spare_prepare_0.json"]
    # Every async job record of the run is removed where its host was reached again, attempt
    # 0's too on the hosts attempt 1 launched on again: only node2's, cut off, may be left.
    left = {p.name: p.read_text() for p in jobs.iterdir()}
    assert len(left) <= 1 and all("/node2/" in text for text in left.values()), left


def test_a_lost_worker_with_no_spare_left_is_not_restarted_and_every_host_is_gathered(
        lab, tmp_path):
    # nnodes=3 of 3 candidates, max_restarts=1: node2's network is cut once the checkpoint
    # exists; no candidate is left to replace it. node0 and node1, whose agents stopped their
    # ranks, were left to be stopped and gathered after a restart that does not come: they are
    # gathered at once, and the report is what it was when every host was gathered before the
    # decision.
    run = node2_cut_after_the_first_checkpoint(lab, tmp_path, "-e", "nnodes=3")
    assert run.rc != 0, run.out[-5000:]
    report = run.report("train.json")
    assert report["verdict"].endswith(
        "not restarted: 2 candidate(s) remain without node2 and the run needs 3 (add spares: "
        "-e spares=K)"), report["verdict"]
    assert [(c["host"], c["detail"].split(",")[0]) for c in report["checks"]
            if c["id"] == "run.exit"] == [("node0", "aborted"), ("node1", "aborted"),
                                          ("node2", "lost")]
    play = (run.run_dir / "play.log").read_text().splitlines()
    at = play.index("PLAY [Restart | none after all; stop and gather the hosts left for later]")
    # node1; node0 (the master) too when the record was final as the watch returned.
    assert re.search(r"ok 0, changed [12], failed 0$", play[at + 1]), play[at:at + 3]
    for host in ("node0", "node1"):
        assert (run.run_dir / "attempt_0" / "logs" / host / "torchrun.log").exists(), host
    assert wait_until(lambda: not run_processes(report["run_id"]), 60), \
        run_processes(report["run_id"])


def test_twelve_hosts_get_ranks_in_inventory_order_in_fork_batches(lab, tmp_path):
    # forks=6: two batches for launch, stop and gather; the watch is one task on the master.
    # The hosts keep this run under a root of its own: the lab shares this machine's files
    # with the tests that run beside it (stop.yml on the default stops node0's runs).
    remote_root = tmp_path / "remote-runs"
    run = playbook("train.yml", tmp_path, "-f", "6", "-e", "nnodes=%d" % NODES,
                   "-e", "script=%s" % SCRIPT, "-e", "remote_runs_root=%s" % remote_root,
                   inventory=lab.inventory)
    assert run.rc == 0, run.out[-4000:]
    report = run.report("train.json")
    names = ["node%d" % i for i in range(NODES)]
    assert [(h["host"], h["node_rank"], h["ranks"]) for h in report["hosts"]] == [
        (n, i, [i]) for i, n in enumerate(names)]
    assert sorted(lab.node(n).address for n in names) != [lab.node(n).address for n in names]
    remote = remote_root / report["run_id"]
    seen = [json.loads(p.read_text()) for p in remote.glob("*/results/identity-*.json")]
    assert sorted((s["rank"], s["node_rank"], s["host"]) for s in seen) == [
        (i, i, n) for i, n in enumerate(names)]
    # Every rank saw the same world: rank i is node rank i.
    assert all(s["world"] == list(range(NODES)) for s in seen)
    assert run_processes(report["run_id"]) == []


def tmux(*argv: str, socket: str) -> str:
    return subprocess.run(["tmux", "-L", socket, *argv], check=True, capture_output=True,
                          text=True).stdout


def test_progress_fits_a_24_row_terminal_at_40_hosts_and_names_every_failing_host(lab,
                                                                                   tmp_path):
    if not shutil.which("tmux"):
        pytest.skip("needs tmux (.ci/run installs it)")
    failing = ["node5", "node17", "node33"]
    for name in failing:
        lab.hostname_loopback(name)
    lab.unreachable("node21")
    failing.append("node21")
    socket = "torchfleet-test-%d" % os.getpid()
    conf = tmp_path / "tmux.conf"
    conf.write_text("set -g history-limit 50000\n")
    argv = [str(Path(sys.executable).with_name("torchfleet")), "preflight", "-i", str(lab.inventory), "--runs-root",
            str(tmp_path / "runs")]
    command = "%s; echo TORCHFLEET-DONE rc=$?; sleep 900" % shlex.join(argv)
    try:
        tmux("-f", str(conf), "new-session", "-d", "-x", "120", "-y", "24", "-s", "tf",
             command, socket=socket)
        end = time.monotonic() + 600
        while "TORCHFLEET-DONE rc=" not in tmux("capture-pane", "-p", "-t", "tf", socket=socket):
            assert time.monotonic() < end, "the preflight did not end in 10 minutes"
            time.sleep(1)
        # Everything the terminal ever showed: the scrollback, then the screen.
        screen = tmux("capture-pane", "-p", "-J", "-S", "-", "-E", "-", "-t", "tf",
                      socket=socket)
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)
        lab.heal()
    assert re.search(r"TORCHFLEET-DONE rc=1$", screen, re.M), screen
    lines = screen.splitlines()
    # The live block was redrawn in place: its phase line is on the screen once, not once a
    # redraw, and so is each failing host's line in it.
    phase = [line for line in lines if line.startswith("preflight ")]
    assert len(phase) == 1, screen
    assert "40 of 40 hosts checked" in phase[0]
    verdict = next(line for line in lines if line.startswith("torchfleet preflight failed"))
    block = lines[lines.index(phase[0]) + 1:lines.index(verdict)]
    for name in failing:
        assert sum(1 for line in block if re.match(r"  %s  " % name, line)) == 1, screen
    # The final output names every failing host with its check.
    assert all(re.search(r"\b%s\b" % name, verdict) for name in failing), verdict
    assert "hostname.loopback" in verdict and "host.unreachable" in verdict
