"""The fleet's ledger on SQLite (reports/ledger.py): what a report records per host, the score,
quarantine and release, `hosts`, the textfile, and failing open. Both engines and two writers
at once: tests/integration/test_ledger_engines.py."""
from __future__ import annotations

import json
import re
import sqlite3
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import ledger, ledger_store
from tests.conftest import ROOT, examples

T0 = 1_800_000_000.0
H = 3600.0
HOSTS = ["node%d" % i for i in range(5)]


def train(run_id, culprit=None, reason="lost", hardware=(), stragglers=(), hosts=HOSTS,
          attempts=None):
    rows = [{"host": h, "outcome": (reason if reason == "lost" else "failed")
             if h == culprit else "stopped" if culprit else "succeeded"} for h in hosts]
    report = {"run_id": run_id, "kind": "train", "ok": culprit is None, "hosts": rows,
              "checks": [], "hardware": list(hardware), "stragglers": list(stragglers)}
    if culprit:
        report["first_failure"] = {"host": culprit, "failure": reason, "consequence": False}
        report["checks"].append({"id": "host.lost" if reason == "lost" else "run.exit",
                                 "host": culprit, "ok": False, "severity": "error"})
    if attempts is not None:
        report["attempts"] = attempts
    return report


@pytest.fixture
def fleet(tmp_path):
    f = ledger.Fleet("fleet.db", str(tmp_path))
    yield f
    f.close()


def test_three_failures_a_host_caused_within_a_day_quarantine_it_one_or_two_do_not(fleet):
    assert fleet.record_run(train("r1", "node3"), now=T0) == []
    assert fleet.record_run(train("r2", "node3"), now=T0 + 11 * H) == []
    out = fleet.record_run(train("r3", "node3"), now=T0 + 23 * H)
    assert [q["host"] for q in out] == ["node3"]
    assert out[0]["until"] == T0 + 23 * H + defaults.default("quarantine_h") * H
    assert "3 incidents in 7 days" in out[0]["reason"]
    health = fleet.health(HOSTS, now=T0 + 24 * H)
    assert health["node3"]["quarantined_until"] == out[0]["until"]
    assert health["node3"]["history"].startswith("3 incidents in 7 days: ")
    assert health["node3"]["history"] == "3 incidents in 7 days: lost x3"  # said once each
    # The hosts the failure stopped are not blamed.
    assert all(health[h] == {"score": 0.0, "quarantined_until": None, "reason": "",
                             "history": ""} for h in HOSTS if h != "node3")
    assert fleet.warnings == []


def test_the_default_threshold_is_passed_by_three_culprits_spread_over_a_day_not_two():
    """quarantine_score's default, as docs/variables.md says it."""
    decay = 0.5 ** (24 / defaults.default("ledger_half_life_h"))
    assert 1 + 1 + decay >= defaults.default("quarantine_score") > 2 * 1.0


def test_the_same_run_written_twice_counts_once(fleet):
    """The unattended finisher and a later attach write the same train.json."""
    for _ in range(3):
        fleet.record_run(train("r1", "node3"), now=T0)
    listed = {h["host"]: h for h in fleet.hosts(now=T0)}
    assert listed["node3"]["runs"] == 1
    assert listed["node3"]["incidents"] == {"culprit": 1, "lost": 1}
    assert listed["node3"]["score"] == 1.0


def test_a_run_and_its_preflight_count_one_run_a_host_it_added_counts_too(fleet):
    fleet.record_preflight({"run_id": "r1", "hosts": [{"host": h} for h in HOSTS[:3]]}, now=T0)
    fleet.record_run(train("r1", hosts=HOSTS[:2] + ["node4"]), now=T0 + 60)
    runs = {h["host"]: h["runs"] for h in fleet.hosts(now=T0 + 60)}
    assert runs == {"node0": 1, "node1": 1, "node2": 1, "node4": 1}
    since = {h["host"]: h["runs"] for h in fleet.hosts(since_s=3600, now=T0 + 60)}
    assert since == runs


def test_incidents_decay_with_the_half_life_and_a_quarantine_ends_on_time(fleet):
    for i in range(3):
        fleet.record_run(train("r%d" % i, "node3"), now=T0 + i)
    until = T0 + 2 + 24 * H
    assert fleet.health(["node3"], now=until - 1)["node3"]["quarantined_until"] == until
    after = fleet.health(["node3"], now=until)["node3"]
    assert after["quarantined_until"] is None
    week = fleet.health(["node3"], now=T0 + 168 * H)["node3"]["score"]
    assert week == pytest.approx(1.5, abs=0.01)


def test_a_release_ends_the_quarantine_and_forgives_the_past(fleet):
    for i in range(3):
        fleet.record_run(train("r%d" % i, "node3"), now=T0 + i)
    assert fleet.release("node3", now=T0 + H)
    assert fleet.health(["node3"], now=T0 + H)["node3"] == {
        "score": 0.0, "quarantined_until": None, "reason": "", "history": ""}
    # One new failure after the release does not bring it back.
    assert fleet.record_run(train("r9", "node3"), now=T0 + 2 * H) == []


def test_a_quarantine_by_hand_lasts_its_hours(fleet):
    assert fleet.quarantine("node1", 2, "bad fan", now=T0)
    h = fleet.health(["node1"], now=T0 + H)["node1"]
    assert h["quarantined_until"] == T0 + 2 * H and h["reason"] == "bad fan"
    assert fleet.health(["node1"], now=T0 + 2 * H)["node1"]["quarantined_until"] is None
    assert not fleet.quarantine("node1", 0, now=T0)


def test_a_fatal_hardware_event_weighs_more_than_a_warning(fleet):
    xid = {"host": "node2", "kind": "xid", "code": 79, "fatal": True, "line": "NVRM: Xid 79"}
    warn = {"host": "node1", "kind": "aer", "code": "corrected", "fatal": False}
    fleet.record_run(train("r1", hardware=[xid, warn]), now=T0)
    h = fleet.health(["node1", "node2"], now=T0)
    assert h["node2"]["score"] == 1.5 and h["node1"]["score"] == 0.0  # history, no score
    assert h["node2"]["history"] == "1 incident in 7 days: Xid 79 x1"
    assert h["node1"]["history"] == ""  # warnings alone make no history line


def test_a_failure_every_host_shared_is_no_strike_one_fewer_than_half_shared_a_quarter(fleet):
    """A script that fails on every host (the first to die is chance): the shared cause's,
    recorded once; failed beside one other of five (fewer than half): a quarter."""
    report = train("r1", "node0", reason="failed")
    for row in report["hosts"]:
        row["outcome"] = "failed"
    fleet.record_run(report, now=T0)
    assert fleet.health(["node0"], now=T0)["node0"]["score"] == 0.0
    assert [e["what"] for e in fleet.events(now=T0)] == [
        "run.exit failed on 5 of 5 hosts: a shared cause (the input, the controller, the "
        "network between)"]
    report = train("r2", "node1", reason="failed")
    report["hosts"][2]["outcome"] = "failed"
    fleet.record_run(report, now=T0)
    assert fleet.health(["node1"], now=T0)["node1"]["score"] == ledger.SHARED_CULPRIT


def test_every_attempt_of_a_restarted_run_is_recorded(fleet):
    attempts = [
        {"attempt": 0, "hosts": ["node0", "node1", "node3"], "outcomes": {
            "node0": "stopped", "node1": "stopped", "node3": "lost"},
         "failure": {"host": "node3", "reason": "lost"}, "drain": [],
         "replaced": [{"host": "node3", "reason": "host.lost", "by": "node4"}]},
        {"attempt": 1, "hosts": ["node0", "node1", "node4"], "outcomes": {},
         "failure": None, "drain": [], "replaced": []}]
    fleet.record_run(train("r1", hosts=["node0", "node1", "node4"], attempts=attempts), now=T0)
    listed = {h["host"]: h for h in fleet.hosts(now=T0)}
    assert listed["node3"]["incidents"] == {"culprit": 1, "lost": 1, "restart": 1}
    assert listed["node3"]["score"] == 1.0  # one failure, seen three ways
    assert listed["node4"]["runs"] == 1 and listed["node4"]["score"] == 0.0


def test_a_preflight_blames_the_hosts_own_failed_checks_not_the_masters_ports(fleet):
    checks = [{"id": "gpu.ecc", "host": "node2", "ok": False, "severity": "error"},
              {"id": "host.quarantined", "host": "node3", "ok": False, "severity": "warning"},
              {"id": "gpu.throttle", "host": "node4", "ok": False, "severity": "warning"}]
    # failed by every host: the user's input, not a host's (one host alone: its own)
    checks += [{"id": "script.missing", "host": h, "ok": False, "severity": "error"}
               for h in HOSTS]
    checks += [{"id": "port.blocked", "host": h, "ok": False, "severity": "error"}
               for h in HOSTS[1:]]
    report = {"run_id": "p1", "kind": "preflight", "hosts": [{"host": h} for h in HOSTS],
              "checks": checks}
    fleet.record_preflight(report, now=T0)
    listed = {h["host"]: h for h in fleet.hosts(now=T0)}
    assert listed["node2"]["incidents"] == {"check": 1}
    assert listed["node2"]["last_incident"] == {"run_id": "p1", "check": "gpu.ecc",
                                                "at": ledger.iso(T0)}
    assert listed["node3"]["incidents"] == {}  # the ledger's own verdict feeds nothing back
    assert listed["node4"]["incidents"] == {"warning": 1}
    assert listed["node1"]["incidents"] == {}
    fleet.record_preflight(dict(report, run_id="p2", checks=[
        {"id": "data.missing", "host": "node3", "ok": False, "severity": "error"}]), now=T0)
    assert {h["host"]: h for h in fleet.hosts(now=T0)}["node3"]["incidents"] == {"check": 1}


