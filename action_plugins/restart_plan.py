"""Runs the restart_plan module in the controller's own process (module_utils/torchfleet/
restart.py holds the logic)."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _torchfleet import InProcessAction  # noqa: E402  (also puts module_utils on the path)
from ansible.module_utils.torchfleet.restart import ARGUMENT_SPEC, decide  # noqa: E402


class ActionModule(InProcessAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC
    decide = staticmethod(decide)
