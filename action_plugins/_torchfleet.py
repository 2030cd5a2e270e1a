"""Makes this project's module_utils importable in the controller process, as they are
inside a module's AnsiballZ; the action plugins import their shared logic through it."""
from __future__ import annotations

from pathlib import Path

import ansible.module_utils

MODULE_UTILS = str(Path(__file__).resolve().parents[1] / "module_utils")
if MODULE_UTILS not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(MODULE_UTILS)
