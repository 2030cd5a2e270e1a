"""The fleet's ledger on both engines: SQLite and a real PostgreSQL server the tests start
(lab/pg.py). Two controllers (processes) writing at once into a fresh ledger (both
creating its schema) lose no row; two adding to one host at once quarantine it once; a corrupt
SQLite file and a newer schema cost one warning and the controller goes on."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections import Counter

import pytest

from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import ledger, ledger_store
from lab import pg
from tests.conftest import ROOT
from tests.unit.test_ledger import racing_controllers

T0 = 1_800_000_000.0
HOSTS = ["node%02d" % i for i in range(16)]
RUNS = 40  # per controller

# A controller: waits for the go file, then records its runs as fast as it can. Each run
# takes all 16 hosts; its culprit is the run's number's host; every run is written twice
# (the unattended finisher and an attach).
CONTROLLER = textwrap.dedent("""
    import json, os, sys, time
    from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import ledger
    fleet_db, root, name, go, n = sys.argv[1:6]
    hosts = ["node%02d" % i for i in range(16)]
    while not os.path.exists(go):
        time.sleep(0.005)
    fleet = ledger.Fleet(fleet_db, root, quarantine_score=1e9)
    for i in range(int(n)):
        culprit = hosts[i % len(hosts)]
        report = {"run_id": "%s-%d" % (name, i), "kind": "train", "ok": False,
                  "hosts": [{"host": h, "outcome": "lost" if h == culprit else "stopped"}
                            for h in hosts],
                  "first_failure": {"host": culprit, "failure": "lost"}}
        fleet.record_run(report, now=T0 + i)
        fleet.record_run(report, now=T0 + i)
    print(json.dumps(fleet.warnings))
