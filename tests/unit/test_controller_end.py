"""The controller's end is the run's end: a look with `stop` (the watch saw its
ansible-playbook gone, or Ctrl-C / SIGTERM) leaves a request the master's store reads within a
beat, and the run is stopped on every host, recorded as the controller's. Driven as the
master's loop drives the store (tests/unit/test_clock_step.py's clocks); the real signals:
tests/integration/test_launch_local.py."""
from __future__ import annotations

import os

from ansible_collections.torchfleet.fleet.plugins.module_utils.run import runstate, watch
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import LEASE, STOP_REQUEST

from tests.unit.test_clock_step import Clocks, seconds, store_of


def test_a_stop_asked_through_a_look_stops_the_run_within_a_beat(tmp_path):
    clocks = Clocks()
    store = store_of(tmp_path, clocks)
    aborted = []
    store.abort_everyone = lambda: aborted.append(store.state.failure)
    seconds(store, clocks, 5)
    lease = tmp_path / LEASE
    before = lease.stat().st_mtime
    os.utime(lease, (before - 100, before - 100))
    answer = watch.look({"run_dir": str(tmp_path), "run_id": "r1",
                         "stop": "stopped: the controller ended (ansible-playbook 4242 is gone)"})
    assert (tmp_path / STOP_REQUEST).exists() and not answer.get("failed")
    assert lease.stat().st_mtime == before - 100  # a stopping controller renews nothing
    seconds(store, clocks, 2, look=False)
    failure = store.state.failure
    assert failure["reason"] == runstate.STOPPED_BY_USER and failure["host"] is None
    assert failure["detail"] == "stopped: the controller ended (ansible-playbook 4242 is gone)"
    assert aborted and aborted[0] is failure


def test_no_request_no_stop_and_a_garbled_one_is_not_taken(tmp_path):
    clocks = Clocks()
    store = store_of(tmp_path, clocks)
    seconds(store, clocks, 3)
    (tmp_path / STOP_REQUEST).write_text("[not a request")
    seconds(store, clocks, 3)
    assert store.state.phase == runstate.RUNNING
