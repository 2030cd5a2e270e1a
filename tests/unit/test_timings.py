"""The timings that must hold together, each rule in words (plugins/module_utils/defaults.py
holds every timing once; ansible.cfg holds SSH's, read here)."""
from __future__ import annotations

import configparser
import re

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults as d
from tests.conftest import ROOT

LOST_AFTER_S = d.default("lost_after_s")


def ssh_options():
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(ROOT / "ansible.cfg")
    args = cfg["ssh_connection"]["ssh_args"]
    return {k: float(v) for k, v in re.findall(r"-o (\w+)=(\d+)", args)}, \
        float(cfg["defaults"]["timeout"])


def test_the_dump_deadline_exceeds_py_spys_timeout():
    assert d.DUMP_S > d.PYSPY_TIMEOUT_S


def test_the_controllers_settle_covers_everything_the_master_waits_for():
    # The master settles after the decision (a hang's stacks included); the controller's watch
    # must still be looking when the record turns final, a poll later at worst.
    assert d.WATCH_SETTLE_S >= d.master_settle_s(d.ABORT_GRACE_S, hang=True) + d.POLL_S


def test_a_lease_spans_at_least_three_polls():
    assert d.default("lease_s") >= 3 * d.POLL_S


def test_progress_is_printed_more_often_than_the_lease_runs_out():
    assert d.POLL_S <= d.PROGRESS_EVERY_S < d.default("lease_s")


def test_the_lease_rides_out_a_minute_cut_and_a_dead_controllers_run_ends_within_3_minutes():
    """A laptop's VPN reconnecting: the watch looks again for lease_s, so a 60 s cut (with its
    SSH timeouts) loses nothing; a controller that is gone leaves the run to the lease, then
    the stop (SIGTERM to SIGKILL) and the agents' own end, within 3 minutes."""
    assert d.default("lease_s") >= 60 + 2 * d.POLL_S
    assert d.default("lease_s") + d.LOOK_S + d.STOP_GRACE_S + d.ABORT_GRACE_S < 180


def test_the_lab_tests_shorter_cut_keeps_the_defaults_relations():
    """tests/lab/test_reliability_lab.py cuts for CUT_S against a lease of CUT_LEASE_S: still
    shorter than the lease by two polls, still longer than SSH takes to give up on a host."""
    from tests.lab.test_reliability_lab import CUT_LEASE_S, CUT_S

    ssh, _ = ssh_options()
    assert CUT_LEASE_S >= CUT_S + 2 * d.POLL_S and CUT_LEASE_S >= 3 * d.POLL_S
    assert CUT_S > max(ssh["ServerAliveInterval"] * ssh["ServerAliveCountMax"],
                       ssh["ConnectTimeout"])


def test_ssh_gives_up_on_a_cut_host_before_lost_after_s():
    ssh, _ = ssh_options()
    assert ssh["ServerAliveInterval"] * ssh["ServerAliveCountMax"] < LOST_AFTER_S
    assert ssh["ConnectTimeout"] < LOST_AFTER_S


def test_lost_after_s_is_many_beats_and_a_beat_many_looks():
    assert LOST_AFTER_S >= 10 * d.BEAT_S and d.BEAT_S >= 5 * d.LOOK_S


def test_a_closed_connection_is_judged_before_silence_would_be():
    assert d.BEAT_S < d.CLOSED_LOST_S < LOST_AFTER_S


def test_ansibles_async_job_outlives_the_run_its_stop_and_its_settle():
    assert d.ASYNC_SLACK_S > d.WATCH_SETTLE_S + d.STOP_GRACE_S


def test_preflights_listener_outlives_a_refused_connections_retries():
    assert d.LISTENER_IDLE_S > d.CONNECT_TIMEOUT_S + d.LISTEN_SLACK_S


def test_a_hang_is_told_from_a_slow_start_and_a_lost_host():
    # A hang needs every rank silent for hang_timeout_s: longer than the time that names a
    # silent host lost, and than the rendezvous' join timeout.
    assert d.default("hang_timeout_s") > max(LOST_AFTER_S, d.JOIN_BASE_S)
