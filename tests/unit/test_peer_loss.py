"""Which failed rank died of another rank's loss (a consequence), read from its last lines:
recorded real texts (tests/fixtures/ranks/README.md names each source), and what a rank's own
error looks like beside them."""
from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import peer_loss
from hypothesis import given
from hypothesis import strategies as st

RANKS = Path(__file__).parent.parent / "fixtures" / "ranks"


@pytest.mark.parametrize("name", ["gloo-peer-closed-2.13.log", "nccl-remote-error-2.21.5.log",
                                  "nccl-internal-closed-by-remote-peer-2.14.3.log",
                                  "nccl-ofi-undeliverable-2.28.8.log"])
def test_a_rank_that_lost_its_peer_is_a_consequence(name):
    assert peer_loss((RANKS / name).read_text())


def test_a_port_taken_is_the_ranks_own_failure_though_torch_calls_it_a_network_error():
    assert not peer_loss((RANKS / "store-eaddrinuse-2.13.log").read_text())


def test_a_ranks_own_error_after_a_warning_about_a_peer_is_its_own():
    """gloo's recorded peer-loss text, caught and printed by the script, then the rank's own
    ValueError: the last exception is what the rank died of."""
    text = (RANKS / "gloo-peer-closed-2.13.log").read_text() + (
        "[rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "/tmp/run/train.py", line 40, in <module>\n'
        "[rank0]:     raise ValueError('batch 17 has no labels')\n"
        "[rank0]: ValueError: batch 17 has no labels\n")
    assert not peer_loss(text)


def test_a_watchdog_timeout_without_a_traceback_is_read_whole():
    assert peer_loss("[rank0]:[E1126 10:00:00 ProcessGroupNCCL.cpp:632] [PG 0 Rank 0] Watchdog "
                     "caught collective operation timeout: WorkNCCL(SeqNum=15, "
                     "OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600012 milliseconds\n")
    assert not peer_loss("") and not peer_loss(None)


@given(st.text(max_size=2000))
def test_any_text_is_answered_without_raising(text):
    assert peer_loss(text) in (True, False)
