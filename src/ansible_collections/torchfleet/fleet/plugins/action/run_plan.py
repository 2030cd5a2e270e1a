"""Runs the run_plan module in the controller's own process: it decides from variables alone,
before any host is touched (plugins/module_utils/run/plan.py holds the logic)."""
from __future__ import annotations

from ansible_collections.torchfleet.fleet.plugins.plugin_utils.in_process import InProcessAction
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.plan import ARGUMENT_SPEC, decide


class ActionModule(InProcessAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC
    decide = staticmethod(decide)
