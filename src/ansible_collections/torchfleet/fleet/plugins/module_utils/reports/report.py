"""Run directories on the controller: one JSON report per playbook and runs/latest."""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile

from ansible_collections.torchfleet.fleet.plugins.module_utils.run import detach

RUN_ID_RE = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{4}$")


def verdict(kind, checks, first_failure=None, attempts=()):
    """How a preflight or a run ended, in one sentence, rendered here only: the play's failure
    message, the last line of its table, `verdict` in its JSON, the API's Result.verdict, the
    CLI and the HTML report all show this sentence. attempts: with max_restarts, each attempt's
    `restart` (why the next one was started, restart.py's words) and `not_restarted` (why not),
    in order."""
    restarts = [a["restart"] for a in attempts if a["restart"]]
    not_restarted = attempts[-1]["not_restarted"] if attempts else ""
    sentence = _verdict(kind, checks, first_failure)
    if not_restarted and not sentence.startswith(kind + " ok"):
        sentence += "; " + not_restarted
    if not restarts:
        return sentence
    after = "after %d restart%s" % (len(restarts), "" if len(restarts) == 1 else "s")
    if sentence.startswith(kind + " ok"):
        return "%s ok %s: %s" % (kind, after, "; ".join(restarts))
    return "%s failed %s (%s)%s" % (kind, after, "; ".join(restarts),
                                    sentence[len(kind + " failed"):])


def _verdict(kind, checks, first_failure):
    failures = [c for c in checks if not c["ok"] and c.get("severity", "error") == "error"]
    if first_failure:  # the master's record judged it (runstate.py); rendered, not re-judged
        host, rank = first_failure.get("host"), first_failure.get("rank")
        if not host or first_failure.get("names_host"):
            # a failure of the run as a whole (a hang, the job's limit, the lease), or words
            # that name the host themselves (a hardware event, the OOM killer)
            return "%s failed: %s" % (kind, first_failure["reason"])
        return "%s failed: first failure on %s%s: %s" % (
            kind, host, "" if rank is None else ", rank %d" % rank, first_failure["reason"])
    if failures:
        hosts = list(dict.fromkeys(c["host"] for c in failures))
        ids = list(dict.fromkeys(c["id"] for c in failures))
        return "%s failed: %d problem(s) on %s (%s)" % (kind, len(failures), ", ".join(hosts),
                                                        ", ".join(ids))
    # With spares, the candidates the run does not use carry a host.skipped record.
    unused = list(dict.fromkeys(c["host"] for c in checks if c["id"] == "host.skipped"))
    used = [c for c in checks if c["host"] not in unused]
    hosts = {c["host"] for c in used} - {"controller"}
    text = "%s ok: %d check(s) passed on %d host(s)" % (kind, len(used), len(hosts))
    if unused:
        # (Loaded on its own by the package too: no import of the other module_utils here.)
        text += ", %d candidate(s) not used (%s%s)" % (
            len(unused), ", ".join(unused[:4]),
            " and %d more" % (len(unused) - 4) if len(unused) > 4 else "")
    # A run that succeeded while the others waited for a straggler says so (run.straggler).
    slow = [c.get("detail") or "" for c in checks if c["id"] == "run.straggler" and not c["ok"]]
    if slow:
        text += "; warning: straggler %s" % "; straggler ".join(slow[:2])
    return text


def write_report(run_dir, name, data, runs_root=None):
    """Write run_dir/name atomically (0640, directory 0750); point runs_root/latest at run_dir.

    Returns the report's path. The rename makes a reader never see half a report. A directory
    that cannot be written is a ValueError of one sentence naming it, not a traceback.
    """
    try:
        return _write_report(run_dir, name, data, runs_root)
    except OSError as exc:
        raise ValueError("cannot write %s in %s (%s); pass -e run_dir= a directory you can "
                         "write" % (name, exc.filename or run_dir, exc.strerror or exc)) from None


# A run directory on the controller, from every entry point (playbooks, API, CLI): 0750, its
# reports 0640. Not 0700: a team that shares a controller shares results through the group;
# not readable by every user of the controller: the ranks' logs may hold what a script printed.
RUN_DIR_MODE, REPORT_MODE = 0o750, 0o640


def make_run_dir(run_dir, runs_root=None):
    """Create a run directory (RUN_DIR_MODE; OSError when it cannot be; a directory the user
    named that exists already keeps its mode) and, in a runs root, point runs_root/latest at
    it when the run starts here: runs/latest names the newest run started there, and a report
    written later (a detached run's, gathered after a newer run started) does not move it back."""
    started = not os.path.isdir(run_dir)
    os.makedirs(run_dir, mode=RUN_DIR_MODE, exist_ok=True)
    latest = os.path.join(runs_root, "latest") if runs_root else ""
    if latest and (started or not os.path.lexists(latest)):
        point_link(latest, run_dir)


def point_link(link, target):
    """Point the symlink `link` at `target` (relative, so the tree can move) in one rename: a
    reader sees the old target or the new one, never none."""
    tmp_link = link + ".tmp%d" % os.getpid()
    os.symlink(os.path.relpath(target, os.path.dirname(link)), tmp_link)
    os.replace(tmp_link, link)


def _write_report(run_dir, name, data, runs_root):
    make_run_dir(run_dir, runs_root)
    path = os.path.abspath(os.path.join(run_dir, name))
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix="." + name)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
        os.chmod(tmp, REPORT_MODE)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def prune_runs(runs_root, keep):
    """Remove all but the newest `keep` run directories under runs_root; returns removed names.

    Run ids start with a UTC timestamp, so their names sort by age; anything else under
    runs_root (latest, files of the user's) is left alone, and so is a detached run that was
    not gathered yet (its run.json without its report): attach needs its record.
    """
    runs = sorted(d for d in os.listdir(runs_root)
                  if RUN_ID_RE.match(d)
                  and os.path.isdir(os.path.join(runs_root, d))
                  and not os.path.islink(os.path.join(runs_root, d))
                  and not detach.waiting(os.path.join(runs_root, d)))
    removed = runs[:-keep] if keep > 0 else []
    for name in removed:
        shutil.rmtree(os.path.join(runs_root, name), ignore_errors=True)
    return removed
