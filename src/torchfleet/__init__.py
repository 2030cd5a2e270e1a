"""torchfleet: preflight, launch and watch multi-node torchrun jobs with Ansible.

The Python API runs the package's own playbooks through ansible-runner:
torchfleet.preflight(), .collective(), .train(), .attach(), .stop() return a typed Result;
.status(), .logs() and .runs() read a run by its id.
"""
from __future__ import annotations

__version__ = "0.1.0"

from torchfleet.api import attach, collective, logs, preflight, runs, status, stop, train  # noqa: E402
from torchfleet.results import (  # noqa: E402
    Attempt, BusbwRow, Check, Collective, Failure, Host, Rank, Result, Straggler, load)
from torchfleet.runner import Event  # noqa: E402

__all__ = ["preflight", "collective", "train", "attach", "status", "logs", "runs", "stop", "load", "Result", "Check", "Host", "Rank",
           "BusbwRow", "Failure", "Collective", "Straggler", "Attempt", "Event", "__version__"]
