"""Runs the preflight_checks module in the controller's own process.

The decision is pure computation over what the hosts reported; starting a Python process for
it, as a module on localhost would, cost a second per run. The logic itself lives once, in
module_utils/torchfleet/preflight.py, which library/preflight_checks.py also calls.
"""
from __future__ import annotations

import os
import sys

from ansible.plugins.action import ActionBase

sys.path.insert(0, os.path.dirname(__file__))
import _torchfleet  # noqa: E402,F401  (module_utils on the import path)
from ansible.module_utils.torchfleet.preflight import ARGUMENT_SPEC, decide  # noqa: E402


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _, params = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        try:
            result.update(decide(params))
        except ValueError as exc:
            result.update(failed=True, msg=str(exc))
        result["changed"] = False
        return result
