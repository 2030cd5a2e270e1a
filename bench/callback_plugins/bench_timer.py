"""Writes each task's wall time to $BENCH_TIMINGS (JSON lines); used only by bench/."""
from __future__ import annotations

import json
import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: bench_timer
type: aggregate
short_description: per-task wall time for torchfleet's benchmarks
description: Appends one JSON line per task (name, seconds) to the file named by BENCH_TIMINGS,
  and one per play (play, at) with its start on the monotonic clock, and the playbook's end (end).
requirements: [BENCH_TIMINGS set in the environment]
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "bench_timer"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._task, self._start = None, None

    @staticmethod
    def _write(line):
        path = os.environ.get("BENCH_TIMINGS")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(line) + "\n")

    def _flush(self):
        if self._task:
            self._write({"task": self._task, "seconds": time.monotonic() - self._start})

    def v2_playbook_on_play_start(self, play):
        self._flush()
        self._task = None
        self._write({"play": play.get_name(), "at": time.monotonic()})

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._flush()
        self._task, self._start = task.get_name(), time.monotonic()

    def v2_playbook_on_stats(self, stats):
        self._flush()
        self._task = None
        self._write({"end": time.monotonic()})
