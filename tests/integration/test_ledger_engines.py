"""The fleet's ledger on both engines: SQLite and a real PostgreSQL server the tests start
(lab/pg.py). Two controllers (processes) writing at once into a fresh ledger (both
creating its schema) lose no row; two adding to one host at once quarantine it once; a corrupt
SQLite file and a newer schema cost one warning and the controller goes on."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
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


# ---- issue 67: the client bounds every wait; the server's clock ----

# The lab's prefix (lab/netns.py: tflab<tag>-) with a tag of this test's own: `python -m lab
# down` and other tests never touch it, and it is deleted in a finally.
CUT_TABLE = "tflab12-pgcut"


@contextlib.contextmanager
def nft_table():
    """A table of our own for the rules that cut the server off; always deleted."""
    if os.getuid() != 0 or shutil.which("nft") is None:
        pytest.skip("cutting a connection needs root and nftables")
    subprocess.run(["nft", "add", "table", "inet", CUT_TABLE], check=True, timeout=30)
    try:
        subprocess.run(["nft", "add", "chain", "inet", CUT_TABLE, "out", "{ type filter hook "
                        "output priority 0 ; }"], check=True, timeout=30)
        yield
    finally:
        subprocess.run(["nft", "delete", "table", "inet", CUT_TABLE], timeout=30)


def test_a_client_cut_off_mid_transaction_ends_within_the_ledgers_timeout(server):
    """Issue 67 item 10: the server's port dropped (an nft rule) after the run's write began:
    the run's end waits about the ledger's timeout (tcp_user_timeout), not TCP's 15 minutes
    of retransmissions, and says what failed."""
    import sqlalchemy as sa

    url = server.create_database("cut_%d" % os.getpid())
    timeout_s = 2.0
    fleet = ledger.Fleet(url, "", timeout_s=timeout_s)
    assert fleet.hosts() == [] and fleet.warnings == []  # connected, the schema made
    cut = threading.Event()

    def cut_mid_transaction(conn, cursor, statement, *_):
        if not cut.is_set() and "ledger_incidents" in statement and "INSERT" in statement:
            # The transaction holds its advisory lock and has written the run's row.
            subprocess.run(["nft", "add", "rule", "inet", CUT_TABLE, "out", "ip", "daddr",
                            "127.0.0.1", "tcp", "dport", str(server.port), "drop"],
                           check=True, timeout=30)
            cut.set()

    sa.event.listen(fleet._engine, "before_cursor_execute", cut_mid_transaction)
    report = {"run_id": "r1", "kind": "train", "ok": False,
              "hosts": [{"host": h, "outcome": "lost" if h == "node03" else "stopped"}
                        for h in HOSTS], "first_failure": {"host": "node03", "failure": "lost"}}
    out, took = {}, {}

    def run_end():
        t = time.monotonic()
        out["newly"] = fleet.record_run(report, now=T0)
        took["s"] = time.monotonic() - t

    with nft_table():
        end = threading.Thread(target=run_end, daemon=True)
        end.start()
        end.join(timeout=10 * timeout_s)
        assert cut.is_set()
        assert not end.is_alive(), "the run's end still waits on the cut-off server"
    assert took["s"] < 3 * timeout_s, took
    assert out["newly"] == [] and len(fleet.warnings) == 1, fleet.warnings
    assert "postgresql://fleet@127.0.0.1:%d" % server.port in fleet.warnings[0]
    # Nothing of the cut transaction was kept; the next controller records it whole.
    again = ledger.Fleet(url, "", timeout_s=timeout_s)
    assert again.hosts(now=T0) == []
    again.record_run(report, now=T0)
    assert {h["host"]: h["runs"] for h in again.hosts(now=T0)}["node03"] == 1
    assert again.warnings == []
    again.close()


def test_the_servers_timeouts_are_each_transactions_never_the_sessions(server):
    """Issue 67 item 10: no startup `options` (PgBouncer's transaction pooling refuses it and
    would hand a session SET to another client): SET LOCAL in each transaction."""
    import psycopg

    url = server.create_database("local_%d" % os.getpid())
    fleet = ledger.Fleet(url, "", timeout_s=3.0)
    assert fleet.hosts() == [] and fleet.warnings == []
    with fleet._read() as conn:
        said = {k: conn.exec_driver_sql("SHOW %s" % k).scalar() for k in (
            "lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout")}
    assert said == {"lock_timeout": "3s", "statement_timeout": "18s",
                    "idle_in_transaction_session_timeout": "18s"}
    # The same server session outside the ledger's transactions: the server's defaults.
    raw = fleet._engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute("SHOW lock_timeout")
        assert cur.fetchone()[0] == "0"
        raw.rollback()
    finally:
        raw.close()
    fleet.close()
    with psycopg.connect(server.url()) as conn:  # (the server's own default, for the record)
        assert conn.execute("SHOW lock_timeout").fetchone()[0] == "0"


@pytest.fixture
def pgbouncer(server, tmp_path):
    """A real PgBouncer in transaction pooling mode in front of the server (Debian's
    pgbouncer), or a skip where it is not installed."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not os.path.exists(binary):
        pytest.skip("PgBouncer is not installed (apt-get install pgbouncer)")
    folder = tempfile.mkdtemp(prefix="torchfleet-pgbouncer-")
    os.chmod(folder, 0o777)
    port = pg.free_port()
    ini = os.path.join(folder, "pgbouncer.ini")
    with open(ini, "w") as f:
        f.write("[databases]\n* = host=127.0.0.1 port=%d\n[pgbouncer]\nlisten_addr = "
                "127.0.0.1\nlisten_port = %d\nauth_type = trust\nauth_file = %s/users\n"
                "pool_mode = transaction\nunix_socket_dir =\nlogfile = %s/log\n"
                % (server.port, port, folder, folder))
    with open(os.path.join(folder, "users"), "w") as f:
        f.write('"fleet" ""\n')
    argv = [binary, ini]
    if os.getuid() == 0:
        argv = ["runuser", "-u", pg.USER, "--"] + argv
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "no pgbouncer"
                time.sleep(0.1)
        yield "postgresql://fleet@127.0.0.1:%d/" % port
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)