def test_hosts_json_shape_and_since(fleet):
    fleet.record_run(train("old", "node1"), now=T0)
    fleet.record_run(train("new", "node2"), now=T0 + 10 * 86400)
    listed = fleet.hosts(since_s=7 * 86400, now=T0 + 10 * 86400)
    assert listed[0]["host"] == "node2"  # worst first
    assert set(listed[0]) >= {"host", "runs", "incidents", "score", "quarantined_until",
                              "last_incident"}
    one = {h["host"]: h for h in listed}["node1"]
    assert one["runs"] == 1 and one["incidents"] == {} and one["score"] > 0
    json.dumps(listed)


def test_the_textfile_is_prometheus_text_written_whole(fleet, tmp_path):
    fleet.record_run(train("r1", "node3"), now=T0)
    fleet.quarantine('we"ird\\host', 1, now=T0)
    path = tmp_path / "torchfleet.prom"
    assert fleet.textfile(str(path), now=T0)
    text = path.read_text()
    assert 'torchfleet_host_score{host="node3"} 1.0' in text
    assert 'torchfleet_host_incidents_total{host="node3",kind="lost"} 1.0' in text
    assert 'torchfleet_host_quarantined{host="we\\"ird\\\\host"} 1.0' in text
    # node-exporter drops a whole file with one bad line: every line parses
    # (a failed write: test_a_textfile_write_that_fails_leaves_the_last_one_whole).
    assert parsed(text)['torchfleet_host_runs_total{host="node3"}'] == 1.0


def test_off_does_nothing(tmp_path):
    f = ledger.Fleet("", str(tmp_path))
    assert f.record_run(train("r1", "node3")) == [] and f.hosts() == []
    assert f.health(["node1"])["node1"]["score"] == 0.0
    assert list(tmp_path.iterdir()) == [] and f.warnings == []


def test_a_corrupt_file_warns_once_and_the_caller_goes_on(tmp_path):
    (tmp_path / "fleet.db").write_bytes(b"this is not a database at all" * 100)
    f = ledger.Fleet("fleet.db", str(tmp_path))
    assert f.record_run(train("r1", "node3"), now=T0) == []
    assert f.health(["node3"], now=T0)["node3"]["score"] == 0.0
    assert f.hosts() == [] and not f.textfile(str(tmp_path / "x.prom"))
    assert len(f.warnings) == 1
    assert "fleet.db is corrupt" in f.warnings[0] and "mv " in f.warnings[0]


def test_a_newer_schema_warns_and_is_left_alone(tmp_path):
    ledger.Fleet("fleet.db", str(tmp_path)).hosts()
    db = sqlite3.connect(tmp_path / "fleet.db")
    db.execute("UPDATE ledger_meta SET value='9' WHERE key='schema_version'")
    db.commit()
    db.close()
    f = ledger.Fleet("fleet.db", str(tmp_path))
    assert f.record_run(train("r1", "node3"), now=T0) == []
    assert len(f.warnings) == 1 and "schema version 9, newer" in f.warnings[0]
    db = sqlite3.connect(tmp_path / "fleet.db")
    assert db.execute("SELECT count(*) FROM ledger_incidents").fetchone() == (0,)
    db.close()


def test_the_schema_is_versioned_and_wal(fleet, tmp_path):
    fleet.hosts()
    db = sqlite3.connect(tmp_path / "fleet.db")
    assert db.execute("SELECT value FROM ledger_meta").fetchall() == [
        (str(ledger_store.SCHEMA_VERSION),)]
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    db.close()


def test_every_version_has_its_step_and_a_reopened_ledger_keeps_its_rows(fleet, tmp_path):
    assert sorted(ledger_store.MIGRATIONS) == list(range(1, ledger_store.SCHEMA_VERSION + 1))
    fleet.record_run(train("r1", "node3"), now=T0)
    fleet.close()
    again = ledger.Fleet("fleet.db", str(tmp_path))
    assert {h["host"]: h["runs"] for h in again.hosts(now=T0)}["node3"] == 1
    assert again.warnings == []


def test_a_version_1_ledger_gains_the_fleet_events_and_keeps_its_rows(fleet, tmp_path):
    fleet.record_run(train("r1", "node3"), now=T0)
    fleet.close()
    db = sqlite3.connect(tmp_path / "fleet.db")  # as torchfleet before issue 65 left it
    db.execute("DROP TABLE ledger_events")
    db.execute("DROP TABLE ledger_actions")
    db.execute("UPDATE ledger_meta SET value='1' WHERE key='schema_version'")
    db.commit()
    db.close()
    again = ledger.Fleet("fleet.db", str(tmp_path))
    assert again.record_preflight(gpu_count_preflight("p1"), now=T0) == []
    assert [e["check"] for e in again.events(now=T0)] == ["gpu.count"]
    assert {h["host"]: h["score"] for h in again.hosts(now=T0)}["node3"] == 1.0
    # version 3's audit table too: an action recorded twice (the finisher, an attach) is one
    audit = [{"action": "stop", "host": "node3", "check": "run.hardware",
              "at": ledger.iso(T0), "why": "Xid 79", "done": True}]
    assert again.record_actions("r1", "train", audit, now=T0)
    assert again.record_actions("r1", "train", audit, now=T0)
    assert again.history("node3", now=T0)["actions"] == [
        {"run_id": "r1", "action": "stop", "check": "run.hardware", "why": "Xid 79",
         "done": True, "at": ledger.iso(T0)}]
    assert again.warnings == []


def test_the_fleet_events_are_said_under_the_hosts(fleet):
    from torchfleet import hosts_cli

    fleet.record_preflight(gpu_count_preflight("p1"), now=T0)
    text = hosts_cli.hosts_text(fleet.hosts(now=T0), "fleet.db", None, fleet.events(now=T0))
    assert text.endswith("fleet events (a shared cause, no strike against any host):\n"
                         "%s p1: gpu.count failed on 8 of 8 hosts: a shared cause (the input, "
                         "the controller, the network between)" % ledger.iso(T0))


def test_without_sqlalchemy_one_warning(monkeypatch, tmp_path):
    monkeypatch.setattr(ledger_store, "HAS_SQLALCHEMY", False)
    f = ledger.Fleet("fleet.db", str(tmp_path))
    assert f.record_run(train("r1", "node3")) == [] and f.hosts() == []
    assert len(f.warnings) == 1 and "pip install 'sqlalchemy>=2'" in f.warnings[0]


def test_an_unwritable_directory_warns(tmp_path):
    (tmp_path / "file").write_text("")
    f = ledger.Fleet(str(tmp_path / "file" / "fleet.db"), "")
    assert f.record_run(train("r1", "node3")) == []
    assert len(f.warnings) == 1 and f.warnings[0].startswith("the fleet's ledger ")


def test_the_injected_clock(monkeypatch):
    monkeypatch.setenv(ledger.NOW_ENV, "1234.5")
    assert ledger.now() == 1234.5
    monkeypatch.setenv(ledger.NOW_ENV, "nan")
    assert ledger.now() > 1e9


# A report from another host's bytes: any JSON value where a field is expected.
# Text with NUL and lone surrogates (json.loads gives both).
TEXT = st.text(st.characters(exclude_categories=()), max_size=300)
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
FIELDS = ("run_id", "kind", "hosts", "first_failure", "attempts", "hardware", "drain", "goodput",
          "stragglers", "checks", "spares")
REPORT = st.fixed_dictionaries({}, optional={k: JSON for k in FIELDS}) | JSON
HOSTILE_ROWS = st.fixed_dictionaries({"run_id": TEXT, "hosts": st.lists(
    st.fixed_dictionaries({"host": TEXT, "outcome": st.sampled_from(["lost", "failed"])}),
    max_size=3), "first_failure": st.fixed_dictionaries(
        {"host": TEXT, "failure": TEXT, "consequence": JSON}),
    "hardware": st.lists(st.fixed_dictionaries({"host": TEXT, "kind": TEXT,
                                                "code": JSON, "fatal": JSON, "at": JSON}),
                         max_size=2),
    # The times an incident is dated by: goodput's failures, a straggler's last_seen.
    "goodput": st.fixed_dictionaries({"failures": st.lists(st.fixed_dictionaries(
        {"attempt": JSON, "at": JSON}), max_size=3)}),
    "stragglers": st.lists(st.fixed_dictionaries({"host": TEXT, "last_seen": st.sampled_from(
        ["2027-01-15T08:00:00Z", "9999-99-99T99:99:99Z", "\x00" * 20]) | TEXT}), max_size=2)})


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reports=st.lists(REPORT | HOSTILE_ROWS, min_size=1, max_size=3))
def test_a_report_from_another_hosts_bytes_never_raises(tmp_path_factory, reports):
    f = ledger.Fleet("fleet.db", str(tmp_path_factory.mktemp("ledger")))
    for report in reports:
        f.record_run(report, now=T0)
        f.record_preflight(report, now=T0)
    listed = f.hosts(now=T0)
    json.dumps(listed)
    assert f.warnings == [], f.warnings  # stored as given, NUL and surrogates made safe
    f.health([h["host"] for h in listed], now=T0)
    f.close()


