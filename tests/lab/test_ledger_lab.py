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
one warning and nothing else.

Then a cause every host shares (issue 65), real runs past a small quarantine_score: a mistake
at preflight, a mistake every rank meets in a run, 3 hosts lost at once; none quarantines
anybody, each is one fleet event in `torchfleet hosts`, and the next preflight takes every
host; one host lost alone, at the same threshold, is quarantined and left out."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, parent_of
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
    proc = subprocess.run(play_argv(lab, "train.yml", run_dir, *extra), cwd=ROOT,
                          env=play_env(now), capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    return Run(proc.returncode, proc.stdout + proc.stderr, Path(run_dir))


def play_env(now=None):
    """The playbooks' environment: the ledger's clock at `now`, the real one when None."""
    env = dict(os.environ, PATH="%s:%s" % (BIN, os.environ["PATH"]), ANSIBLE_NOCOLOR="1")
    env.pop("TORCHFLEET_LEDGER_NOW", None)
    return env if now is None else dict(env, TORCHFLEET_LEDGER_NOW=repr(now))


def play_argv(lab, name, run_dir, *extra, nnodes=3):
    """`name` over the lab's 5 hosts: nnodes used, the others spares."""
    return [*ansible_cli.command("ansible-playbook"), name, "-i", str(lab.inventory),
            "-e", "nnodes=%d" % nnodes, "-e", "spares=%d" % (NODES - nnodes),
            "-e", "script=%s" % NOTORCH, "-e", "run_dir=%s" % run_dir, *extra]


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


# ---- A cause every host shares, repeated past quarantine_score (issue 65) ----
# Each failure below would be a strike against every host it touched were it not the shared
# cause's (docs/ledger.md's shared causes). quarantine_max_fraction=1 turns the circuit breaker
# off, so that what keeps the hosts is that rule alone (the breaker would hold them too, as
# "fleet-wide cause suspected", with their strikes still in their scores). The ledger's clock
# is the real one: these runs are minutes apart, well within the half-life.
BREAKER_OFF = ("-e", "quarantine_max_fraction=1")


def play(lab, name, run_dir, *extra, nnodes=3):
    proc = subprocess.run(play_argv(lab, name, run_dir, *extra, nnodes=nnodes), cwd=ROOT,
                          env=play_env(), capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    return Run(proc.returncode, proc.stdout + proc.stderr, Path(run_dir))


def ledger_vars(fleet_db, score):
    return ("-e", "fleet_db=%s" % fleet_db, "-e", "quarantine_score=%g" % score, *BREAKER_OFF)


def hosts_shown(fleet_db):
    """What an operator reads: `torchfleet hosts --json` by host, and the table's text (with
    the fleet events under it)."""
    said = []
    for extra in (["--json"], []):
        shown = subprocess.run(
            [str(BIN / "torchfleet"), "hosts", *extra, "--fleet-db", str(fleet_db)],
            cwd=ROOT, capture_output=True, text=True, timeout=120, env=play_env())
        assert shown.returncode == 0, shown.stderr
        said.append(shown.stdout)
    return {r["host"]: r for r in json.loads(said[0])}, said[1]


def strikes(rows):
    """{host: its incidents that weigh} of `torchfleet hosts --json` (warnings weigh nothing)."""
    return {h: {k: n for k, n in r["incidents"].items() if ledger.WEIGHTS[k] > 0}
            for h, r in rows.items() if r["score"] > 0 or any(
                ledger.WEIGHTS[k] > 0 for k in r["incidents"])}


def quarantined_at_preflight(run):
    """The hosts preflight.json says are quarantined: its host.quarantined checks, and its
    fleet entry (a preflight every host failed leaves no host out, so names none by check)."""
    report = run.report()
    return sorted({c["host"] for c in report["checks"]
                   if c["id"] == "host.quarantined" and not c["ok"]}
                  | {h for h, v in (report.get("fleet") or {}).items()
                     if v.get("quarantined_until")})


def test_a_mistake_every_host_shares_at_preflight_quarantines_nobody(lab, tmp_path):
    """nproc_per_node=2 GPUs on the lab's GPU-less hosts (backend=nccl): gpu.count fails on
    all 5 hosts checked (3 and their 2 spare candidates), an error, 0.5 a host were it theirs.
    Three preflights at quarantine_score=0.9: the second would quarantine all 5, the third
    would show it (host.quarantined). One fleet event a preflight names the shared cause."""
    fleet_db = tmp_path / "fleet.db"
    runs = []
    for i in range(3):
        run = play(lab, "preflight.yml", tmp_path / ("p%d" % i), "-e", "backend=nccl",
                   "-e", "nproc_per_node=2", *ledger_vars(fleet_db, 0.9))
        assert run.rc != 0, run.out[-3000:]
        assert {h for c, h in run.failing() if c == "gpu.count"} == set(HOSTS), run.failing()
        assert quarantined_at_preflight(run) == [], run.out[-3000:]
        runs.append(run.report()["run_id"])
    rows, text = hosts_shown(fleet_db)
    assert set(rows) == set(HOSTS) and strikes(rows) == {}, rows
    assert all(r["quarantined_until"] is None and r["runs"] == 3 for r in rows.values()), rows
    assert "5 hosts, 0 quarantined" in text, text
    events = [line for line in text.splitlines() if "gpu.count failed on 5 of 5 hosts: a shared "
              "cause (the input, the controller, the network between)" in line]
    assert sorted(e.split()[1].rstrip(":") for e in events) == sorted(runs), text
    assert "fleet-wide cause suspected" not in text  # the evidence rule, not the breaker


def start_loop(lab, tmp_path, name, *extra, nnodes):
    """train.yml on `nnodes` hosts (the others spares) with `extra`; returns (the play, its
    run id) once every host's rank steps (steps_notorch.py, until its file exists)."""
    run_id = "%s-%d" % (name, os.getpid())
    proc = subprocess.Popen(
        play_argv(lab, "train.yml", tmp_path / name, "-e", "run_id=%s" % run_id, *extra,
                  nnodes=nnodes),
        cwd=ROOT, env=play_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)

    def stepping():
        logs = (REMOTE_RUNS / run_id).glob("node*/logs/*/attempt_0/0/stdout.log")
        return len([p for p in logs if "step" in p.read_text()]) == nnodes

    end = time.monotonic() + 240
    while not stepping() and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.2)
    if not stepping():
        run = finish(proc, tmp_path / name)
        pytest.fail("the run never stepped on %d hosts: %s" % (nnodes, run.out[-3000:]))
    return proc, run_id


def finish(proc, run_dir):
    """The play's end (interrupted, as a user would, if it is still running by then)."""
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            out, _ = proc.communicate(timeout=120)
    return Run(proc.returncode, out, run_dir)


def test_a_mistake_every_rank_meets_in_a_run_quarantines_nobody(lab, tmp_path):
    """Every rank of 3 hosts exits 3 at the same step (steps_notorch.py all: a bug the script
    meets everywhere), twice, at quarantine_score=0.25, a script failure's smallest strike (a
    quarter, where other hosts failed too): any strike at all would quarantine its host, and
    the second run's preflight would leave it out for a spare. Fail-fast may stop a host
    before its rank gets there; most hosts failing on their own is the shared cause."""
    fleet_db = tmp_path / "fleet.db"
    for i in range(2):
        go = tmp_path / ("go%d" % i)
        proc, _run_id = start_loop(lab, tmp_path, "r%d" % i, *args(go, "all"),
                                   *ledger_vars(fleet_db, 0.25), nnodes=3)
        # Every rank exits at one moment 1.5 s on (every rank looks for the file each 0.2 s),
        # as ranks in lockstep meet a bug together.
        go.write_text(repr(time.time() + 1.5))
        run = finish(proc, tmp_path / ("r%d" % i))
        assert run.rc != 0, run.out[-3000:]
        assert [h["host"] for h in run.report()["hosts"]] == HOSTS[:3], run.report()["hosts"]
        assert quarantined_at_preflight(run) == []
        report = run.report("train.json")
        outcomes = {h["host"]: h["outcome"] for h in report["hosts"]}
        assert len([o for o in outcomes.values() if o == "failed"]) >= 2, outcomes
        assert report["first_failure"]["exit_code"] == 3, report["first_failure"]
        assert not report.get("quarantined"), report["quarantined"]
    rows, text = hosts_shown(fleet_db)
    assert strikes(rows) == {}, rows
    assert all(r["quarantined_until"] is None for r in rows.values()), rows
    assert len([line for line in text.splitlines() if re.search(
        r"run\.exit failed on [23] of 3 hosts: a shared cause", line)]) == 2, text


def lose(lab, tmp_path, name, fleet_db, go, *hosts):
    """A run of 4 hosts (node4 a spare) whose `hosts` fall silent at once, their agents
    SIGKILLed (torchrun and its rank with them, as hosts that lost power), judged lost after
    5 s; returns it once it ended."""
    proc, run_id = start_loop(lab, tmp_path, name, *args(go), "-e", "lost_after_s=5",
                              *ledger_vars(fleet_db, LOST_SCORE), nnodes=4)
    try:
        for h in hosts:
            torchrun = json.loads((REMOTE_RUNS / run_id / h / "torchrun.pid").read_text())["pid"]
            os.kill(parent_of(torchrun), signal.SIGKILL)
    finally:
        run = finish(proc, tmp_path / name)
    assert run.rc != 0, run.out[-3000:]
    outcomes = {h["host"]: h["outcome"] for h in run.report("train.json")["hosts"]}
    assert sorted(h for h, o in outcomes.items() if o == "lost") == sorted(hosts), outcomes
    return run


# A loss weighs 1.0 (a little less by the time the run's end decides, decayed from the loss's
# moment: 1.0 would not be reached): a host's own loss passes 0.9.
LOST_SCORE = 0.9


def test_hosts_lost_together_quarantine_none_one_lost_alone_is(lab, tmp_path):
    """node1, node2 and node3 lost at once (a switch, a PDU), twice, at quarantine_score=0.9:
    none of them is quarantined and the next preflight takes them. Then node1 lost alone:
    it is quarantined, and the next preflight leaves it out for node4 (the same ledger, the
    same threshold: the rule tells one moment's losses from a host's)."""
    fleet_db, go = tmp_path / "fleet.db", tmp_path / "go"
    for i in range(2):
        run = lose(lab, tmp_path, "together%d" % i, fleet_db, go, "node1", "node2", "node3")
        assert quarantined_at_preflight(run) == []
        assert not run.report("train.json").get("quarantined")
    rows, text = hosts_shown(fleet_db)
    assert strikes(rows) == {}, rows
    assert all(r["quarantined_until"] is None for r in rows.values()), rows
    assert len([line for line in text.splitlines() if "host.lost: 3 hosts lost within "
                "lost_after_s (5 s) of each other: a shared cause" in line]) == 2, text
    pre = play(lab, "preflight.yml", tmp_path / "next", *ledger_vars(fleet_db, LOST_SCORE),
               nnodes=4)
    assert pre.rc == 0, pre.out[-3000:]
    assert [h["host"] for h in pre.report()["hosts"]] == HOSTS[:4]
    assert quarantined_at_preflight(pre) == []
    # The contrast: the same loss, one host at a time, is that host's.
    run = lose(lab, tmp_path, "alone", fleet_db, go, "node1")
    assert [q["host"] for q in run.report("train.json").get("quarantined", [])] == ["node1"]
    rows, _text = hosts_shown(fleet_db)
    assert rows["node1"]["quarantined_until"] is not None and \
        rows["node1"]["incidents"].get("lost") == 1, rows["node1"]
    assert set(strikes(rows)) == {"node1"}, rows
    pre = play(lab, "preflight.yml", tmp_path / "after", *ledger_vars(fleet_db, LOST_SCORE),
               nnodes=4)
    assert pre.rc == 0, pre.out[-3000:]
    assert [h["host"] for h in pre.report()["hosts"]] == ["node0", "node2", "node3", "node4"]
