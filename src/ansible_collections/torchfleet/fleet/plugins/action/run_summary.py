"""Runs the run_summary module in the controller's own process (no Python start per run);
the logic lives once, in plugins/module_utils/reports/summary.py."""
from __future__ import annotations

from ansible_collections.torchfleet.fleet.plugins.plugin_utils.in_process import InProcessAction
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.summary import ARGUMENT_SPEC, decide


class ActionModule(InProcessAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC
    decide = staticmethod(decide)
