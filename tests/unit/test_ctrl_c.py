"""Ctrl-C while a playbook runs asks for a cancel and never abandons the wait.

CPython 3.11: a KeyboardInterrupt raised inside Thread.join() marks the joined thread as
finished while it still runs, so a wait loop that catches it leaves early (this is how the
landing CI saw ansible-playbook still alive after a Ctrl-C). ctrl_c_sets() turns SIGINT into a
flag for the duration of the run instead.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from torchfleet.runner import ctrl_c_sets


def wait_through_sigint(flag):
    """Join a 1.5 s worker thread while SIGINT arrives; how long the wait lasted, and whether
    the worker really ended (its frame is gone) when the wait said so."""
    with ctrl_c_sets(flag):
        # Both threads start inside the handler's scope, so a slow machine cannot deliver the
        # signal before it or after it.
        start = time.monotonic()
        worker = threading.Thread(target=time.sleep, args=(1.5,))
        worker.start()
        ctrl_c = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
        ctrl_c.start()
        while worker.is_alive():
            worker.join(0.1)
        waited = time.monotonic() - start
        ctrl_c.join()
    return waited, worker.ident not in sys._current_frames()


@pytest.fixture
def terminal_sigint():
    """SIGINT as a terminal's Ctrl-C finds it, whatever this test run inherited (a run started
    in the background with & inherits an ignored SIGINT)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_sigint_during_the_wait_sets_the_flag_and_the_wait_lasts_until_the_thread_ends(
        terminal_sigint):
    flag = threading.Event()
    waited, ended = wait_through_sigint(flag)
    assert flag.is_set()
    assert ended and waited >= 1.4


def test_sigint_during_a_clean_up_is_ignored_and_the_handler_is_restored_after(terminal_sigint):
    before = signal.getsignal(signal.SIGINT)
    waited, ended = wait_through_sigint(None)
    assert ended and waited >= 1.4
    assert signal.getsignal(signal.SIGINT) is before


def test_an_ignored_sigint_stays_ignored():
    # nohup and background jobs ignore SIGINT; a run there is not cancelled by one.
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        flag = threading.Event()
        waited, ended = wait_through_sigint(flag)
        assert not flag.is_set() and ended
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
