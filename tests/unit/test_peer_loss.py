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


# -- a knock-on death whose last exception is the user's own wrapper ------------------------------

@pytest.mark.parametrize("name", ["gloo-peer-closed-chained-from-2.13.log",
                                  "gloo-peer-closed-chained-during-2.13.log"])
def test_a_collective_error_chained_under_the_users_own_exception_is_a_consequence(name):
    """On c4710eb only the last exception was read: a training loop's `raise RuntimeError(...)
    from e` around the broken all_reduce, or a checkpoint save failing in its `except`, made
    the knock-on death the rank's own failure (the run's First failure, its host blamed)."""
    assert peer_loss((RANKS / name).read_text())


def test_an_nccl_error_wrapped_by_the_users_code_is_a_consequence_and_a_tail_cut_mid_chain():
    """NCCL's recorded DistBackendError (nccl-remote-error-2.21.5.log) raised in a step the
    user's code wraps, Python's chaining words between; also read when the tail kept only the
    end of the first traceback."""
    nccl = (RANKS / "nccl-remote-error-2.21.5.log").read_text()
    wrapped = ("Traceback (most recent call last):\n"
               '  File "/tmp/run/train.py", line 30, in step\n'
               "    dist.all_reduce(t)\n" + nccl +
               "\nThe above exception was the direct cause of the following exception:\n\n"
               "Traceback (most recent call last):\n"
               '  File "/tmp/run/train.py", line 52, in <module>\n'
               "    raise RuntimeError(f'training step {n} failed') from e\n"
               "RuntimeError: training step 17 failed\n")
    assert peer_loss(wrapped)
    cut = wrapped[wrapped.index("Last error:"):]  # the DistBackendError line itself is gone
    assert peer_loss(cut)


def test_the_users_own_error_chained_is_still_its_own():
    """A chain without a collective's words is the rank's own failure, and a peer warning
    printed (not chained) before it stays outside the chain."""
    own = ("[rank0]: Traceback (most recent call last):\n"
           "[rank0]: ValueError: batch 17 has no labels\n\n"
           "[rank0]: The above exception was the direct cause of the following exception:\n\n"
           "[rank0]: Traceback (most recent call last):\n"
           "[rank0]: RuntimeError: training step 17 failed\n")
    assert not peer_loss(own)
    assert not peer_loss((RANKS / "gloo-peer-closed-2.13.log").read_text() + own)
    # A port taken, wrapped by the user's code: its own, however torch words it.
    taken = (RANKS / "store-eaddrinuse-2.13.log").read_text()
    assert not peer_loss(taken + "\nDuring handling of the above exception, another exception "
                         "occurred:\n\nTraceback (most recent call last):\nRuntimeError: x\n")


def test_the_agent_reads_a_chain_longer_than_forty_lines(tmp_path):
    """The agent read 40 lines of a rank's stderr: a chain's first traceback (the collective's
    error) above a long second one was cut off."""
    from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import (
        peer_loss_of)
    text = (RANKS / "gloo-peer-closed-chained-from-2.13.log").read_text()
    head, _sep, rest = text.partition("[rank0]: RuntimeError: training step 17 failed")
    frames = "".join('[rank0]:   File "/tmp/run/model.py", line %d, in forward\n'
                     "[rank0]:     x = self.layer%d(x)\n" % (i, i) for i in range(30))
    (tmp_path / "stderr.log").write_text(
        head.replace("[rank0]:     raise RuntimeError", frames + "[rank0]:     raise RuntimeError")
        + "[rank0]: RuntimeError: training step 17 failed" + rest)
    assert peer_loss_of(str(tmp_path)) and not peer_loss_of("") and not peer_loss_of(None)
