"""The fleet's memory for real (issue 60): 5 lab hosts, 30 short runs of 3 of them (nnodes=3,
spares=2), two hours apart on the ledger's clock (TORCHFLEET_LEDGER_NOW); node1 is made to fail
every third run it takes part in (its rank exits 3: the first failure's culprit), and node3's
data is missing at the first run's preflight (a warning: its history) and a run elsewhere
named it a straggler (its score: the spare of a history).

Three runs are real train.yml runs over the lab (the first, where node1 fails and node3 is
skipped; the first with node1 quarantined; one with a corrupt ledger file); the others go
through the same modules in this process (preflight's decision over probes shaped like
node_probe's, run_summary over the first run's own state record, its hosts and outcome
rewritten), each with the clock of its place in the sequence. What a user checks: node1 is
quarantined after at most 3 incidents and no other host ever is; while it is, preflight leaves
it out with a warning and takes the healthiest spare (node4, not node3); the quarantine ends
when it said it would; `torchfleet hosts --json` shows it all; a corrupt ledger costs the run
one warning and nothing else."""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from tests.integration.playbook import BIN, ROOT, Run
from tests.lab import conftest as labs
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import (
    ledger, preflight, summary)
from torchfleet import ansible_cli

# slow: docs/testing.md's tiers (bash tests/run --all, or --touching a source it covers)
pytestmark = [pytest.mark.lab, pytest.mark.slow]
MODULE = Path(__file__).stem
NODES = labs.LABS[MODULE][1]  # its lab: tests/lab/conftest.py's LABS
REMOTE_RUNS = labs.runs_root(MODULE)
NOTORCH = FIXTURES / "scripts" / "steps_notorch.py"
HOSTS = ["node%d" % i for i in range(NODES)]
FAILING, BLEMISHED = "node1", "node3"
RUNS, EVERY_S = 30, 2 * 3600.0
# The ledger's clock at run 0: this machine's, as the real run 0 dates its incidents by the
# real clock (each incident is dated when it happened); the later runs are on the ledger's
# injected clock, EVERY_S apart.
T0 = float(int(time.time()))


def at(i):
    return T0 + i * EVERY_S


