"""reports/slurm_drain.py and the drain breaker's decision in the ledger (docs/slurm.md)."""
from __future__ import annotations

import time

from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import (
    ledger, slurm_drain, summary)
from tests.unit.test_fleet_memory import fake_scontrol, xid79_run

NOW = 1_900_000_000.0
HOSTS = ["n%02d" % i for i in range(20)]  # x 0.1: two drains within quarantine_h


def ask(*hosts):
    return [{"host": h, "reason": "run.hardware", "evidence": "Xid 79 on " + h} for h in hosts]


def test_two_controllers_deciding_before_either_scontrol_answered_see_each_others_drains(
        tmp_path):
    """fleet.drains() read the earlier drains without the decision lock, and the drains were
    written only after every scontrol had answered: ten run ends under one cause each saw
    only its own drains under the limit. Now each decides under the lock and records its
    drains as pending in the same transaction; Slurm's answer settles them."""
    one = ledger.Fleet("fleet.db", str(tmp_path / "runs"))
    two = ledger.Fleet("fleet.db", str(tmp_path / "runs"))
    first = []

    def decide(asked, said):
        return lambda held, seen: said.append(summary.drain_breaker(
            asked, HOSTS, 0.1, held, seen)) or said[-1][0]
    assert one.decide_drains("r1", "train", decide(ask("n00", "n01"), first), now=NOW) \
        == ask("n00", "n01") and first[0][1] == ""
    # r1's scontrol has not answered yet: r2, on the other controller, is past the limit.
    second = []
    assert two.decide_drains("r2", "train", decide(ask("n02", "n03"), second), now=NOW + 1) == []
    assert second[0][1].startswith("fleet-wide cause suspected: 2 hosts (n02, n03) of 20 "
                                   "would be drained beside 2 already")
    assert one.drains(NOW + 2)[0] == {"n00", "n01"}
    # Slurm refused n01's drain: it no longer counts; n00's, done, does.
    assert one.settle_drains("r1", "train", [
        summary.action("drain", "n00", "run.hardware", NOW, "Xid 79", True),
        summary.action("drain", "n01", "run.hardware", NOW, "Xid 79; Slurm did not", False)])
    assert two.drains(NOW + 3)[0] == {"n00"}
    assert [(a["done"], a["why"]) for a in two.history("n01", now=NOW + 3)["actions"]] == [
        (False, "Xid 79; Slurm did not")]
    one.close()
    two.close()


def test_a_hung_slurmctld_is_asked_once_and_the_rest_are_not_tried(tmp_path, monkeypatch):
    """Each drain waited 30 s for scontrol, one after another (51 hosts: 25 min before
    train.json). Now one call per reason, the hosts one hostlist, and after a timeout no more
    calls: the rest are not done, "not tried"."""
    log = tmp_path / "scontrol.log"
    hang = tmp_path / "scontrol"
    hang.write_text('#!/bin/sh\nprintf "%%s\\n" "$*" >> %s\nexec sleep 30\n' % log)
    hang.chmod(0o755)
    monkeypatch.setattr(slurm_drain, "SCONTROL_TIMEOUT_S", 0.5)
    entries = ask("a1", "a2", "a3") + [
        {"host": h, "reason": "host.quarantined", "evidence": "score 3.0"} for h in ("q1", "q2")]
    started = time.monotonic()
    said = slurm_drain.drain(entries, "r1", {"a1": "slurm-a1"}, str(hang))
    assert time.monotonic() - started < 5
    (call,) = log.read_text().splitlines()
    assert call.startswith("update nodename=slurm-a1 state=drain reason=torchfleet r1: "
                           "run.hardware: Xid 79 on a1")
    # (the call that timed out may have drained a1: issue "a timed-out drain is not counted")
    assert said["a1"].startswith(slurm_drain.UNANSWERED + " (scontrol timed out after 0.5 s)")
    assert slurm_drain.unanswered(said["a1"]) and "scontrol show node slurm-a1" in said["a1"]
    assert not any(slurm_drain.unanswered(said[h]) for h in ("a2", "a3", "q1", "q2"))
    assert all(said[h].startswith("Slurm did not drain it (%s)" % slurm_drain.NOT_TRIED)
               for h in ("a2", "a3", "q1", "q2")), said


def hung_scontrol(tmp_path):
    """An scontrol that takes the call and never answers (slurmctld slow under load)."""
    hang = tmp_path / "scontrol"
    hang.write_text("#!/bin/sh\nexec sleep 30\n")
    hang.chmod(0o755)
    return str(hang)


