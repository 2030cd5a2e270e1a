"""torchfleet: preflight, launch and watch multi-node torchrun jobs with Ansible."""
from __future__ import annotations

__version__ = "0.1.0"
