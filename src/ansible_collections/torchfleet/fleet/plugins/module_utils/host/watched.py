"""Calls that may hang, made on a thread of their own and watched from the agent's loop.

A call in flight is `busy` (what it asks, of which device, since when, and how long it may
wait by itself); late() gives the calls still unanswered a deadline past that wait, so the loop
names the device that stopped answering and never waits on it. gpuwatch's NVML and nvidia-smi
calls (a GPU whose firmware is stuck blocks each NVML call for seconds) and ibwatch's reads of
the RDMA ports' sysfs files (on mlx5 a counter read is a firmware command with a 60 s timeout)
go through it.

Only the standard library: it runs inside the agent on every host.
"""
from __future__ import annotations

import time

AGE_MAX_S = 600.0   # the most uncertain a stall's start is said to be


class Calls:
    """The calls in flight of a watch's threads, one slot per thread (a thread makes one call
    at a time). Written by the threads, read by the loop: each slot's value is replaced whole."""

    def __init__(self, slots):
        self.busy = dict.fromkeys(slots)   # slot -> (call, device, pci_bus, started_m, wait_s)
        self.answered = dict.fromkeys(slots, time.monotonic())  # slot -> its last answer

    def begin(self, slot, call, device=None, bus=None, wait_s=0.0):
        """The slot's call starts now: returns when (monotonic)."""
        started_m = time.monotonic()
        self.busy[slot] = (call, device, bus, started_m, wait_s)
        return started_m

    def end(self, slot, answered=True):
        """The slot's call returned; answered: it answered (not a timeout of its own)."""
        self.busy[slot] = None
        if answered:
            self.answered[slot] = time.monotonic()

    def run(self, slot, fn, *args, call, device=None, bus=None, wait_s=0.0):
        """fn(*args), busy meanwhile; what it raises is the caller's."""
        self.begin(slot, call, device, bus, wait_s)
        try:
            return fn(*args)
        finally:
            self.end(slot)

    def late(self, now_m, deadline_s):
        """[((call, device, pci_bus, started_m), the slot's last answer)] of the calls in flight
        deadline_s past their own wait at now_m."""
        return [(busy[:4], self.answered[slot]) for slot, busy in list(self.busy.items())
                if busy is not None and now_m - busy[3] > busy[4] + deadline_s]


def stall_ages(now_m, started_m, answered_m):
    """(age_s, age_err_s) of a stall: it began when the call did, and may have begun as early
    as the last answer before it."""
    return (round(max(0.0, now_m - started_m), 3),
            round(min(AGE_MAX_S, max(0.0, started_m - min(answered_m, started_m))), 3))
