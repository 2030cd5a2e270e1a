"""A check record and the cross-host comparison every check shares: the most common value is
the reference (ties go to the master), so a report names the odd host out.
"""
from __future__ import annotations

from collections import Counter

from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.checks import IDS

ERROR, WARNING, INFO = "error", "warning", "info"
CONTROLLER = "controller"  # the host of checks about the run as a whole


def check(cid, host, ok, detail="", hint="", severity=ERROR, gpu=None):
    """One verdict; `gpu`: the GPU index a health check is about (None for the host's)."""
    if cid not in IDS:  # a programming error: every id is documented in checks.REGISTRY
        raise ValueError("check id %r is not in plugins/module_utils/reports/checks.py" % cid)
    return {"id": cid, "host": host, "ok": bool(ok), "severity": severity if not ok else INFO,
            "detail": detail, "hint": "" if ok else hint, "gpu": gpu}


def failed(checks):
    """The failed checks of severity error: the ones that stop a run."""
    return [c for c in checks if not c["ok"] and c["severity"] == ERROR]


def reference(values, master):
    """The value most hosts share; ties are broken by the master's value."""
    counts = Counter(values.values())
    top = max(counts.values())
    tied = [v for v, n in counts.items() if n == top]
    return values[master] if values.get(master) in tied else tied[0]


def outliers(values, master):
    """(reference value, {host: value}) for hosts whose value differs from the reference."""
    ref = reference(values, master)
    return ref, {h: v for h, v in values.items() if v != ref}


def fmt_hosts(hosts, limit=4):
    hosts = list(hosts)
    shown = ", ".join(hosts[:limit])
    return shown + (" and %d more" % (len(hosts) - limit) if len(hosts) > limit else "")
