"""Runs the preflight_checks module in the controller's own process.

The decision is pure computation over what the hosts reported; starting a Python process for
it, as a module on localhost would, cost a second per run. The logic itself lives once, in
module_utils/torchfleet/preflight.py, which library/preflight_checks.py also calls.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _torchfleet import InProcessAction  # noqa: E402  (also puts module_utils on the path)
from ansible.module_utils.torchfleet.preflight import ARGUMENT_SPEC, decide  # noqa: E402


class ActionModule(InProcessAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC
    decide = staticmethod(decide)
