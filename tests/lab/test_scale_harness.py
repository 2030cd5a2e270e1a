"""The scale harness's small case (lab/scale.py; the curves at 64 to 512 hosts are bench/scale.py):
32 hosts x 8 ranks on this machine, the real master (the torchrun_job module) and the real
agents with their real control channel, stand-in ranks (lab/standin_torchrun.py). What a user
of 32 hosts would check: the rank that died is the one named, every host is told and stops,
nothing is left running; a hang names the rank that never joined. No root needed: every host
is a loopback address of its own."""
from __future__ import annotations

import time

import pytest

from ansible_collections.torchfleet.fleet.plugins.module_utils.run import flight, procs, runstate
from lab.scale import Fleet

HOSTS = 32


@pytest.fixture
def fleet_of(tmp_path):
    made = []

    def make(**kw):
        made.append(Fleet(tmp_path / ("fleet%d" % len(made)), HOSTS, tag=1, **kw))
        return made[-1]
    yield make
    for fleet in made:
        fleet.down()
        assert procs.run_processes(fleet.run_id) == [], "the harness left processes running"


@pytest.mark.slow  # the scale harness: docs/testing.md's tiers
def test_a_rank_that_dies_among_32_hosts_is_named_and_every_host_stops(fleet_of):
    fleet = fleet_of()
    fleet.up(timeout_s=600)
    victim = 17
    fleet.kill_rank(victim, 5)
    final = fleet.wait(lambda r: r["final"], 300, "the record final")
    failure = final["failure"]
    assert (failure["host"], failure["rank"], failure["reason"]) == (
        "tfscale017", victim * 8 + 5, runstate.FAILED)
    assert [f["host"] for f in final["failures"]][:1] == ["tfscale017"]
    assert all(h["state"] in runstate.DONE for h in final["hosts"])
    # Every host's agent (the master's is in its own process) heard the abort and saw its
    # torchrun end.
    stats = None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        stats = fleet.stats()
        if stats["live"] == 0:
            break
        time.sleep(0.5)
    assert stats is not None and stats["live"] == 0
    others = set(fleet.names[1:]) - {fleet.names[victim]}
    assert others <= {h for h, t in stats["times"].items() if "told" in t}
    assert set(fleet.names[1:]) == {h for h, t in stats["times"].items() if "ended" in t}
    assert not any(procs.alive(pid) for pid in fleet.launchers().values())


@pytest.mark.slow
def test_a_hang_among_32_hosts_names_the_rank_that_never_joined(fleet_of):
    # (20 s: a loaded machine can hold the stand-ins still for seconds; not for twenty)
    fleet = fleet_of(hang_timeout_s=20)
    fleet.up(timeout_s=600)
    victim = 11 * 8 + 2
    fleet.hang(victim)
    record = fleet.wait(lambda r: r["failure"] is not None, 300, "a hang named")
    failure = record["failure"]
    assert failure["reason"] == runstate.HANG, failure
    assert flight.culprits(failure["collective"]) == [victim]
    assert "tfscale011 rank %d never joined" % victim in failure["detail"]
