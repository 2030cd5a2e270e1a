"""Runs the run_record module in the controller's own process: the record of a detached run
and the attach lock live on the controller (plugins/module_utils/detach.py holds the logic)."""
from __future__ import annotations

from ansible_collections.torchfleet.fleet.plugins.plugin_utils.in_process import InProcessAction
from ansible_collections.torchfleet.fleet.plugins.module_utils.detach import ARGUMENT_SPEC, decide


class ActionModule(InProcessAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC
    decide = staticmethod(decide)
