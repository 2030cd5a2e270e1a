"""The base class of the action plugins that run a module's logic in the controller's own
process instead of starting Python for it (the module's logic lives once, in module_utils)."""
from __future__ import annotations

from ansible.plugins.action import ActionBase


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