def train(lab, run_dir, now, *extra):
    """train.yml over the lab's 5 hosts (3 used, 2 spares) with the ledger's clock at `now`:
    steps_notorch.py, whose ranks stop at once (the file they wait for is there)."""
    env = dict(os.environ, PATH="%s:%s" % (BIN, os.environ["PATH"]),
               TORCHFLEET_LEDGER_NOW=repr(now), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run(
        [*ansible_cli.command("ansible-playbook"), "train.yml", "-i", str(lab.inventory),
         "-e", "nnodes=3", "-e", "spares=2", "-e", "script=%s" % NOTORCH,
         "-e", "run_dir=%s" % run_dir, *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        stdin=subprocess.DEVNULL)
    return Run(proc.returncode, proc.stdout + proc.stderr, Path(run_dir))


def args(go, *fail_rank):
    return ("-e", json.dumps({"script_args": [str(go), *map(str, fail_rank)]}))


def defaults_of(spec):
    return {k: v.get("default") for k, v in spec.items()}


def probes_of(lab):
    """What node_probe says of each lab host, healthy (the unit tests' shape, the lab's
    addresses)."""
    from tests.unit import test_preflight_checks as shapes

    shapes.ADDR.update({n.name: n.address for n in lab.nodes})
    probes = {h: shapes.probe(h, master=(h == HOSTS[0])) for h in HOSTS}
    for p in probes.values():
        p["gpus"] = []
    connects = {h: shapes.connect(h) for h in HOSTS}
    return probes, connects


def renamed(record, hosts):
    """The first run's state record for `hosts` (node1 kept where it is one of them)."""
    text = json.dumps(record)
    was = [h["host"] for h in sorted(record["hosts"], key=lambda h: h["node_rank"])]
    mapping = dict(zip(was, hosts, strict=True))
    return json.loads(re.sub(r"\bnode\d\b", lambda m: mapping.get(m.group(0), m.group(0)), text))


def succeeded(record):
    """The failing record as a run that ended well: every host's ranks exit 0."""
    out = json.loads(json.dumps(record))
    out.update(phase="succeeded", failure=None, failures=[])
    for h in out["hosts"]:
        h.update(state="exited", rc=0)
    return out


def decide_preflight(lab, fleet_db, run_dir, i, monkeypatch):
    probes, connects = probes_of(lab)
    monkeypatch.setenv("TORCHFLEET_LEDGER_NOW", repr(at(i)))
    params = dict(defaults_of(preflight.ARGUMENT_SPEC), hosts=HOSTS, nnodes=3, spares=2,
                  inventory_size=NODES, probes=probes, connects=connects, backend="gloo",
                  run_id=run_dir.name, run_dir=str(run_dir), fleet_db=str(fleet_db))
    return preflight.decide(params)


def decide_run(record, hosts, fleet_db, run_dir, i, monkeypatch):
    monkeypatch.setenv("TORCHFLEET_LEDGER_NOW", repr(at(i)))
    params = dict(defaults_of(summary.ARGUMENT_SPEC), kind="train", run_id=run_dir.name,
                  hosts=hosts, state=renamed(record, hosts), world_size=len(hosts),
                  settings={"nproc_per_node": 1}, run_dir=str(run_dir), expect_results=False,
                  fleet_db=str(fleet_db))
    return summary.decide(params)


def test_thirty_runs_quarantine_the_failing_host_and_only_it(lab, tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    fleet_db = tmp_path / "fleet.db"  # one ledger for the real runs and the others
    go = tmp_path / "go"
    go.write_text("")
    # Run 0, for real: node1's rank fails; node3's data is missing (a spare: skipped).
    lab.remove_data(BLEMISHED)
    try:
        first = train(lab, runs / "r00", at(0), *args(go, 1), "-e", "fleet_db=%s" % fleet_db)
    finally:
        lab.heal()
    assert first.rc != 0, first.out[-3000:]
    report = first.report("train.json")
    assert report["first_failure"]["host"] == FAILING, report["first_failure"]
    assert first.report()["spares"]["skipped"] == {BLEMISHED: ["data.missing"]}
    record = json.loads((first.run_dir / "run_state.json").read_text())
    fails, ok = record, succeeded(record)
    # node3's missing data is a warning: its history, not its score. What ranks it below node4
    # is a run elsewhere that waited for it (a straggler, 0.5).
    seed = ledger.Fleet(str(fleet_db), str(runs))
    assert seed.record_run({"run_id": "elsewhere", "kind": "train", "ok": True,
                            "hosts": [{"host": BLEMISHED, "outcome": "succeeded"}],
                            "stragglers": [{"host": BLEMISHED}]}, now=at(0) + 60) == []
    seed.close()

    chosen_at, newly, incidents, quarantined_at, until, ended = {}, [], 0, None, None, None
    for i in range(1, RUNS):
        run_dir = runs / ("r%02d" % i)
        if i == 7:  # node1 is held by now: a real run shows it
            real = train(lab, run_dir, at(i), *args(go), "-e", "fleet_db=%s" % fleet_db)
            assert real.rc == 0, real.out[-3000:]
            pre = real.report()
            chosen = [n["host"] for n in pre["hosts"]]
            health = ledger.Fleet(str(fleet_db), str(runs)).health(HOSTS, now=at(i))
            assert "%s: %s" % (FAILING, health[FAILING]["history"]) in real.out
            row = next(line for line in real.out.splitlines()
                       if "host.quarantined" in line and FAILING in line)
            assert "WARN" in row
            chosen_at[i] = chosen
            continue
        if until is not None and at(i) >= until and ended is None:
            # The first run past the quarantine's end: it ended when it said it would.
            fleet = ledger.Fleet(str(fleet_db), str(runs))
            assert fleet.health([FAILING], now=until - 1)[FAILING]["quarantined_until"] == until
            assert fleet.health([FAILING], now=until)[FAILING]["quarantined_until"] is None
            ended = i
        pre = decide_preflight(lab, fleet_db, run_dir, i, monkeypatch)
        assert pre["ok"], pre["table"]
        chosen = [n["host"] for n in pre["nodes"]]
        chosen_at[i] = chosen
        newly += [(i, q["host"]) for q in pre.get("quarantined", [])]
        fail = FAILING in chosen and i % 3 == 0
        incidents += fail
        end = decide_run(fails if fail else ok, chosen, fleet_db, run_dir, i, monkeypatch)
        assert end["ok"] is not fail
        for q in end.get("quarantined", []):
            newly.append((i, q["host"]))
            if q["host"] == FAILING and quarantined_at is None:
                quarantined_at, until = i, q["until"]
                # run 0 was node1's first incident
                assert incidents + 1 <= 3, (i, incidents)
                assert {"host": FAILING, "reason": "host.quarantined"}.items() <= \
                    next(d for d in end["drain"] if d["host"] == FAILING).items()
    assert quarantined_at is not None, "node1 was never quarantined"
    assert {h for _i, h in newly} == {FAILING}, newly  # no healthy host, ever
    # While quarantined node1 is left out, its place taken by the healthiest spare (node4:
    # node3 has a history); the quarantine ends when it said.
    held = [i for i in chosen_at if at(quarantined_at) < at(i) < until]
    assert held and all(chosen_at[i] == ["node0", "node2", "node4"] for i in held), chosen_at
    assert ended is not None and FAILING in chosen_at[ended], chosen_at.get(ended)
    # Where people look: torchfleet hosts.
    shown = subprocess.run(
        [str(BIN / "torchfleet"), "hosts", "--json", "--fleet-db", str(fleet_db)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, TORCHFLEET_LEDGER_NOW=repr(at(RUNS))))
    assert shown.returncode == 0, shown.stderr
    rows = {r["host"]: r for r in json.loads(shown.stdout)}
    assert set(rows) == set(HOSTS)
    assert rows[FAILING]["incidents"].get("culprit", 0) >= 3
    assert rows[FAILING]["score"] == max(r["score"] for r in rows.values())
    assert all(rows[h]["quarantined_until"] is None for h in HOSTS if h != FAILING)


def test_a_corrupt_ledger_costs_the_run_one_warning(lab, tmp_path):
    go = tmp_path / "go"
    go.write_text("")
    fleet_db = tmp_path / "fleet.db"
    fleet_db.write_bytes(b"this is not an SQLite database\n" * 64)
    run = train(lab, tmp_path / "run", T0, *args(go), "-e", "fleet_db=%s" % fleet_db)
    assert run.rc == 0, run.out[-3000:]
    said = [c for c in run.report()["checks"] if c["id"] == "fleet.ledger"]
    assert len(said) == 1 and said[0]["severity"] == "warning", said
    assert run.report("train.json")["ok"]
    assert not [c for c in run.report("train.json")["checks"] if c["id"] == "fleet.ledger"]
    assert fleet_db.read_bytes().startswith(b"this is not")  # left for its owner to look at