""").replace("T0", repr(T0))


@pytest.fixture(scope="module")
def server():
    if pg.binaries() is None:  # as the Slurm lab without slurm-wlm
        pytest.skip("PostgreSQL's server is not installed (.ci/run installs postgresql)")
    with pg.server() as s:
        yield s


@pytest.fixture(params=["sqlite", "postgresql"])
def fleet_db(request, tmp_path):
    if request.param == "sqlite":
        return str(tmp_path / "fleet.db")
    s = request.getfixturevalue("server")
    return s.create_database("t_%d_%d" % (os.getpid(), time.monotonic_ns()))


def controllers(fleet_db, root, names, runs=RUNS):
    go = os.path.join(root, "go")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    procs = [subprocess.Popen([sys.executable, "-c", CONTROLLER, fleet_db, root, name, go,
                               str(runs)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for name in names]
    with open(go, "w"):
        pass  # both start at once
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def test_two_controllers_writing_at_once_into_a_fresh_ledger_lose_no_row(fleet_db, tmp_path):
    warnings = controllers(fleet_db, str(tmp_path), ["a", "b"])
    assert warnings == [[], []]
    fleet = ledger.Fleet(fleet_db, str(tmp_path))
    listed = {h["host"]: h for h in fleet.hosts(now=T0 + RUNS)}
    assert fleet.warnings == []
    assert sorted(listed) == HOSTS
    # Every host took part in every run of both; each run's culprit, once however often
    # it was written.
    assert {h["runs"] for h in listed.values()} == {2 * RUNS}
    caused = Counter(HOSTS[i % len(HOSTS)] for i in range(RUNS))
    assert {h: v["incidents"] for h, v in listed.items()} == {
        h: {"culprit": 2 * caused[h], "lost": 2 * caused[h]} for h in HOSTS}
    fleet.close()


def test_two_controllers_adding_to_one_host_at_once_quarantine_it_once(fleet_db, tmp_path):
    """Issue 65 item 4: a host at 1.0 and two controllers each adding 1.0 at once (each one's
    incident written before either reads the score; PostgreSQL's READ COMMITTED): one of them
    sees 3.0 and quarantines it."""
    out = racing_controllers(fleet_db, str(tmp_path), wait_s=2.0)
    assert sorted(len(v) for v in out.values()) == [0, 1], out
    fleet = ledger.Fleet(fleet_db, str(tmp_path))
    held = fleet.health(["node3"], now=T0 + 60)["node3"]
    assert held["quarantined_until"] is not None and held["score"] == pytest.approx(3.0, abs=0.01)
    fleet.close()


def test_a_newer_schema_warns_once_and_writes_nothing(fleet_db, tmp_path):
    first = ledger.Fleet(fleet_db, str(tmp_path))
    assert first.hosts() == [] and first.warnings == []
    first.close()
    import sqlalchemy as sa

    url, _path = ledger_store._url(fleet_db, str(tmp_path))
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE ledger_meta SET value=:v WHERE key='schema_version'"),
                     {"v": str(ledger_store.SCHEMA_VERSION + 1)})
    fleet = ledger.Fleet(fleet_db, str(tmp_path))
    assert fleet.record_run({"run_id": "r1", "hosts": [{"host": "node1", "outcome": "lost"}]},
                            now=T0) == []
    assert fleet.hosts() == [] and fleet.health(["node1"])["node1"]["score"] == 0.0
    assert len(fleet.warnings) == 1 and "schema version %d, newer than" % (
        ledger_store.SCHEMA_VERSION + 1) in fleet.warnings[0]
    with engine.begin() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM ledger_runs")).scalar() == 0
    engine.dispose()


def test_a_corrupt_sqlite_ledger_warns_once_and_the_controller_goes_on(tmp_path):
    path = tmp_path / "fleet.db"
    first = ledger.Fleet(str(path), "")
    first.record_run({"run_id": "r0", "hosts": [{"host": "node1"}]})
    first.close()  # the last connection checkpoints the WAL into the file
    with open(path, "r+b") as f:  # the header and the first pages overwritten
        f.write(os.urandom(8192))
    warnings = controllers(str(path), str(tmp_path), ["a"], runs=3)
    assert len(warnings[0]) == 1 and "is corrupt" in warnings[0][0], warnings
    assert "mv %s %s.corrupt" % (path, path) in warnings[0][0]


def test_a_writer_locked_out_past_the_timeout_warns_and_goes_on(tmp_path):
    path = tmp_path / "fleet.db"
    ledger.Fleet(str(path), "").hosts()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another controller stuck mid-write
    try:
        fleet = ledger.Fleet(str(path), "", timeout_s=0.2)
        assert fleet.record_run({"run_id": "r1", "hosts": [{"host": "node1"}]}, now=T0) == []
        assert len(fleet.warnings) == 1 and "stayed locked past its 0.2 s" in fleet.warnings[0]
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert sqlite3.connect(path).execute("SELECT count(*) FROM ledger_runs").fetchone() == (0,)


def test_postgresql_unreachable_warns_with_the_url_without_its_password(tmp_path):
    url = "postgresql://fleet:secret@127.0.0.1:%d/fleet" % pg.free_port()
    fleet = ledger.Fleet(url, "", timeout_s=2)
    assert fleet.record_run({"run_id": "r1", "hosts": [{"host": "node1"}]}) == []
    assert len(fleet.warnings) == 1 and "cannot be reached" in fleet.warnings[0]
    assert "secret" not in fleet.warnings[0] and "fleet:***@" in fleet.warnings[0]


def test_a_hostile_report_is_stored_safely_on_both_engines(fleet_db, tmp_path):
    """NUL (PostgreSQL refuses it in text), a lone surrogate (neither encodes it), names past
    the columns' width, a 400-digit attempt and garbage where lists belong."""
    odd = "node\x00\ud800" + "x" * 400
    report = {"run_id": "r\x00\udcff1", "kind": "train\x00", "hosts": [
        {"host": odd, "outcome": "lost"}, {"host": 7}, "node1", None],
        "first_failure": {"host": odd, "failure": "lost", "consequence": "no"},
        "attempts": [{"attempt": 10 ** 400, "outcomes": {odd: "lost"}, "hosts": [odd],
                      "failure": {"host": odd, "reason": "lost"}, "drain": "x",
                      "replaced": [{"host": odd, "reason": "\ud800"}]}],
        "hardware": [{"host": odd, "kind": "xid\ud800", "code": 1e999, "fatal": True}],
        "checks": [{"id": "gpu.ecc\x00", "host": odd, "ok": False, "severity": "error"}]}
    fleet = ledger.Fleet(fleet_db, str(tmp_path))
    fleet.record_run(report, now=T0)
    fleet.record_preflight(report, now=T0)
    listed = fleet.hosts(now=T0)
    assert fleet.warnings == []
    (host,) = listed
    assert host["host"].startswith("node\\ud800xxx") and len(host["host"]) <= 255
    assert host["incidents"]["culprit"] == 1 and host["incidents"]["lost"] == 1
    assert fleet.health([host["host"]], now=T0)[host["host"]]["score"] > 0
    # The audit (schema version 3), from the same hostile bytes: a kernel line is a host's.
    assert fleet.record_actions("r1", "train", [
        {"action": "stop", "host": odd, "check": "run.hardware\x00", "at": "garbage",
         "why": "NVRM: Xid \x00\ud800" + "y" * 900, "done": True}, "not a dict"], now=T0)
    (act,) = fleet.history(host["host"], now=T0)["actions"]
    assert act["done"] is True and len(act["why"]) <= 500 and "\x00" not in act["why"]
    assert fleet.warnings == []
    fleet.close()
