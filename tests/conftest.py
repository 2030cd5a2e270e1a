"""Make the project's Ansible modules and module_utils importable the way AnsiballZ does."""
from __future__ import annotations

import sys
from pathlib import Path

import ansible.module_utils

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"

if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
if str(ROOT / "library") not in sys.path:
    sys.path.insert(0, str(ROOT / "library"))