def test_the_cli_lists_releases_and_quarantines(tmp_path, capsys, monkeypatch):
    from torchfleet import cli

    root = str(tmp_path)
    assert cli.main(["hosts", "--runs-root", root]) == 0
    assert capsys.readouterr().out == "no ledger at %s/fleet.db yet: nothing recorded\n" % root
    assert not (tmp_path / "fleet.db").exists()  # listing creates nothing
    fleet = ledger.Fleet("fleet.db", root)
    for i in range(3):
        fleet.record_run(train("r%d" % i, "node3"))
    fleet.close()
    assert cli.main(["hosts", "--runs-root", root, "--json", "--since", "7d"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed[0]["host"] == "node3" and listed[0]["quarantined_until"].endswith("Z")
    assert listed[0]["incidents"] == {"culprit": 3, "lost": 3}
    assert cli.main(["hosts", "--runs-root", root]) == 0
    out = capsys.readouterr().out
    assert "node3: score 3.00 >= quarantine_score 2.5" in out and "1 quarantined" in out
    fleet = ledger.Fleet("fleet.db", root)
    fleet.record_preflight(gpu_count_preflight("p1"))  # 8 of 8 hosts: the shared cause's
    fleet.close()
    assert cli.main(["hosts", "--runs-root", root]) == 0
    assert "p1: gpu.count failed on 8 of 8 hosts: a shared cause" in capsys.readouterr().out
    assert cli.main(["hosts", "release", "node3", "--runs-root", root]) == 0
    assert cli.main(["hosts", "quarantine", "node1", "--hours", "2", "--runs-root", root]) == 0
    capsys.readouterr()
    assert cli.main(["hosts", "--runs-root", root, "--json"]) == 0
    now = {h["host"]: h for h in json.loads(capsys.readouterr().out)}
    assert now["node3"]["quarantined_until"] is None and now["node3"]["score"] == 0.0
    assert now["node1"]["quarantined_until"] is not None
    assert cli.main(["hosts", "quarantine", "node1", "--runs-root", root]) == 2
    assert "--hours" in capsys.readouterr().err


def test_the_cli_says_a_broken_ledger_and_fails(tmp_path, capsys):
    from torchfleet import cli

    (tmp_path / "fleet.db").write_bytes(b"garbage" * 1000)
    assert cli.main(["hosts", "--runs-root", str(tmp_path)]) == 2
    assert "is corrupt" in capsys.readouterr().err


def test_the_oom_killer_says_little_about_the_host(fleet):
    """The workload's memory: a quarter, however many ways the report says it."""
    report = train("r1", "node2", reason="oom")
    report["hardware"] = [{"host": "node2", "kind": "oom", "code": "global", "fatal": True}]
    report["checks"].append({"id": "run.oom", "host": "node2", "ok": False,
                             "severity": "error"})
    fleet.record_run(report, now=T0)
    assert fleet.health(["node2"], now=T0)["node2"]["score"] == ledger.SHARED_CULPRIT


def test_a_host_left_out_is_recorded_for_what_left_it_out_not_again_for_being_left_out(fleet):
    report = {"run_id": "p1", "kind": "preflight", "ok": True, "hosts": [{"host": "node4"}],
              "checks": [{"id": "gpu.throttle", "host": "node4", "ok": False,
                          "severity": "warning"},
                         {"id": "host.skipped", "host": "node4", "ok": False,
                          "severity": "warning", "detail": "not needed"}]}
    fleet.record_preflight(report, now=T0)
    assert [r["incidents"] for r in fleet.hosts(now=T0) if r["host"] == "node4"] == [
        {"warning": 1}]


def test_what_the_user_caused_quarantines_no_host(fleet):
    # A mistyped script, the wrong NCCL environment, another job on the GPUs, six times over.
    for i in range(6):
        report = {"run_id": "p%d" % i, "kind": "preflight", "hosts": [{"host": h} for h in HOSTS],
                  "checks": [{"id": cid, "host": h, "ok": False, "severity": sev}
                             for h in HOSTS for cid, sev in (
                                 ("script.missing", "error"), ("nccl.transport", "error"),
                                 ("gpu.busy", "error"), ("host.clock", "warning"))]}
        assert fleet.record_preflight(report, now=T0 + i * 600) == []
    assert all(v["score"] == 0.0 and v["history"] == ""
               for v in fleet.health(HOSTS, now=T0 + 3600).values())


EIGHT = ["gpu%d" % i for i in range(8)]


def gpu_count_preflight(run_id, failing=EIGHT, hosts=EIGHT):
    """A wrong nproc_per_node: gpu.count fails on the hosts given (preflight's own words)."""
    return {"run_id": run_id, "kind": "preflight", "ok": False,
            "hosts": [{"host": h} for h in hosts],
            "checks": [{"id": "gpu.count", "host": h, "ok": h not in failing,
                        "severity": "error" if h in failing else "info",
                        "detail": "4 GPUs visible, nproc_per_node=8" if h in failing else ""}
                       for h in hosts]}


def test_a_health_check_every_host_fails_is_the_shared_causes_not_a_strike_each(fleet):
    """Issue 65 item 1: six preflights failing gpu.count on 8 of 8 hosts quarantined all 8
    (a host health check counted whatever share of hosts failed it)."""
    for i in range(6):
        assert fleet.record_preflight(gpu_count_preflight("p%d" % i), now=T0 + i * 600) == []
    assert all(v["score"] == 0.0 and v["quarantined_until"] is None and v["history"] == ""
               for v in fleet.health(EIGHT, now=T0 + 3600).values())
    events = fleet.events(now=T0 + 3600)
    assert len(events) == 6  # once each, not once a host
    assert events[0]["what"] == ("gpu.count failed on 8 of 8 hosts: a shared cause (the input, "
                                 "the controller, the network between)")
    assert events[0]["hosts"] == EIGHT and events[0]["check"] == "gpu.count"
    assert all(h["incidents"] == {} for h in fleet.hosts(now=T0 + 3600))


def test_a_health_check_fewer_than_half_fail_singles_them_out(tmp_path):
    # 3 of 8: each its own; six times over quarantines those three and no other (the circuit
    # breaker off: its own tests below).
    fleet = ledger.Fleet("fleet.db", str(tmp_path), quarantine_max_fraction=1.0)
    for i in range(6):
        fleet.record_preflight(gpu_count_preflight("p%d" % i, failing=EIGHT[:3]),
                               now=T0 + i * 600)
    held = {h for h, v in fleet.health(EIGHT, now=T0 + 3600).items() if v["quarantined_until"]}
    assert held == set(EIGHT[:3]) and fleet.events(now=T0 + 3600) == []
    fleet.close()


@pytest.mark.parametrize(("group", "fraction", "limit", "drains"), [
    (8, 0.1, 1, 1), (10, 0.1, 1, 1), (20, 0.1, 2, 2), (512, 0.1, 51, 51), (8, 0.5, 4, 4),
    (8, 1.0, 8, 8), (8, 0.0, 1, 1), (2, 0.1, 1, 1), (1, 0.1, 0, 1), (0, 0.1, 0, 1)])
def test_the_breaker_allows_its_fraction_of_the_group_at_least_one_never_the_whole(
        group, fraction, limit, drains):
    assert ledger.breaker_limit(group, fraction) == limit
    assert ledger.breaker_limit(group, fraction, whole=True) == drains


def test_past_its_fraction_the_breaker_quarantines_none_and_says_so_once(fleet):
    """Issue 65, the circuit breaker: 3 of 8 hosts singled out at once (fewer than half: no
    shared cause by the evidence rule) are past quarantine_max_fraction 0.1 of 8: none is
    quarantined, a fleet event names them; one host alone still is."""
    for i in range(6):
        assert fleet.record_preflight(gpu_count_preflight("p%d" % i, failing=EIGHT[:3]),
                                      now=T0 + i * 600) == []
    assert fleet.breaker.startswith("fleet-wide cause suspected: 3 hosts (gpu0, gpu1, gpu2) of "
                                    "8 would be quarantined, past quarantine_max_fraction 0.1")
    assert not any(v["quarantined_until"] for v in fleet.health(EIGHT, now=T0 + 3600).values())
    events = fleet.events(now=T0 + 3600)
    assert {e["check"] for e in events} == {ledger.BREAKER_CHECK}
    assert all(e["hosts"] == EIGHT[:3] for e in events)
    for i in range(6):
        fleet.record_preflight(gpu_count_preflight("q%d" % i, failing=EIGHT[7:]),
                               now=T0 + 4000 + i * 600)
    held = {h for h, v in fleet.health(EIGHT, now=T0 + 8000).items() if v["quarantined_until"]}
    assert held == {EIGHT[7]} and fleet.breaker == ""


def test_the_breaker_counts_the_quarantines_the_ledger_holds_not_those_by_hand(fleet):
    # gpu7 quarantined by the ledger already: one more of 8 is past the breaker's 1; a host
    # quarantined by hand counts for nothing.
    for i in range(6):
        fleet.record_preflight(gpu_count_preflight("p%d" % i, failing=EIGHT[7:]), now=T0 + i)
    assert fleet.quarantine(EIGHT[6], 5, "bad fan", now=T0 + 10)
    for i in range(6):
        fleet.record_preflight(gpu_count_preflight("q%d" % i, failing=EIGHT[:1]),
                               now=T0 + 100 + i)
    held = {h for h, v in fleet.health(EIGHT, now=T0 + 200).items() if v["quarantined_until"]}
    assert held == {EIGHT[7], EIGHT[6]}
    assert [e["what"][:68] for e in fleet.events(now=T0 + 200)
            if e["check"] == ledger.BREAKER_CHECK] == [
        "fleet-wide cause suspected: 1 host (gpu0) of 8 would be quarantined beside 1 already"[:68]]


@pytest.mark.parametrize(("failed_by", "checked", "shared"), [
    (1, 1, False), (1, 2, False), (2, 2, True), (2, 4, True), (2, 5, False), (3, 8, False),
    (4, 8, True), (8, 8, True)])
def test_most_is_at_least_half_of_the_hosts_checked_and_at_least_two(failed_by, checked,
                                                                     shared):
    assert ledger.shared(failed_by, checked) is shared


def test_a_script_failing_in_every_attempt_of_one_run_is_one_strike(fleet):
    # restart_on=any, three attempts on the same hosts, rank 1 failing each time.
    attempts = [{"attempt": n, "hosts": HOSTS, "outcomes": {h: "failed" if h == "node1"
                                                          else "aborted" for h in HOSTS},
                 "failure": {"host": "node1", "reason": "failed", "consequence": False}}
                for n in range(3)]
    assert fleet.record_run(train("r1", "node1", reason="failed", attempts=attempts),
                            now=T0) == []
    assert fleet.health(["node1"], now=T0)["node1"]["score"] == 1.0


def test_workers_that_never_started_beside_others_blame_none_of_them_fully(fleet):
    report = train("r1", "node1", reason="failed")
    report["first_failure"]["failure"] = "not_started"
    for row in report["hosts"][1:]:
        row["outcome"] = "failed"  # every worker: never reached the master
    for i in range(4):
        fleet.record_run(dict(report, run_id="r%d" % i), now=T0 + i * 600)
    assert fleet.health(["node1"], now=T0 + 3600)["node1"]["quarantined_until"] is None


def test_rank_0_failing_alone_again_and_again_does_not_quarantine_the_master(fleet):
    # A bug in what only rank 0 runs (its evaluation, its logging, its saving): three runs.
    for i in range(3):
        report = train("r%d" % i, "node0", reason="failed")
        report["first_failure"]["rank"] = 0
        assert fleet.record_run(report, now=T0 + i * 600) == []
    assert fleet.health(["node0"], now=T0 + 3600)["node0"]["score"] == pytest.approx(
        3 * ledger.SHARED_CULPRIT, rel=0.01)  # (decayed by an hour)


def lost_run(run_id, lost, hosts):
    """train.json of a run whose hosts `lost` stopped answering at once (a switch)."""
    return {"run_id": run_id, "kind": "train", "ok": False,
            "hosts": [{"host": h, "outcome": "lost" if h in lost else "stopped"} for h in hosts],
            "first_failure": {"host": lost[0], "reason": "lost", "consequence": False,
                              "at_s": 300.0},
            "checks": [{"id": "host.lost", "host": h, "ok": False, "severity": "error"}
                       for h in lost]}


THIRTY_TWO = ["node%02d" % i for i in range(32)]


def test_hosts_lost_at_one_moment_are_one_shared_event_no_strike_each(fleet):
    """Issue 65 item 2: 12 of 32 hosts lost together, 3 times in 3 hours (a top-of-rack
    switch) quarantined them all."""
    lost = THIRTY_TWO[4:16]
    for i in range(3):
        assert fleet.record_run(lost_run("r%d" % i, lost, THIRTY_TWO), now=T0 + i * H) == []
    health = fleet.health(THIRTY_TWO, now=T0 + 3 * H)
    assert all(v["score"] == 0.0 and v["quarantined_until"] is None for v in health.values())
    events = fleet.events(now=T0 + 3 * H)
    assert len(events) == 3 and events[0]["hosts"] == sorted(lost)
    assert events[0]["what"] == (
        "host.lost: 12 hosts lost within lost_after_s (30 s) of each other: a shared cause "
        "(a switch, a PDU, the master's NIC, the network between)")


def test_a_host_lost_alone_or_beside_one_other_still_counts(fleet):
    fleet.record_run(lost_run("r1", ["node03"], THIRTY_TWO), now=T0)
    fleet.record_run(lost_run("r2", ["node05", "node06"], THIRTY_TWO), now=T0)
    health = fleet.health(["node03", "node05", "node06"], now=T0)
    assert {h: v["score"] for h, v in health.items()} == {"node03": 1.0, "node05": 1.0,
                                                          "node06": 1.0}
    assert fleet.events(now=T0) == []


def restarted_run(run_id, failures_at, lost="node3", hardware=()):
    """train.json of a run with max_restarts whose host `lost` was lost in every attempt
    (no spare took its place), each attempt's failure dated by goodput's timeline."""
    attempts = [{"attempt": n, "hosts": HOSTS, "outcomes": {
        h: "lost" if h == lost else "stopped" for h in HOSTS},
        "failure": {"host": lost, "reason": "lost", "consequence": False, "at_s": 600.0},
        "drain": [], "replaced": []} for n in range(len(failures_at))]
    report = train(run_id, lost, hosts=HOSTS, attempts=attempts, hardware=hardware)
    report["goodput"] = {"started": failures_at[0] - 900.0, "failures": [
        {"attempt": n, "check": "host.lost", "host": lost, "at": at, "cost_s": 60.0}
        for n, at in enumerate(failures_at)]}
    return report


def test_a_host_lost_in_each_attempt_of_one_run_counts_each_time(fleet):
    """Issue 65 item 3: lost in 10 attempts of one run plus an Xid 79 scored 1.5 (each run's
    heaviest incident only): never quarantined."""
    ends = [T0 + n * 1800.0 for n in range(10)]
    xid = {"host": "node3", "kind": "xid", "code": 79, "fatal": True, "at": ends[-1] - 60,
           "line": "NVRM: Xid (PCI:0000:19:00): 79, pid=2743, GPU has fallen off the bus."}
    out = fleet.record_run(restarted_run("r1", ends, hardware=[xid]), now=ends[-1] + 300)
    assert [q["host"] for q in out] == ["node3"]
    assert fleet.health(["node3"], now=ends[-1] + 300)["node3"]["score"] > 9


def test_an_incident_is_dated_when_it_happened_not_at_the_runs_end(fleet):
    """A three-day run: its first attempt's loss decays from its own time, and --since
    counts it where it happened."""
    end = T0 + 72 * H
    fleet.record_run(restarted_run("r1", [T0, end - 600.0], lost="node3"), now=end)
    listed = {h["host"]: h for h in fleet.hosts(since_s=24 * H, now=end)}
    assert listed["node3"]["incidents"] == {"culprit": 1, "lost": 1}  # the last attempt's
    everything = {h["host"]: h for h in fleet.hosts(now=end)}["node3"]
    assert everything["incidents"] == {"culprit": 2, "lost": 2}
    half_life_h = defaults.default("ledger_half_life_h")
    assert everything["score"] == pytest.approx(
        0.5 ** (72 / half_life_h) + 0.5 ** (600 / 3600 / half_life_h), abs=1e-3)


def racing_controllers(fleet_db, root, names=("a", "b"), wait_s=1.0):
    """Two controllers (threads, a Fleet each) recording at once a run whose culprit is node3,
    at 1.0 already: each has read node3's score before either commits, unless the ledger makes
    one wait for the other (the hook, after the read of the scores, waits at most wait_s for
    the other's). Returns {name: what its record_run quarantined}."""
    import threading

    import sqlalchemy as sa

    seed = ledger.Fleet(fleet_db, root)
    seed.record_run(train("r0", "node3", reason="failed"), now=T0)
    for name in names:  # the train's preflight, recorded first as in every run
        seed.record_preflight({"run_id": "race-" + name, "hosts": [{"host": h} for h in HOSTS]},
                              now=T0)
    seed.close()
    scored = threading.Barrier(len(names))

    def hook(_conn, _cursor, statement, *_args):
        # (the read of the incidents a score adds up: both engines, old and new code)
        if statement.lstrip().startswith("SELECT ledger_incidents.host, ledger_incidents.run_id"):
            try:
                scored.wait(wait_s)
            except threading.BrokenBarrierError:
                pass  # the other one waits for this one's commit: as it should

    out = {}

    def controller(name):
        fleet = ledger.Fleet(fleet_db, root)
        out[name] = fleet.record_run(train("race-" + name, "node3", reason="failed"),
                                     now=T0 + 60)
        out[name + " warnings"] = fleet.warnings
        fleet.close()

    sa.event.listen(sa.engine.Engine, "after_cursor_execute", hook)
    try:
        threads = [threading.Thread(target=controller, args=(n,)) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        sa.event.remove(sa.engine.Engine, "after_cursor_execute", hook)
    assert [out.pop(n + " warnings", None) for n in names] == [[] for _ in names], out
    return out


def test_two_controllers_adding_to_one_host_at_once_quarantine_it_once(tmp_path):
    """Issue 65 item 4 on SQLite (PostgreSQL: tests/integration/test_ledger_engines.py): 1.0,
    plus 1.0 from each of two controllers at once, is 3.0 and passes quarantine_score; the
    second to decide sees the first's incident."""
    out = racing_controllers("fleet.db", str(tmp_path))
    assert sorted(len(v) for v in out.values()) == [0, 1], out
    fleet = ledger.Fleet("fleet.db", str(tmp_path))
    held = fleet.health(["node3"], now=T0 + 60)["node3"]
    assert held["quarantined_until"] is not None and held["score"] == pytest.approx(3.0, abs=0.01)


def test_the_breaker_counts_the_whole_pool_not_only_the_reports_hosts(fleet):
    """The review's repro: 8-host runs drawn from a 16-host pool, each run's first host with
    an Xid 79 in two runs. A host quarantined is left out of the next run, so counting only
    the report's hosts never tripped (6 of 16 quarantined in 6 h). The pool is the hosts the
    ledger saw in quarantine_h: one quarantine (16 x 0.1), then the breaker holds."""
    pool = ["n%02d" % i for i in range(16)]
    fleet.record_run(train("seen", hosts=pool), now=T0 - 60)  # the pool, all seen once
    held = []
    for k in range(4):
        group = [h for h in pool if h not in held][:8]
        xid = [{"host": group[0], "kind": "xid", "code": 79, "fatal": True, "line": "Xid 79"}]
        for j in range(2):
            held += [q["host"] for q in fleet.record_run(
                train("r%d-%d" % (k, j), group[0], reason="hardware", hardware=xid,
                      hosts=group), now=T0 + k * H + j * 60)]
    assert held == ["n00"]
    assert "would be quarantined beside 1 already" in fleet.breaker and "of 16" in fleet.breaker


def test_a_tripped_breaker_leaves_no_strike_for_the_next_small_incident_to_finish(fleet):
    """The review's repro: 5 of 16 hosts failing gpu.driver in six preflights (a driver
    roll-out) tripped the breaker but kept their strikes (2.99 each): one straggler note later
    quarantined one. Past the breaker the report's incidents of those hosts weigh nothing."""
    hosts = ["g%02d" % i for i in range(16)]
    for i in range(6):
        assert fleet.record_preflight({"run_id": "p%d" % i, "hosts": [{"host": h} for h in hosts],
                                       "checks": [{"id": "gpu.driver", "host": h, "ok": False,
                                                   "severity": "error"} for h in hosts[:5]]},
                                      now=T0 + i * 600) == []
    assert fleet.breaker
    assert all(v["score"] == 0.0 for v in fleet.health(hosts[:5], now=T0 + 3700).values())
    out = fleet.record_run(train("r1", hosts=["g00"] + hosts[8:15],
                                 stragglers=[{"host": "g00"}]), now=T0 + 3800)
    assert out == []


def test_a_fleet_of_one_host_is_never_quarantined_on_its_own(fleet):
    """The review's repro: six one-host preflights with a wrong nproc_per_node (gpu.count)
    quarantined `solo`: with one host nothing tells its fault from a shared cause."""
    for i in range(6):
        assert fleet.record_preflight(gpu_count_preflight("p%d" % i, hosts=["solo"],
                                                          failing=["solo"]),
                                      now=T0 + i * 600) == []
    assert not fleet.health(["solo"], now=T0 + 3700)["solo"]["quarantined_until"]


def test_hosts_lost_together_are_judged_by_the_runs_own_lost_after_s(fleet):
    """The review: the grouping took the default lost_after_s, not the run's (train.json's
    settings carry it)."""
    report = dict(lost_run("r1", THIRTY_TWO[:3], THIRTY_TWO),
                  settings={"lost_after_s": 90.0, "nproc_per_node": 8})
    assert fleet.record_run(report, now=T0) == []
    (event,) = fleet.events(now=T0)
    assert "3 hosts lost within lost_after_s (90 s) of each other" in event["what"]


# ---- issue 67: a ledger safe on shared storage, that never blocks and says what it did ----

# Real /proc/self/mountinfo lines (mount options as each filesystem's client prints them).
ROOT_LINE = "25 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro"
NETWORK_MOUNTS = {
    "nfs4": "36 25 0:32 / {} rw,relatime shared:15 - nfs4 nfs.example.org:/export rw,vers=4.2,"
            "rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys,"
            "clientaddr=10.0.0.5,local_lock=none,addr=10.0.0.1",
    "nfs": "37 25 0:33 / {} rw,relatime shared:16 - nfs 10.0.0.1:/home rw,vers=3,rsize=65536,"
           "wsize=65536,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys,mountaddr=10.0.0.1,"
           "mountvers=3,mountport=20048,mountproto=udp,local_lock=none,addr=10.0.0.1",
    "lustre": "112 25 0:51 / {} rw,relatime shared:60 - lustre 10.0.0.2@o2ib:/scratch "
              "rw,lazystatfs,flock",
    "gpfs": "98 25 0:45 / {} rw,relatime shared:50 - gpfs fs1 rw",
    "ceph": "120 25 0:55 / {} rw,relatime shared:70 - ceph 10.0.0.3:6789:/ rw,name=admin,"
            "secret=<hidden>,acl",
    "fuse.ceph-fuse": "121 25 0:56 / {} rw,nosuid,nodev,relatime shared:71 - fuse.ceph-fuse "
                      "ceph-fuse rw,user_id=0,group_id=0,allow_other",
    "cifs": "130 25 0:60 / {} rw,relatime shared:80 - cifs //server/share rw,vers=3.1.1,"
            "cache=strict,username=u,uid=0,noforceuid,gid=0,noforcegid,addr=10.0.0.4,"
            "file_mode=0755,dir_mode=0755,soft,nounix,serverino,mapposix,rsize=4194304,"
            "wsize=4194304,bsize=1048576,echo_interval=60,actimeo=1",
}


@pytest.mark.parametrize("kind", sorted(NETWORK_MOUNTS))
def test_sqlite_on_a_network_filesystem_is_refused_once_and_points_to_postgresql(
        tmp_path, monkeypatch, kind):
    """Issue 67 item 8: WAL's locks and shared memory are one machine's."""
    shared = tmp_path / "shared dir"  # (mountinfo escapes the space as \040)
    shared.mkdir()
    mounts = tmp_path / "mountinfo"
    mounts.write_text("\n".join([ROOT_LINE, NETWORK_MOUNTS[kind].format(
        str(shared).replace(" ", "\\040"))]) + "\n")
    monkeypatch.setattr(ledger_store.mounts, "MOUNTINFO", str(mounts))
    f = ledger.Fleet("torchfleet/fleet.db", str(shared))
    assert f.record_run(train("r1", "node3"), now=T0) == []
    assert f.hosts(now=T0) == [] and f.health(["node3"], now=T0)["node3"]["score"] == 0.0
    assert len(f.warnings) == 1, f.warnings
    assert "is on a network filesystem (%s)" % kind in f.warnings[0]
    assert "postgresql://" in f.warnings[0] and "local disk" in f.warnings[0]
    assert not (shared / "torchfleet").exists()  # nothing made there
    # The same file on a local disk is used.
    mounts.write_text(ROOT_LINE + "\n")
    local = ledger.Fleet("torchfleet/fleet.db", str(shared))
    assert local.record_run(train("r1", "node3"), now=T0) == [] and local.warnings == []
    local.close()


def test_the_filesystem_is_the_deepest_mount_holding_the_path(tmp_path):
    mounts = tmp_path / "mountinfo"
    mounts.write_text("\n".join([
        ROOT_LINE, NETWORK_MOUNTS["nfs4"].format("/shared"),
        "40 36 0:40 / /shared/local rw,relatime shared:20 - xfs /dev/sdb1 rw",
        NETWORK_MOUNTS["lustre"].format("/shared/lus"), "garbage", ""]))
    where = str(mounts)
    assert ledger_store.fs_type("/shared/x/fleet.db", where) == "nfs4"
    assert ledger_store.fs_type("/shared/local/runs/fleet.db", where) == "xfs"
    assert ledger_store.fs_type("/shared/lus/fleet.db", where) == "lustre"
    assert ledger_store.fs_type("/sharedother/fleet.db", where) == "ext4"
    assert ledger_store.network_fs("/shared/local/fleet.db", where) == ""
    assert ledger_store.fs_type("/x", str(tmp_path / "none")) == ""


@settings(max_examples=examples(60), deadline=None)
@given(text=st.binary(max_size=2000))
def test_mountinfo_of_any_bytes_never_raises(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("m") / "mountinfo"
    path.write_bytes(text)
    assert isinstance(ledger_store.fs_type("/a/b", str(path)), str)


def test_a_reader_never_waits_for_a_writer(tmp_path):
    """Issue 67 item 9: preflight's read, behind another controller's write lock, neither
    waits out the timeout nor drops the ledger (its quarantines held)."""
    path = tmp_path / "fleet.db"
    first = ledger.Fleet(str(path), "")
    first.quarantine("node3", 24, "lost 3 times", now=T0)
    first.close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another controller mid-write
    try:
        reader = ledger.Fleet(str(path), "", timeout_s=0.5)
        held = reader.health(["node3"], now=T0 + 1)["node3"]
        assert held["quarantined_until"] == T0 + 24 * H and reader.warnings == []
        reader.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_torchfleet_hosts_as_a_user_who_may_only_read(tmp_path):
    """Issue 67 item 9: a ledger another user owns is read, not refused."""
    import os
    import pwd
    import shutil
    import tempfile

    from torchfleet import cli

    if os.getuid() != 0:
        pytest.skip("needs root to become another user")
    root = tempfile.mkdtemp(prefix="torchfleet-ro-")
    try:
        os.chmod(root, 0o755)
        f = ledger.Fleet("fleet.db", root)
        for i in range(3):
            f.record_run(train("r%d" % i, "node3"), now=T0)
        f.close()
        os.chmod(os.path.join(root, "fleet.db"), 0o644)
        assert cli.main(["hosts", "--runs-root", root, "--json"]) == 0  # (imports it all)
        nobody = pwd.getpwnam("nobody")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: nobody, reading
            code = 3
            try:
                os.close(r)
                os.setgroups([])
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
                with os.fdopen(w, "w") as said:
                    sys.stdout = sys.stderr = said
                    code = cli.main(["hosts", "--runs-root", root, "--json"])
            finally:
                os._exit(code)
        os.close(w)
        with os.fdopen(r) as f:
            said = f.read()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, said
        listed = json.loads(said)
        assert listed[0]["host"] == "node3" and listed[0]["incidents"]["culprit"] == 3
        assert sorted(os.listdir(root)) == ["fleet.db"]  # nothing written by the reader
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_one_host_named_two_ways_has_one_history(fleet):
    """Issue 67 item 12: the inventory's short name and its FQDN (and its case) are one
    host."""
    fleet.record_run(train("r1", "node3", hosts=["node1", "node3"]), now=T0)
    fleet.record_run(train("r2", "Node3.cluster.example.", hosts=["node1.cluster.example",
                                                                 "Node3.cluster.example."]),
                     now=T0 + H)
    out = fleet.record_run(train("r3", "NODE3", hosts=["node1", "NODE3"]), now=T0 + 2 * H)
    assert [q["host"] for q in out] == ["node3"]
    listed = {h["host"]: h for h in fleet.hosts(now=T0 + 2 * H)}
    assert sorted(listed) == ["node1", "node3"] and listed["node3"]["runs"] == 3
    # Asked by any of its names, answered under that name.
    asked = fleet.health(["node3.cluster.example", "10.0.0.3"], now=T0 + 2 * H)
    assert asked["node3.cluster.example"]["quarantined_until"] is not None
    assert asked["10.0.0.3"]["score"] == 0.0
    assert fleet.release("node3.cluster.example", now=T0 + 3 * H)
    assert fleet.health(["node3"], now=T0 + 3 * H)["node3"]["quarantined_until"] is None
    assert ledger_store.canonical_host("10.1.2.3") == "10.1.2.3"
    assert ledger_store.canonical_host("fe80::1") == "fe80::1"


def test_a_version_3_ledger_merges_one_hosts_two_names(fleet, tmp_path):
    """Issue 67 item 12: schema version 4 keeps each host under its canonical key."""
    fleet.record_run(train("r1", "node3"), now=T0)
    fleet.close()
    db = sqlite3.connect(tmp_path / "fleet.db")  # as version 3 left a second name of node3
    db.execute("INSERT INTO ledger_hosts VALUES ('node3.cluster.example', 2, ?, 'by hand', "
               "NULL, ?)", (T0 + 48 * H, T0))
    db.execute("INSERT INTO ledger_incidents (host, run_id, phase, attempt, kind, detail, "
               "check_id, weight, at, info) VALUES ('Node3.cluster.example', 'r0', 'train', 0, "
               "'lost', '', 'host.lost', 1.0, ?, ''), ('node3.cluster.example', 'r1', 'train', "
               "0, 'lost', '', 'host.lost', 1.0, ?, '')", (T0 - H, T0))
    db.execute("INSERT INTO ledger_runs VALUES ('r0', 'train', ?, '[\"Node3.cluster.example\"]')",
               (T0 - H,))
    db.execute("UPDATE ledger_meta SET value='3' WHERE key='schema_version'")
    db.commit()
    db.close()
    again = ledger.Fleet("fleet.db", str(tmp_path))
    listed = {h["host"]: h for h in again.hosts(now=T0)}
    assert again.warnings == []
    assert sorted(listed) == HOSTS
    three = listed["node3"]
    assert three["runs"] == 3  # 1 + 2
    assert three["incidents"] == {"culprit": 1, "lost": 2}  # r1's lost under both: once
    assert three["quarantined_until"] == ledger.iso(T0 + 48 * H) and three["reason"] == "by hand"
    assert again.hosts(since_s=7 * 86400, now=T0)[0]["runs"] == 2  # r0's list renamed


def test_a_run_id_used_again_elsewhere_is_another_run_not_the_same_strike(tmp_path):
    """Issue 67 item 12: two controllers (runs roots of their own) reuse -e run_id=r1 with one
    shared fleet_db; each run's preflight and end still count as one run."""
    from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import memory

    params = {"fleet_db": str(tmp_path / "fleet.db"), "ledger_half_life_h": 168.0,
              "quarantine_score": 2.5, "quarantine_h": 24.0, "quarantine_max_fraction": 1.0,
              "actions": "enforce", "ledger_textfile": "", "ledger_record": True}
    for n, at in ((1, T0), (2, T0 + H)):
        run_dir = str(tmp_path / ("controller%d" % n) / "runs" / "r1")
        for report in (dict(gpu_count_preflight("r1", failing=[]), hosts=[
                {"host": h} for h in HOSTS]), train("r1", "node3")):
            fleet = memory.open_fleet(params, run_dir)
            kind = "preflight" if report["kind"] == "preflight" else "train"
            memory.record(fleet, kind, report, now=at)
            fleet.close()
    fleet = ledger.Fleet(str(tmp_path / "fleet.db"), "")
    listed = {h["host"]: h for h in fleet.hosts(now=T0 + H)}
    assert listed["node3"]["runs"] == 2 and listed["node3"]["incidents"] == {
        "culprit": 2, "lost": 2}
    assert listed["node3"]["score"] == pytest.approx(1.0 + 0.5 ** (1 / 168), abs=1e-3)
    assert listed["node3"]["last_incident"]["run_id"] == "r1"  # what people read


def test_release_and_quarantine_refuse_a_missing_ledger_and_an_unknown_host(tmp_path, capsys):
    """Issue 67 item 13: the wrong directory makes no fresh ledger and says no success; a
    misspelt host gets no phantom row."""
    from torchfleet import cli

    root = str(tmp_path)
    for argv in (["release", "node3"], ["quarantine", "node3", "--hours", "2"], ["node3"]):
        assert cli.main(["hosts", *argv, "--runs-root", root]) == 2
        err = capsys.readouterr().err
        assert "no fleet ledger at %s/fleet.db: give --runs-root" % root in err
        assert not (tmp_path / "fleet.db").exists()
    fleet = ledger.Fleet("fleet.db", root)
    fleet.record_run(train("r1", "node3"), now=T0)
    fleet.close()
    for argv in (["release", "nod3"], ["nod3"]):
        assert cli.main(["hosts", *argv, "--runs-root", root]) == 2
        assert "no host nod3 in the fleet's ledger %s/fleet.db: check its name" % root in \
            capsys.readouterr().err
    assert cli.main(["hosts", "--runs-root", root, "--json"]) == 0
    assert sorted(h["host"] for h in json.loads(capsys.readouterr().out)) == HOSTS
    assert cli.main(["hosts", "release", "NODE3.cluster.example", "--runs-root", root]) == 0


def test_torchfleet_hosts_scores_with_the_fleets_own_settings(tmp_path, capsys, monkeypatch):
    """Issue 67 item 13: the half-life and threshold the runs use, kept in the ledger."""
    from torchfleet import cli

    fleet = ledger.Fleet("fleet.db", str(tmp_path), half_life_h=1.0, quarantine_score=1.5)
    fleet.record_run(train("r1", "node3"), now=T0)
    out = fleet.record_run(train("r2", "node3"), now=T0 + 60)
    assert [q["host"] for q in out] == ["node3"]  # 2 >= 1.5
    fleet.close()
    monkeypatch.setenv(ledger.NOW_ENV, repr(T0 + 60 + 2 * H))
    assert cli.main(["hosts", "--runs-root", str(tmp_path), "--json"]) == 0
    listed = {h["host"]: h for h in json.loads(capsys.readouterr().out)}
    assert listed["node3"]["score"] == pytest.approx(2 * 0.25, abs=0.01)  # 2 half-lives


@pytest.mark.parametrize(("fleet_db", "path"), [
    ("sqlite:////srv/torchfleet/fleet.db", "/srv/torchfleet/fleet.db"),
    ("sqlite:///fleet.db", "/runs/fleet.db"),
    ("/srv/fleet.db", "/srv/fleet.db"),
    ("ledger/fleet.db", "/runs/ledger/fleet.db"),
])
def test_a_sqlite_url_is_read_as_sqlalchemy_reads_it(fleet_db, path):
    """Issue 67 item 14: sqlite:////x is absolute, not runs/sqlite:/x."""
    assert ledger_store._url(fleet_db, "/runs") == ("sqlite:///" + path, path)


def test_sqlite_url_makes_its_file_where_it_says(tmp_path):
    target = tmp_path / "abs" / "fleet.db"
    f = ledger.Fleet("sqlite:///" + str(target), str(tmp_path / "runs"))
    f.record_run(train("r1", "node3"), now=T0)
    f.close()
    assert target.exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("fleet_db", "shown"), [
    ("postgresql://fleet:s3cret@db:5432/fleet", "postgresql://fleet:***@db:5432/fleet"),
    ("postgresql://fleet:s3:c@r#et@db/fleet", "postgresql://fleet:***@db/fleet"),
    ("postgresql://fleet@db/fleet?password=s3cret&sslmode=require",
     "postgresql://fleet@db/fleet?password=***&sslmode=require"),
    ("postgresql://db/fleet?sslmode=require&PASSWORD=s3cret",
     "postgresql://db/fleet?sslmode=require&PASSWORD=***"),
    ("postgresql://fleet@db/fleet", "postgresql://fleet@db/fleet"),
])
def test_a_url_never_shows_its_password(fleet_db, shown):
    """Issue 67 item 14: a password given in the URL's user part or its query, wherever the
    ledger names itself (describe(), the warnings)."""
    assert ledger_store.describe(fleet_db) == shown
    assert "s3" not in shown.split("@")[0][len("postgresql://"):] + shown.split("?")[-1]
    f = ledger.Fleet(fleet_db.replace("@db", "@127.0.0.1:1"), "", timeout_s=1)
    f.hosts()
    assert len(f.warnings) == 1 and "s3cret" not in f.warnings[0] and "r#et" not in f.warnings[0]
    assert ledger_store.password_of(fleet_db) in ("", "s3cret", "s3:c@r#et")


def test_the_modules_output_never_shows_the_urls_password(tmp_path):
    """Issue 67 item 14: fleet_db is no_log, and only its password is masked (a no_log value
    is masked wherever it appears: every "fleet.db" of every sentence otherwise)."""
    import os
    import subprocess

    from tests.unit.test_fleet_memory import preflight_params

    params = dict(preflight_params(tmp_path),
                  fleet_db="postgresql://fleet:s3cret@127.0.0.1:1/fleet")
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": params}))
    from ansible_collections.torchfleet.fleet.plugins.modules import preflight_checks

    module = preflight_checks.__file__
    src = str(Path(module).parents[5])  # (the code under test, wherever it is imported from)
    done = subprocess.run([sys.executable, str(module), str(args)], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=src))
    out = json.loads(done.stdout)
    assert "s3cret" not in done.stdout, out.get("invocation")
    assert out["invocation"]["module_args"]["fleet_db"] == \
        "postgresql://fleet:********@127.0.0.1:1/fleet"
    ledger_said = [c["detail"] for c in out["checks"] if c["id"] == "fleet.ledger"]
    assert ledger_said and "postgresql://fleet:***@127.0.0.1:1/fleet" in ledger_said[0]
    # A SQLite path stays readable in every sentence.
    params = preflight_params(tmp_path, name="r2")
    (tmp_path / "runs" / "fleet.db").write_bytes(b"not a database" * 100)
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": params}))
    done = subprocess.run([sys.executable, str(module), str(args)], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=src))
    out = json.loads(done.stdout)
    said = [c["detail"] for c in out["checks"] if c["id"] == "fleet.ledger"]
    assert said and "%s/fleet.db is corrupt" % (tmp_path / "runs") in said[0]


PROM_LINE = re.compile(r'^(# (HELP|TYPE) \w+ .+|\w+(\{(\w+="([^"\\]|\\.)*",?)+\})? '
                       r'-?[0-9.e+-]+)$')


def parsed(text):
    """{(name, labels): value} of a textfile, every line checked against the exposition
    format (node-exporter drops a whole file with one bad line)."""
    assert text.endswith("\n")
    out = {}
    for line in text.splitlines():
        assert PROM_LINE.match(line), line
        if not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_a_textfile_write_that_fails_leaves_the_last_one_whole(fleet, tmp_path, monkeypatch):
    """Issue 67 item 15 (the test that could not fail: "no .tmp left"): node-exporter reads
    the file at any moment; a write that fails midway (a full disk) leaves the last one,
    complete, and nothing else beside it. The data reaches the disk before the rename."""
    import os

    folder = tmp_path / "textfile"
    folder.mkdir()
    path = folder / "torchfleet.prom"
    fleet.record_run(train("r1", "node3"), now=T0)
    assert fleet.textfile(str(path), now=T0)
    before = path.read_text()
    assert parsed(before)['torchfleet_host_score{host="node3"}'] == 1.0
    order = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (order.append("fsync"), real_fsync(fd)))
    monkeypatch.setattr(os, "replace", lambda a, b: (order.append("replace"),
                                                      real_replace(a, b)))
    fleet.record_run(train("r2", "node3"), now=T0)
    assert fleet.textfile(str(path), now=T0)
    assert order[:2] == ["fsync", "replace"]  # the file's data synced, then renamed
    assert parsed(path.read_text())['torchfleet_host_score{host="node3"}'] == 2.0

    def full(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    fleet.record_run(train("r3", "node3"), now=T0)
    assert not fleet.textfile(str(path), now=T0)
    assert "No space left" in fleet.warnings[0]
    assert parsed(path.read_text())['torchfleet_host_score{host="node3"}'] == 2.0
    assert sorted(p.name for p in folder.iterdir()) == ["torchfleet.prom"]


def test_incidents_total_counts_what_weighs_and_warnings_apart(fleet, tmp_path):
    """Issue 67 item 15: an alert on incidents_total{kind="hardware"} never fires on a
    throttling GPU's warnings."""
    throttle = [{"host": "node2", "kind": "xid", "code": 63, "fatal": False, "at": T0},
                {"host": "node2", "kind": "thermal", "code": "", "fatal": False, "at": T0}]
    fleet.record_run(train("r1", hardware=throttle), now=T0)
    fatal = [{"host": "node4", "kind": "xid", "code": 79, "fatal": True, "at": T0}]
    fleet.record_run(train("r2", hardware=fatal), now=T0)
    path = tmp_path / "torchfleet.prom"
    assert fleet.textfile(str(path), now=T0)
    got = parsed(path.read_text())
    assert 'torchfleet_host_incidents_total{host="node2",kind="hardware"}' not in got
    assert got['torchfleet_host_warnings_total{host="node2"}'] == 2.0
    assert got['torchfleet_host_incidents_total{host="node4",kind="hardware"}'] == 1.0
    listed = {h["host"]: h for h in fleet.hosts(now=T0)}
    assert listed["node2"]["incidents"] == {"warning": 2}


def test_the_docs_weights_are_the_codes():
    """Issue 67 item 15: docs/ledger.md's table of kinds says each kind's weight."""
    text = (ROOT / "docs" / "ledger.md").read_text()
    said = dict(re.findall(r"^\| `(\w+)` \|.*\| (\d+(?:\.\d+)?)[^|]*\|$", text, re.M))
    assert {k: float(v) for k, v in said.items()} == ledger.WEIGHTS
    assert "%g a warning" % ledger.WEIGHTS["warning"] in text


def test_a_release_rewrites_the_textfile_and_says_when_a_quarantine_ends(tmp_path, capsys,
                                                                        monkeypatch):
    """Issue 67 item 15: the textfile the fleet's settings name is rewritten by a release and
    a quarantine by hand, and says when each quarantine ends (an expiry needs no writer)."""
    from torchfleet import cli

    prom = tmp_path / "torchfleet.prom"
    fleet = ledger.Fleet("fleet.db", str(tmp_path), textfile_path=str(prom))
    for i in range(3):
        fleet.record_run(train("r%d" % i, "node3"), now=T0)
    assert fleet.textfile(now=T0)
    fleet.close()
    got = parsed(prom.read_text())
    assert got['torchfleet_host_quarantined{host="node3"}'] == 1.0
    assert got['torchfleet_host_quarantined_until_seconds{host="node3"}'] == T0 + 24 * H
    monkeypatch.setenv(ledger.NOW_ENV, repr(T0 + H))
    assert cli.main(["hosts", "release", "node3", "--runs-root", str(tmp_path)]) == 0
    assert "%s rewritten" % prom in capsys.readouterr().out
    got = parsed(prom.read_text())
    assert got['torchfleet_host_quarantined{host="node3"}'] == 0.0
    assert got['torchfleet_host_quarantined_until_seconds{host="node3"}'] == 0.0
    assert cli.main(["hosts", "quarantine", "node1", "--hours", "2", "--runs-root",
                     str(tmp_path)]) == 0
    assert parsed(prom.read_text())['torchfleet_host_quarantined{host="node1"}'] == 1.0


def test_incidents_older_than_ledger_keep_days_go_at_the_next_write(tmp_path):
    """Issue 67 item 16."""
    fleet = ledger.Fleet("fleet.db", str(tmp_path), keep_days=90)
    fleet.record_run(train("old", "node3"), now=T0)
    fleet.record_preflight(gpu_count_preflight("p-old"), now=T0)
    fleet.quarantine("node1", 24 * 200, "by hand", now=T0)
    fleet.record_run(train("new", "node2"), now=T0 + 91 * 86400)
    listed = {h["host"]: h for h in fleet.hosts(now=T0 + 91 * 86400)}
    assert listed["node3"]["incidents"] == {} and listed["node2"]["incidents"] == {
        "culprit": 1, "lost": 1}
    assert fleet.events(now=T0 + 91 * 86400) == []
    assert listed["node1"]["quarantined_until"] is not None  # a host's row stays
    assert listed["node3"]["runs"] == 2  # (its count of runs too)
    fleet.close()
    db = sqlite3.connect(tmp_path / "fleet.db")
    assert db.execute("SELECT run_id FROM ledger_runs").fetchall() == [("new",)]
    db.close()
    kept = ledger.Fleet("kept.db", str(tmp_path), keep_days=0)
    kept.record_run(train("old", "node3"), now=T0)
    kept.record_run(train("new", "node2"), now=T0 + 900 * 86400)
    assert {h["host"]: h for h in kept.hosts(now=T0)}["node3"]["incidents"] != {}
    kept.close()


def test_an_incident_dated_ahead_decays_from_the_first_write_after_the_clock_stepped_back(
        tmp_path):
    """Issue 67 review, finding 11: a controller's clock a week ahead dated node3's incident a
    week into the future (clamped to the report's time, itself ahead); after NTP stepped the
    clock back, _score counted its age as 0 until real time caught up: a week in full. The
    next write dates it now, so it halves each half-life from then."""
    f = ledger.Fleet("fleet.db", str(tmp_path), half_life_h=24, quarantine_score=1e9)
    f.record_run(train("r1", "node3"), now=T0 + 7 * 86400)  # the clock a week ahead
    f.record_run(train("r2"), now=T0)  # stepped back: a run with no incident
    assert f.health(["node3"], now=T0)["node3"]["score"] == pytest.approx(1.0)
    assert f.health(["node3"], now=T0 + 24 * H)["node3"]["score"] == pytest.approx(0.5)
    assert f.health(["node3"], now=T0 + 48 * H)["node3"]["score"] == pytest.approx(0.25)
    assert f.warnings == []
    f.close()


def test_listing_a_fleet_with_no_ledger_yet_is_one_line_and_success(tmp_path, capsys):
    """Issue 67 review, finding 12: `torchfleet hosts` exited 2 on a fleet no preflight or run
    had written yet, breaking the monitoring jobs that list it; release and quarantine still
    refuse a missing ledger, and make none."""
    from torchfleet import cli

    root = str(tmp_path)
    assert cli.main(["hosts", "--runs-root", root]) == 0
    assert capsys.readouterr().out == "no ledger at %s/fleet.db yet: nothing recorded\n" % root
    assert cli.main(["hosts", "--runs-root", root, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    for argv in (["release", "node3"], ["quarantine", "node3", "--hours", "2"]):
        assert cli.main(["hosts", *argv, "--runs-root", root]) == 2
        assert "no fleet ledger at" in capsys.readouterr().err
    assert not (tmp_path / "fleet.db").exists()


def test_a_host_no_run_has_seen_may_be_quarantined_and_is_said_so(tmp_path, capsys):
    """Issue 67 review, finding 12: an operator quarantines a host before its first run; the
    command says it is new (a misspelt name shows), and release of an unknown host still
    refuses."""
    from torchfleet import cli

    root = str(tmp_path)
    fleet = ledger.Fleet("fleet.db", root)
    fleet.record_run(train("r1", "node3"), now=T0)
    fleet.close()
    assert cli.main(["hosts", "quarantine", "node9", "--hours", "2", "--runs-root", root]) == 0
    out = capsys.readouterr().out
    assert out.startswith("node9 quarantined until ") and "(not seen in any run yet)" in out
    assert cli.main(["hosts", "quarantine", "node3", "--hours", "2", "--runs-root", root]) == 0
    assert "not seen" not in capsys.readouterr().out
    fleet = ledger.Fleet("fleet.db", root)
    assert fleet.health(["node9"])["node9"]["quarantined_until"] is not None
    fleet.close()
    assert cli.main(["hosts", "release", "node7", "--runs-root", root]) == 2
    assert "no host node7 in the fleet's ledger" in capsys.readouterr().err


def test_the_default_ledger_on_nfs_falls_back_to_the_controllers_own_and_says_so(
        tmp_path, monkeypatch, capsys):
    """Issue 67 review, finding 8: a runs root in an NFS home (common on login nodes) turned
    the default ledger off: quarantine stopped quietly and quarantine=strict refused every run.
    The default fleet.db falls back to ${XDG_STATE_HOME:-~/.local/state}/torchfleet/fleet.db
    on a local disk, said once (both paths, and PostgreSQL for a shared ledger); torchfleet
    hosts finds it there. A fallback on a network filesystem too: off, as before."""
    from torchfleet import cli

    home = tmp_path / "home"  # the NFS home, the runs root in it
    runs, state = home / "runs", tmp_path / "var" / "state"
    runs.mkdir(parents=True)
    mounts = tmp_path / "mountinfo"
    mounts.write_text("\n".join([ROOT_LINE, NETWORK_MOUNTS["nfs"].format(str(home))]) + "\n")
    monkeypatch.setattr(ledger_store.mounts, "MOUNTINFO", str(mounts))
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    local = state / "torchfleet" / "fleet.db"
    f = ledger.Fleet("fleet.db", str(runs), quarantine_score=1.5)
    f.record_run(train("r1", "node3"), now=T0)
    assert [q["host"] for q in f.record_run(train("r2", "node3"), now=T0 + 60)] == ["node3"]
    assert f.health(["node3"], now=T0 + 120)["node3"]["quarantined_until"] is not None
    assert f.warnings == [] and f.on and f.where == str(local)
    assert len(f.notes) == 1, f.notes
    assert "%s is on a network filesystem (nfs)" % (runs / "fleet.db") in f.notes[0]
    assert "its own ledger at %s instead" % local in f.notes[0]
    assert "postgresql://" in f.notes[0]
    f.close()
    assert local.exists() and not (runs / "fleet.db").exists()
    assert cli.main(["hosts", "--runs-root", str(runs), "--json"]) == 0
    assert [h["host"] for h in json.loads(capsys.readouterr().out)][0] == "node3"
    # A fleet_db given by path is used or refused as given.
    named = ledger.Fleet("torchfleet/fleet.db", str(runs))
    assert named.record_run(train("r1", "node3"), now=T0) == [] and len(named.warnings) == 1
    assert "is on a network filesystem (nfs)" in named.warnings[0]
    # The fallback on NFS too: off, one warning naming both.
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))
    off = ledger.Fleet("fleet.db", str(runs))
    assert off.record_run(train("r1", "node3"), now=T0) == [] and not off.on
    assert len(off.warnings) == 1 and str(runs / "fleet.db") in off.warnings[0]
    assert str(home / ".local" / "state" / "torchfleet" / "fleet.db") in off.warnings[0]
    assert "postgresql://" in off.warnings[0]


def test_the_textfile_says_a_quarantine_over_at_the_first_write_after_it_ends(tmp_path):
    """Issue 67 review, finding 13 (docs/ledger.md): torchfleet_host_quarantined is as of the
    textfile's writing; any later write rewrites the whole file, and one after the end says 0,
    while quarantined_until_seconds told alerts the end all along."""
    path = tmp_path / "fleet.prom"
    f = ledger.Fleet("fleet.db", str(tmp_path))
    f.record_run(train("r1"), now=T0)
    f.quarantine("node3", 1, "by hand", now=T0)
    assert f.textfile(str(path), now=T0 + 1800)
    got = parsed(path.read_text())
    assert got['torchfleet_host_quarantined{host="node3"}'] == 1.0
    assert got['torchfleet_host_quarantined_until_seconds{host="node3"}'] == T0 + H
    assert f.textfile(str(path), now=T0 + 2 * H)
    got = parsed(path.read_text())
    assert got['torchfleet_host_quarantined{host="node3"}'] == 0.0
    assert got['torchfleet_host_quarantined_until_seconds{host="node3"}'] == 0.0
    f.close()


def test_a_quarantine_written_with_the_clock_ahead_lasts_no_longer(tmp_path):
    """On SQLite each controller dates what it writes by its own clock: one a day ahead
    quarantined node3 for 24 h, and on c4710eb every controller with a right clock held it
    48 h. A quarantine cannot have begun after now: read with its start clamped to now (its
    length kept), and the next write by a right clock dates it so for every reader."""
    f = ledger.Fleet("fleet.db", str(tmp_path))
    assert f.quarantine("node3", 24, "checked by hand", now=T0 + 24 * H)  # a day ahead
    assert f.health(["node3"], now=T0)["node3"]["quarantined_until"] == T0 + 24 * H
    listed = {h["host"]: h for h in f.hosts(now=T0)}["node3"]["quarantined_until"]
    assert listed == ledger.iso(T0 + 24 * H)
    f.record_run(train("r1"), now=T0 + 1)  # a right clock's write: dated now
    assert f.health(["node3"], now=T0 + 25 * H)["node3"]["quarantined_until"] is None
    assert f.health(["node3"], now=T0 + 23 * H)["node3"]["quarantined_until"] == T0 + 1 + 24 * H
    # A quarantine written with a right clock, read by one behind it, is not shortened.
    assert f.quarantine("node4", 24, "checked by hand", now=T0 + 2)
    assert f.health(["node4"], now=T0 + 2)["node4"]["quarantined_until"] == T0 + 2 + 24 * H
    f.close()
