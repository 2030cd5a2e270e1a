"""Shared by the controller-side action plugins: this project's module_utils made importable
in the controller's process (as they are inside a module's AnsiballZ), and the base class of
the plugins that run a module's logic in-process instead of starting Python for it."""
from __future__ import annotations

from pathlib import Path

import ansible.module_utils
from ansible.plugins.action import ActionBase

MODULE_UTILS = str(Path(__file__).resolve().parents[1] / "module_utils")


def module_utils_importable():
    """Make `ansible.module_utils.torchfleet` importable here (idempotent)."""
    if MODULE_UTILS not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(MODULE_UTILS)


module_utils_importable()


class InProcessAction(ActionBase):
    """Validates the task's arguments against ARGUMENT_SPEC and returns decide(params);
    a ValueError from decide is the user's mistake and becomes a failed task."""

    TRANSFERS_FILES = False
    _requires_connection = False
    ARGUMENT_SPEC: dict = {}

    @staticmethod
    def decide(params):
        raise NotImplementedError

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        checked, params = self.validate_argument_spec(argument_spec=self.ARGUMENT_SPEC)
        if (task_vars or {}).get("ansible_check_mode") and "runs_root" in params:
            params = dict(params, runs_root="")  # no runs/latest link, no pruning
        try:
            result.update(self.decide(params))
        except ValueError as exc:
            result.update(failed=True, msg=str(exc))
        result["changed"] = False
        return result
