"""A silent cause is not lost to its consequence: the master's record stays open while a host of
the run is unheard-from and not yet judged, so a host cut off (or frozen) before its peers'
errors reached the master is named host.lost, first. The master's store is driven as its loop
drives it (tests/unit/test_clock_step.py's clocks)."""
from __future__ import annotations

from ansible_collections.torchfleet.fleet.plugins.module_utils.run import runstate

from tests.unit.test_clock_step import Clocks, seconds, store_of

HOSTS = ("node0", "node1", "node2")


def beats(store, clocks, n, hosts):
    for _ in range(n):
        clocks.wall += 1.0
        clocks.mono += 1.0
        for host in hosts:
            store.handle(host, {"t": runstate.BEAT, "alive": 1, "idle_s": 0.0,
                                "last_line": "step", "pid": 1})
        store.step(clocks.mono)


def peers_error_out(store, clocks):
    """node2 falls silent; 10 s later node0's rank times out in its collective (an error that
    does not read as a lost peer: NCCL's IB retries, a short collective_timeout_s) and node1
    is stopped by the abort."""
    beats(store, clocks, 10, ("node0", "node1"))
    store.handle("node0", {"t": runstate.EXIT, "rc": 1, "age_s": 0.0, "last_line": "timeout",
                           "root_cause": {"rank": 0, "local_rank": 0, "exitcode": 1}})
    assert store.state.failure["host"] == "node0"  # for now: node2 is not judged yet
    clocks.mono += 1.0
    clocks.wall += 1.0
    store.handle("node1", {"t": runstate.EXIT, "rc": -15, "stopped": True, "age_s": 0.0})


def test_the_cut_host_is_named_lost_not_the_peer_whose_error_reached_the_master_first(
        tmp_path):
    clocks = Clocks()
    store = store_of(tmp_path, clocks, HOSTS)
    seconds(store, clocks, 5)
    cut_at = store.state.hosts["node2"]["last_seen"]
    peers_error_out(store, clocks)
    waited = 0
    while not store.done(clocks.mono):
        clocks.mono += 1.0
        clocks.wall += 1.0
        store.step(clocks.mono)
        waited += 1
        assert waited < 60, "the record never closed"
    # Past the usual settle (8 s), until node2 was judged: 30 s after its last beat.
    assert waited > 10 and store.state.hosts["node2"]["state"] == runstate.HOST_LOST
    failure = store.state.record()["failure"]
    assert (failure["host"], failure["reason"]) == ("node2", runstate.LOST)
    assert failure["at_s"] == round(cut_at - store.state.started, 3)
    # node0's error is kept, judged after the cut.
    assert [f["host"] for f in store.state.failures] == ["node0", "node2"]


def test_a_host_that_reports_its_stop_late_closes_the_record_with_the_peer_named(tmp_path):
    """Silence is not guilt: node2 slow to stop (but heard) ends the wait, and the error its
    peer reported stays the first failure."""
    clocks = Clocks()
    store = store_of(tmp_path, clocks, HOSTS)
    seconds(store, clocks, 5)
    peers_error_out(store, clocks)
    for _ in range(12):
        clocks.mono += 1.0
        clocks.wall += 1.0
        store.step(clocks.mono)
        assert not store.done(clocks.mono)
    store.handle("node2", {"t": runstate.EXIT, "rc": -15, "stopped": True, "age_s": 0.0})
    store.step(clocks.mono)
    assert store.done(clocks.mono)
    assert store.state.failure["host"] == "node0"
