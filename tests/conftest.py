"""Make the project's Ansible modules and module_utils importable the way AnsiballZ does."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import ansible.module_utils

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"

if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
if str(ROOT / "library") not in sys.path:
    sys.path.insert(0, str(ROOT / "library"))


def processes_matching(marker):
    """'PID command line' of every live process whose command line contains marker.

    Read from /proc, not ps, whose output is cut to the terminal width in some environments.
    """
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                line = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:
            continue
        if line and marker in line and int(pid) != os.getpid():
            found.append("%s %s" % (pid, line))
    return found
