"""Runs the preflight_checks module in the controller's own process.

The decision is pure computation over what the hosts reported; starting a Python process for
it, as a module on localhost would, cost a second per run. The logic itself lives once, in
plugins/module_utils/reports/preflight.py, which library/preflight_checks.py also calls.
"""
from __future__ import annotations

from ansible_collections.torchfleet.fleet.plugins.plugin_utils.in_process import InProcessAction
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.preflight import ARGUMENT_SPEC, decide


class ActionModule(InProcessAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC
    decide = staticmethod(decide)
