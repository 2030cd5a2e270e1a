"""The master judges on its own monotonic time: a step of the host's wall clock (NTP, an
operator, a VM resumed) changes no verdict. The master's store is driven here as its loop
drives it (agent.MasterStore: handle, step), with the wall clock and the monotonic clock given
by the test, and the controller's lease file touched as a look touches it."""
from __future__ import annotations

import os
import types

from ansible_collections.torchfleet.fleet.plugins.module_utils.run import agent, runstate
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.runstate import RunState


class Clocks:
    def __init__(self):
        self.wall, self.mono = 1_800_000_000.0, 50.0


class NoServer:
    """The control channel's part the store calls; messages are handed to handle() directly."""
    refused = {}

    def step(self, *_args):
        pass

    def broadcast(self, _message):
        pass


def store_of(tmp_path, clocks, hosts=("node0", "node1")):
    clock = agent.Clock(wall=lambda: clocks.wall, mono=lambda: clocks.mono)
    state = RunState("r1", list(hosts), 1, now=clock(), lost_after_s=30, hang_timeout_s=300)
    t = types.SimpleNamespace(LOOK_S=0.1, BEAT_S=1.0, lease_s=30.0, start_bound_s=None,
                              abort_grace_s=0.5)
    store = agent.MasterStore({"run_dir": str(tmp_path), "host": hosts[0]}, t, NoServer(),
                              state, lambda _line: None, clock)
    store.lease = agent.Lease(str(tmp_path / "lease"), 30.0, wall=lambda: clocks.wall,
                              mono=lambda: clocks.mono)
    return store


def seconds(store, clocks, n, look=True):
    """n seconds of the run: every host beats, the controller looks (touches the lease)."""
    for _ in range(n):
        clocks.wall += 1.0
        clocks.mono += 1.0
        for host in store.state.order:
            store.handle(host, {"t": runstate.BEAT, "alive": 1, "idle_s": 0.0,
                                "last_line": "step", "pid": 1})
        if look:
            lease = store.lease.path
            open(lease, "a").close()
            os.utime(lease, (clocks.wall, clocks.wall))
        store.step(clocks.mono)


def test_a_wall_clock_step_forward_or_back_of_minutes_changes_no_verdict(tmp_path):
    clocks = Clocks()
    store = store_of(tmp_path, clocks)
    seconds(store, clocks, 10)
    clocks.wall += 600  # ten minutes forward
    seconds(store, clocks, 40)
    clocks.wall -= 1800  # half an hour back
    seconds(store, clocks, 40)
    assert store.state.phase == runstate.RUNNING and store.state.failures == []
    assert all(h["state"] == runstate.STARTED for h in store.state.record()["hosts"])


def test_after_a_step_back_a_controller_that_stops_looking_still_loses_its_lease(tmp_path):
    """Before, a step back made the lease file look younger than now: the lease never ran out."""
    clocks = Clocks()
    store = store_of(tmp_path, clocks)
    seconds(store, clocks, 5)
    clocks.wall -= 3600
    seconds(store, clocks, 29, look=False)
    assert store.state.failure is None
    seconds(store, clocks, 3, look=False)
    assert store.state.failure["reason"] == runstate.CONTROLLER_LOST


def test_a_silent_host_is_still_lost_after_lost_after_s_of_monotonic_time(tmp_path):
    clocks = Clocks()
    store = store_of(tmp_path, clocks)
    seconds(store, clocks, 5)
    store.state.order.remove("node1")  # node1 stops beating (cut), the wall steps back
    clocks.wall -= 900
    seconds(store, clocks, 32)
    store.state.order.append("node1")
    assert (store.state.failure["host"], store.state.failure["reason"]) == ("node1",
                                                                           runstate.LOST)


def test_the_lease_counts_a_look_when_the_file_changes_not_by_its_distance_to_the_wall(tmp_path):
    clocks = Clocks()
    path = tmp_path / "lease"
    lease = agent.Lease(str(path), 30.0, wall=lambda: clocks.wall, mono=lambda: clocks.mono)
    assert lease.age() is None  # before the first look
    path.touch()
    os.utime(path, (clocks.wall - 5, clocks.wall - 5))
    assert lease.age() == 5.0  # the first sight trusts the wall once
    clocks.mono += 12
    clocks.wall += 7200
    assert lease.age() == 17.0
    os.utime(path, (clocks.wall, clocks.wall))
    assert lease.age() == 0.0


def test_every_host_that_goes_silent_in_one_tick_is_recorded():
    hosts = ["node%d" % i for i in range(16)]
    s = RunState("r1", hosts, 1, now=1000.0, lost_after_s=30)
    for h in hosts:
        s.beat(h, 1001.0, alive=1)
    first = s.tick(1032.0)
    assert first["host"] == "node0"
    assert sorted(f["host"] for f in s.failures) == sorted(hosts)
    assert {h["state"] for h in s.record()["hosts"]} == {runstate.HOST_LOST}


def test_every_host_that_never_reached_the_master_in_one_tick_is_recorded():
    s = RunState("r1", ["node0", "node1", "node2"], 1, now=1000.0, join_timeout_s=60)
    s.beat("node0", 1060.0, alive=1)
    s.tick(1061.0)
    assert [(f["host"], f["reason"]) for f in s.failures] == [
        ("node1", runstate.NOT_STARTED), ("node2", runstate.NOT_STARTED)]


def test_a_master_whose_agent_died_is_lost_and_the_failures_it_kept_stay():
    """The master's agent SIGKILLed (or OOM-killed) mid-run: its last record is judged again
    with the master lost as of that record's last update."""
    s = RunState("r1", ["node0", "node1", "node2"], 2, now=1000.0)
    for h in ("node0", "node1", "node2"):
        s.beat(h, 1001.0, alive=2)
    s.updated = 1010.0
    record = runstate.master_lost(s.record(), "node0", "its agent ended without finishing "
                                  "the run's record (killed, out of memory, or crashed): rc -9")
    assert record["final"] and record["phase"] == runstate.LOST
    assert (record["failure"]["host"], record["failure"]["reason"]) == ("node0", runstate.LOST)
    assert record["failure"]["at_s"] == 10.0
    rows = runstate.host_rows(["node0", "node1", "node2"], record)
    assert [r["outcome"] for r in rows] == ["lost", "aborted", "aborted"]


def test_a_cause_the_dead_master_had_recorded_first_stays_first():
    s = RunState("r1", ["node0", "node1"], 1, now=1000.0)
    s.beat("node0", 1001.0, alive=1)
    s.beat("node1", 1001.0, alive=1)
    s.exited("node1", 1005.0, 3, root_cause={"rank": 1, "local_rank": 0, "exitcode": 3})
    s.updated = 1006.0
    record = runstate.master_lost(s.record(), "node0", "its agent ended")
    assert (record["failure"]["host"], record["failure"]["rank"]) == ("node1", 1)
    assert [f["host"] for f in record["failures"]] == ["node1", "node0"]
