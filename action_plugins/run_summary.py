"""Runs the run_summary module in the controller's own process (no Python start per run);
the logic lives once, in module_utils/torchfleet/summary.py."""
from __future__ import annotations

import os
import sys

from ansible.plugins.action import ActionBase

sys.path.insert(0, os.path.dirname(__file__))
import _torchfleet  # noqa: E402,F401  (module_utils on the import path)
from ansible.module_utils.torchfleet.summary import ARGUMENT_SPEC, decide  # noqa: E402


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _, params = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        result.update(decide(params))
        result["changed"] = False
        return result