def test_a_drain_whose_scontrol_timed_out_still_counts_for_the_breaker(tmp_path, capsys,
                                                                       monkeypatch):
    """On c4710eb a drain whose scontrol timed out was settled "not done" and left the
    breaker's count, though slurmctld may have drained the node: a slow slurmctld let every
    later run drain past quarantine_max_fraction. Now it stays pending in the ledger (counted
    by every controller's breaker), and its words say it may be drained."""
    monkeypatch.setattr(slurm_drain, "SCONTROL_TIMEOUT_S", 0.5)
    end = xid79_run(tmp_path, capsys, "r1", "n02", HOSTS, slurm_scontrol=hung_scontrol(tmp_path))
    (drain,) = [a for a in end["actions"] if a["action"] == "drain"]
    assert (drain["host"], drain["done"]) == ("n02", False)
    fleet = ledger.Fleet("fleet.db", str(tmp_path / "runs"))
    assert fleet.drains()[0] == {"n02"}
    # Another run's two drains: with n02's, 3 of 20 hosts, past 0.1 x 20: none is done.
    said = []
    assert fleet.decide_drains("r2", "train", lambda held, seen: said.append(
        summary.drain_breaker(ask("n05", "n06"), HOSTS, 0.1, held, seen)) or said[-1][0]) == []
    assert "beside 1 already" in said[0][1]
    fleet.close()
    assert drain["why"].split("; ", 1)[1].startswith(slurm_drain.UNANSWERED)


def test_one_reason_is_one_scontrol_call_with_a_hostlist(tmp_path):
    scontrol, log = fake_scontrol(tmp_path)
    entries = [{"host": h, "reason": "host.quarantined", "evidence": "score 3.0"}
               for h in ("q1", "q2", "q3")]
    said = slurm_drain.drain(entries, "r1", {"q2": "slurm-q2"}, scontrol)
    assert said == {"q1": "", "q2": "", "q3": ""}
    assert log.read_text().splitlines() == [
        "update nodename=q1,slurm-q2,q3 state=drain reason=torchfleet r1: host.quarantined: "
        "score 3.0"]


def test_the_whole_wait_is_bounded(tmp_path, monkeypatch):
    scontrol, log = fake_scontrol(tmp_path)
    monkeypatch.setattr(slurm_drain, "TOTAL_S", 0)
    said = slurm_drain.drain(ask("a1"), "r1", {}, scontrol)
    assert said["a1"].startswith("Slurm did not drain it (%s" % slurm_drain.NOT_TRIED)
    assert not log.exists()


def test_a_nul_in_the_evidence_is_no_crash_and_each_host_has_its_own_scontrol(tmp_path):
    """A NUL in a host's kernel line raised ValueError (argv) out of run_summary; scontrol
    was the first host's for every host."""
    mine, log = fake_scontrol(tmp_path)
    entries = [{"host": "a1", "reason": "run.hardware", "evidence": "Xid\x00 79\n\x1b[1mfell"}]
    assert slurm_drain.drain(entries, "r1", {}, mine) == {"a1": ""}
    assert log.read_text() == "update nodename=a1 state=drain reason=torchfleet r1: " \
        "run.hardware: Xid  79 [1mfell\n"
    entries += ask("a2")  # a2's scontrol is the default: a command not found
    said = slurm_drain.drain(entries, "r2", {}, "/nonexistent", {"a1": mine})
    assert said["a1"] == "" and log.read_text().count("\n") == 2
    assert said["a2"].startswith("Slurm did not drain it (scontrol could not run: ")
    said = slurm_drain.drain(entries, "r1", {}, "scont\x00rol")
    assert said["a1"].startswith("Slurm did not drain it (scontrol could not run: ")
    long = slurm_drain.reason({"reason": "run.hardware", "evidence": "x" * 500}, "r1")
    assert len(long) < 200 and long.endswith("...")


FQDN = ["n%02d.cluster.example" % i for i in range(16)]


def test_the_breaker_counts_inventory_names_and_the_ledgers_as_one_host():
    """The ledger keeps node3 and the inventory says node3.cluster.example: 16 FQDN hosts made
    a group of 32 (the limit doubled), and a host drained before counted twice."""
    drain = [{"host": FQDN[1], "reason": "run.hardware", "evidence": "Xid 79"}]
    seen = {h.split(".")[0] for h in FQDN}
    assert summary.drain_breaker(drain, FQDN, 0.1, held={"n00"}, seen=seen)[0] == []
    assert summary.drain_breaker(drain, FQDN, 0.1, held={"n01"}, seen=seen) == (drain, "")


def test_a_host_drained_for_hardware_and_quarantined_is_asked_once_by_its_slurm_node(
        tmp_path, capsys):
    """Its hardware drain had its inventory name, its quarantine the ledger's: two drains, the
    second by the short name (its slurm_node missed)."""
    scontrol, log = fake_scontrol(tmp_path)
    end = xid79_run(tmp_path, capsys, "r1", FQDN[2], FQDN[:4], slurm_scontrol=scontrol,
                    slurm_nodes={FQDN[2]: "slurm-n02"}, quarantine_score=0.1,
                    quarantine_max_fraction=1.0)
    assert [q["host"] for q in end.get("quarantined", [])] == ["n02"]
    assert [(a["host"], a["done"]) for a in end["actions"] if a["action"] == "drain"] == [
        (FQDN[2], True)]
    (call,) = log.read_text().splitlines()
    assert call.startswith("update nodename=slurm-n02 state=drain")
