"""Runs the preflight_checks module in the controller's own process.

The decision is pure computation over what the hosts reported; starting a Python process for
it, as a module on localhost would, cost a second per run. The logic itself lives once, in
module_utils/torchfleet/preflight.py, which library/preflight_checks.py also calls.
"""
from __future__ import annotations

from pathlib import Path

import ansible.module_utils
from ansible.plugins.action import ActionBase

# Make this project's module_utils importable here as it is inside a module's AnsiballZ.
_MODULE_UTILS = str(Path(__file__).resolve().parents[1] / "module_utils")
if _MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(_MODULE_UTILS)

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