def test_the_ledger_works_through_pgbouncer_in_transaction_mode(server, pgbouncer):
    """Issue 67 item 10: PgBouncer refuses the `options` startup parameter (the ledger was
    off every time). Several controllers' writes in a row (issue 67 review, finding 1):
    psycopg 3 prepared _bulk's executemany as _pg3_0 on the server connection, which
    PgBouncer hands the next client: the second and later writes failed with 'prepared
    statement "_pg3_0" already exists' and turned the ledger off."""
    url = server.create_database("bouncer_%d" % os.getpid()).rsplit("/", 1)[1]
    for i in range(4):  # a Fleet each, as each preflight and run end opens its own
        fleet = ledger.Fleet(pgbouncer + url, "", timeout_s=5.0)
        report = {"run_id": "r%d" % i, "kind": "train", "ok": False,
                  "hosts": [{"host": h, "outcome": "lost" if h == "node03" else "stopped"}
                            for h in HOSTS],
                  "first_failure": {"host": "node03", "failure": "lost"},
                  "checks": [{"id": "gpu.count", "host": "node05", "ok": False,
                              "severity": "error"}]}
        fleet.record_run(report, now=T0 + i)
        fleet.record_actions("r%d" % i, "train", [{"action": "drain", "host": "node03",
                                                   "check": "run.hardware", "why": "Xid 79",
                                                   "done": True, "at": T0 + i}], now=T0 + i)
        assert fleet.warnings == [], (i, fleet.warnings)
        fleet.close()
    fleet = ledger.Fleet(pgbouncer + url, "", timeout_s=5.0)
    listed = {h["host"]: h for h in fleet.hosts(now=T0 + 4)}
    assert listed["node03"]["incidents"] == {"culprit": 4, "lost": 4}
    assert listed["node05"]["incidents"] == {"check": 4} and listed["node00"]["runs"] == 4
    assert fleet.warnings == []
    fleet.close()


def test_times_come_from_the_servers_clock_and_a_skewed_controller_is_said(server,
                                                                          monkeypatch):
    """Issue 67 item 11: a controller a day ahead would date its incidents a day into the
    future (not decaying until then): the server's clock dates them, and the skew is said."""
    import psycopg

    url = server.create_database("skew_%d" % os.getpid())
    monkeypatch.delenv(ledger.NOW_ENV, raising=False)
    monkeypatch.setattr(ledger, "now", lambda: time.time() + 86400.0)
    fleet = ledger.Fleet(url, "")
    report = {"run_id": "r1", "kind": "train", "ok": False,
              "hosts": [{"host": h, "outcome": "lost" if h == "node03" else "stopped"}
                        for h in HOSTS], "first_failure": {"host": "node03", "failure": "lost"},
              "hardware": [{"host": "node05", "kind": "xid", "code": 79, "fatal": True,
                            "at": time.time() + 86400.0 - 60}]}
    fleet.record_run(report)
    assert fleet.warnings == []
    with psycopg.connect(url) as conn:
        server_now = conn.execute("SELECT extract(epoch FROM now())").fetchone()[0]
        dated = dict(conn.execute("SELECT host, max(at) FROM ledger_incidents GROUP BY host")
                     .fetchall())
    assert abs(dated["node03"] - float(server_now)) < 60
    assert abs(dated["node05"] - (float(server_now) - 60)) < 60  # its own time, moved
    assert len(fleet.notes) == 1 and "clock is 86400 s ahead of the database server's" in \
        fleet.notes[0]
    fleet.close()


def test_torchfleet_hosts_refuses_a_database_that_holds_no_ledger(server, capsys):
    """Issue 67 item 13, on PostgreSQL: the wrong database is not given a fresh ledger."""
    import psycopg

    from torchfleet import cli

    url = server.create_database("empty_%d" % os.getpid())
    assert cli.main(["hosts", "release", "node3", "--fleet-db", url]) == 2
    assert "holds no ledger: give --fleet-db the database the runs write" in \
        capsys.readouterr().err
    # Its listing (a monitoring job's, before the first run): one line, success.
    assert cli.main(["hosts", "--fleet-db", url]) == 0
    assert capsys.readouterr().out == "no ledger at %s yet: nothing recorded\n" % url
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'ledger_%'"
                            ).fetchone()[0] == 0
