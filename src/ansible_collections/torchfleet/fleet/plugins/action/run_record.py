"""Runs the run_record module in the controller's own process: the record of a detached run
and the attach lock live on the controller (plugins/module_utils/run/detach.py holds the logic).
While an attach follows a run another attach owns (state followed), the owner's progress is
shown here as the watch shows its own."""
from __future__ import annotations

import time

from ansible.utils.display import Display

from ansible_collections.torchfleet.fleet.plugins.action.torchrun_watch import controller_times, progress_text
from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.detach import ARGUMENT_SPEC, decide
from ansible_collections.torchfleet.fleet.plugins.plugin_utils.in_process import InProcessAction

display = Display()


class _Shown:
    """Shows a progress line at most every PROGRESS_EVERY_S, and every change of phase."""

    def __init__(self):
        self.at, self.phase = float("-inf"), None

    def __call__(self, line):
        now = time.monotonic()
        if now - self.at < defaults.PROGRESS_EVERY_S and line.get("phase") == self.phase:
            return
        try:
            text = progress_text(line)
        except (KeyError, TypeError, ValueError):  # not a line the watch wrote
            return
        self.at, self.phase = now, line.get("phase")
        display.display(text)


class ActionModule(InProcessAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC
    _times: dict = {}

    def run(self, tmp=None, task_vars=None):
        self._times = controller_times(task_vars or {})
        return super().run(tmp, task_vars)

    def decide(self, params):
        # A detached run's record keeps the controller's times of it (its first play, each
        # launch): the attach that gathers it reports its goodput from them (attach.yml).
        if params["state"] == "present" and self._times:
            params = dict(params, record=dict(params["record"], times={
                "started": self._times["started"], "launched": self._times["launched"]}))
        return decide(params, on_progress=_Shown())
