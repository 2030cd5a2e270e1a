"""Runs the run_summary module in the controller's own process (no Python start per run);
the logic lives once, in module_utils/torchfleet/summary.py."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _torchfleet import InProcessAction  # noqa: E402  (also puts module_utils on the path)
from ansible.module_utils.torchfleet.summary import ARGUMENT_SPEC, decide  # noqa: E402


class ActionModule(InProcessAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC
    decide = staticmethod(decide)
