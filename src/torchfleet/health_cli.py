"""`torchfleet health --from DIR`: the node health verdicts of one host's saved outputs, the
same parsers and rules preflight runs on a live host (plugins/module_utils/host/health.py)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.host import health
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import health_checks
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.records import ERROR as SEVERE
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.records import WARNING, check
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.table import render

USAGE = ("Files read from DIR (each optional; what is absent is not checked):\n"
         + health.bundle_help())


def read_bundle(directory: str) -> dict[str, str]:
    """{bundle name: text} of the files DIR holds; ValueError when DIR has none of them."""
    root = Path(directory)
    if not root.is_dir():
        raise ValueError("%s is not a directory" % directory)
    files = {}
    for name in health.FILES:
        path = root / name
        if path.is_file():
            with open(path, "rb") as f:
                files[name] = f.read(health.MAX_FILE).decode("utf-8", errors="replace")
    if not files:
        raise ValueError("%s holds none of the files torchfleet reads (%s)"
                         % (directory, ", ".join(health.FILES)))
    return files


def health_view(directory: str, host: str = "", window_s: int | None = None,
                limits: dict[str, Any] | None = None) -> dict[str, Any]:
    files, problems = health.bundle_problems(read_bundle(directory))
    if window_s is None:
        window_s = defaults.default("health_xid_window_s")
    limits = health_checks.limits(limits)
    name = host or Path(directory).resolve().name
    # A saved log has no "now": the window ends at the log's own last line.
    facts = health.facts(files, window_s)
    records = [check("input.bundle", name, False, p["detail"], BUNDLE_HINT[p["kind"]] % (
        p["name"], dict(health.BUNDLE)[p["name"]]), severity=WARNING) for p in problems]
    records += health_checks.checks(name, facts, limits)
    return {"host": name, "dir": str(directory), "files": sorted(files), "facts": facts,
            "checks": records, "incomplete": [p["name"] for p in problems],
            "ok": not any(not c["ok"] and c["severity"] == SEVERE for c in records)}


BUNDLE_HINT = {"foreign": "save %s on the host again as the whole output of %s",
               "partial": "save %s as the whole output of %s for a full verdict"}


def exit_status(view: dict[str, Any]) -> int:
    """1 when a check fails, else 2 when a file was partial or not its command's output (no
    verdict is 'ok' over a file it could not read), else 0."""
    return 1 if not view["ok"] else 2 if view["incomplete"] else 0


def health_text(view: dict[str, Any]) -> str:
    rows = [(c["host"], c["id"], "ok" if c["ok"] else "FAIL" if c["severity"] == SEVERE
             else "WARN", c["detail"], c["hint"]) for c in view["checks"]]
    lines = ["%s: read %s" % (view["dir"], ", ".join(view["files"]))]
    if rows:
        lines.append(render(("HOST", "CHECK", "VERDICT", "DETAIL", "FIX"), rows, max_width=60))
    else:
        lines.append("no GPU and no host fact to check in these files")
    failed = [c for c in view["checks"] if not c["ok"] and c["severity"] == SEVERE]
    if failed:
        lines.append("health failed: %s" % "; ".join("%s %s" % (c["id"], c["detail"])
                                                     for c in failed[:3]))
    elif view["incomplete"]:
        lines.append("health incomplete: %s could not be read as saved; nothing else would "
                     "break a run" % ", ".join(view["incomplete"]))
    else:
        lines.append("health ok: nothing that would break a run")
    return "\n".join(lines)


def as_json(view: dict[str, Any]) -> str:
    return json.dumps({k: view[k] for k in ("host", "dir", "files", "ok", "checks")}, indent=2)
