"""Stopping torchfleet's runs on one host by their recorded PIDs: the torchrun_stop module's
work, and the first step of rank_results when the play stops and gathers a host in one call."""
from __future__ import annotations

import glob
import os
import re
import subprocess
import time

from ansible_collections.torchfleet.fleet.plugins.module_utils.run import container
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.procs import run_processes, stop_run
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import ATTEMPT_GLOB, GUARDED, PIDFILE, RUN_ID, read_json

# Ansible's job ids: "j" + digits + "." + PID; never a path.
JID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def argument_error(p):
    """One sentence for the first argument that could reach beyond this run, or None. Checked
    before anything is signalled: a pattern or a path here would widen what is stopped."""
    if p["run_id"] is not None and not RUN_ID.match(p["run_id"]):
        return ("run_id %r is not a torchfleet run id (letters, digits, '.', '_', '-'); nothing "
                "was stopped" % p["run_id"])
    if p["host_dir"] is not None and (p["host_dir"] in ("", ".", "..") or "/" in p["host_dir"]):
        return ("host_dir %r is not an inventory host's directory name; nothing was stopped"
                % p["host_dir"])
    if p["grace_s"] < 0:
        return "grace_s must be 0 or more seconds, not %s; nothing was stopped" % p["grace_s"]
    if p["async_jid"] and not JID.match(p["async_jid"]):
        return ("async_jid %r is not an Ansible async job id (like j123456789.4242); nothing "
                "was stopped" % p["async_jid"])
    return None


def remove_async_record(path, wait_s=5.0):
    """Remove the async wrapper's record once it holds the job's final result: the wrapper
    rewrites it when torchrun_job returns, which is just after torchrun ended or was stopped."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        record = read_json(path)
        if record is None and not os.path.exists(path):
            return None
        if record is not None and record.get("finished") is not False:
            break
        time.sleep(0.1)
    try:
        os.unlink(path)
    except FileNotFoundError:
        return None
    return path


def remove_container(box, timeout_s=30.0):
    """Remove the run's container a PIDFILE record names ({"runtime", "name"}, the agent's
    Box) by that name: its name when one was removed, else None (none, or gone already)."""
    if not isinstance(box, dict) or not str(box.get("name", "")).startswith(
            container.NAME_PREFIX):
        return None
    argv = container.remove_argv(box.get("runtime"), box["name"])
    if argv is None:
        return None
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    # podman and docker print the name of what they removed; nothing (or an error) when gone.
    return box["name"] if done.returncode == 0 and done.stdout.strip() else None


def stop_checked(module, p):
    """What both modules do with rundir.STOP_SPEC's arguments p: fail the module naming the first
    argument that could reach beyond the run (before anything is signalled), else stop_runs;
    returns stop_runs' answer with `changed`."""
    error = argument_error(p)
    if error:
        module.fail_json(msg=error)
    done = stop_runs(p, module.check_mode)
    return dict(done, changed=bool(done["stopped"]) or bool(done["async_removed"]))


def stop_runs(p, check_mode=False):
    """Stop what p (rundir.STOP_SPEC's arguments, checked by argument_error) names; returns
    {"stopped": [one entry per run that had live processes], "async_removed": path or None,
    "guarded": [the GUARDED markers of guard tables still up]}.
    In check mode it only lists."""
    host_dir = os.path.join(glob.escape(p["runs_root"]), p["run_id"] or "*",
                            glob.escape(p["host_dir"]) if p["host_dir"] else "*")
    # A restarted run's later attempts keep their directories inside the host's (ATTEMPT_GLOB).
    pidfiles = glob.glob(os.path.join(host_dir, PIDFILE)) + glob.glob(
        os.path.join(host_dir, ATTEMPT_GLOB, PIDFILE))
    stopped = []
    for pidfile in sorted(pidfiles):
        record = read_json(pidfile)
        if not record:
            continue
        live = run_processes(record["run_id"], record["pid"], record.get("host"))
        removed = None
        if not check_mode and live:
            done = stop_run(record["run_id"], record["pid"], p["grace_s"], record.get("host"))
        if not check_mode:  # (a container left by a killed agent has no live process here)
            removed = remove_container(record.get("container"))
        if not live and not removed:
            continue
        entry = {"run_id": record["run_id"], "pid": record["pid"], "processes": live}
        if not check_mode and live:
            entry.update(done)
        if removed:
            entry["container"] = removed
        stopped.append(entry)
    removed = None
    if p["async_jid"] and not check_mode:
        removed = remove_async_record(os.path.join(p["async_dir"], p["async_jid"]))
    # Guard tables an agent could not remove itself (killed, or no root): stop.yml removes them.
    guarded = sorted(glob.glob(os.path.join(host_dir, GUARDED)) + glob.glob(
        os.path.join(host_dir, ATTEMPT_GLOB, GUARDED)))
    return {"stopped": stopped, "async_removed": removed, "guarded": guarded}
