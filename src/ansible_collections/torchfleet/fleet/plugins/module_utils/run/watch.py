"""One look at a run, on its master: the run's state as the master's agent keeps it.

Used two ways: by the torchrun_watch module, and as a plain script the watcher's action plugin
pipes to the master's Python for each look (a bare interpreter start instead of an AnsiballZ
module's). Hence only the standard library and the sibling files below.

A look renews the master's lease (the controller is still there; the first look makes it: the
lease counts from there), hands the master's store the hosts whose start task failed (the
store names them, with Ansible's reason, as the run's failures), waits on the host up to
wait_s for the run's phase to change, and answers the run's summary: the same few fields at
any number of hosts. It answers the whole record with full, and once the record is final (the
end, once: the watcher needs no further look to take it). With stop, it asks the master's
store to stop the run now (the controller is ending) and renews nothing. With detach, it tells
the master's store that the run is detached: no controller holds its lease from then on.
"""
from __future__ import annotations

import os
import time

from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import (
    CONTROL, DETACHED, LEASE, START_FAILED, STOP_REQUEST, read_json, write_json)
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.runstate import summary
from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults

POLL_S = 0.2

DEFAULTS = {"touch_lease": True, "async_jid": None, "async_dir": "~/.ansible_async",
            "wait_s": 0.0, "full": False, "start_failed": {}, "stop": "", "detach": False}

# The torchrun_watch module's arguments; the action plugin validates these and its own.
ARGUMENT_SPEC = dict(
    run_dir=dict(type="path", required=True),
    run_id=dict(type="str", required=True),
    touch_lease=dict(type="bool", default=DEFAULTS["touch_lease"]),
    async_jid=dict(type="str"),
    async_dir=dict(type="path", default=DEFAULTS["async_dir"]),
    wait_s=dict(type="float", default=DEFAULTS["wait_s"]),
    full=dict(type="bool", default=DEFAULTS["full"]),
    start_failed=dict(type="dict", default={}),
    stop=dict(type="str", default=DEFAULTS["stop"]),
    detach=dict(type="bool", default=DEFAULTS["detach"]),
)
# How the action plugin follows the run: attached (to its end; its controller's end stops the
# run), detach (until every rank runs, then the run is detached), detached (a detached run,
# to its end, without a lease: the watch's end leaves the run running), or look (one look at
# the whole record, renewing nothing: status).
MODES = ("attached", "detach", "detached", "look")
ACTION_SPEC = dict(
    ARGUMENT_SPEC,
    python=dict(type="str"),
    starts=dict(type="dict", default={}),
    nproc_per_node=dict(type="int", default=1),
    lost_after_s=dict(type="float", default=defaults.default("lost_after_s")),
    lease_s=dict(type="float", default=defaults.default("lease_s")),
    poll_s=dict(type="float", default=defaults.POLL_S),
    progress_every_s=dict(type="float", default=defaults.PROGRESS_EVERY_S),
    settle_s=dict(type="float"),  # unset: defaults.watch_settle_s(lost_after_s)
    progress_file=dict(type="path"),
    state_file=dict(type="path"),
    mode=dict(type="str", choices=list(MODES), default=MODES[0]),
    stop_now=dict(type="str", default=""),
    attempt=dict(type="int", default=0),
)


def touch_lease(run_dir):
    if os.path.isdir(run_dir):
        lease = os.path.join(run_dir, LEASE)
        with open(lease, "a"):
            pass
        os.utime(lease)


def _read(p):
    """(record, async job record)."""
    record = read_json(os.path.join(p["run_dir"], CONTROL))
    job = read_json(os.path.join(p["async_dir"], p["async_jid"])) if p["async_jid"] else None
    return record, job


def look(params):
    """The torchrun_watch module's answer (see its RETURN) for these parameters."""
    p = dict(DEFAULTS, **{k: v for k, v in params.items() if v is not None})
    p["run_dir"] = os.path.expanduser(p["run_dir"])
    p["async_dir"] = os.path.expanduser(p["async_dir"])
    if p["stop"] and os.path.isdir(p["run_dir"]):
        # The controller is ending (its ansible-playbook is gone): the master stops the run
        # now instead of at the end of its lease.
        write_json(os.path.join(p["run_dir"], STOP_REQUEST), {"why": str(p["stop"])[:300]})
        p["touch_lease"] = False
    if p["detach"] and os.path.isdir(p["run_dir"]):
        write_json(os.path.join(p["run_dir"], DETACHED), {"at": time.time()})
    if p["touch_lease"]:
        touch_lease(p["run_dir"])
    start_failed = os.path.join(p["run_dir"], START_FAILED)
    if p["start_failed"] and os.path.isdir(p["run_dir"]) and not os.path.exists(start_failed):
        write_json(start_failed, {str(h): str(why)[:1000] for h, why in
                                  p["start_failed"].items()})
    deadline = time.monotonic() + float(p["wait_s"])
    record, job = _read(p)
    seen = (record or {}).get("phase"), (record or {}).get("final")
    # A final record will not change again: nothing to wait for.
    while (time.monotonic() < deadline and not (job or {}).get("failed")
           and not (record or {}).get("final")):
        time.sleep(POLL_S)
        record, job = _read(p)
        if ((record or {}).get("phase"), (record or {}).get("final")) != seen:
            break
    if p["touch_lease"] and p["wait_s"]:
        touch_lease(p["run_dir"])
    result = dict(changed=False, state="pending", msg="", summary=None, record=None,
                  missing=not os.path.isdir(p["run_dir"]), now=time.time())
    if record is not None:
        result.update(state="final" if record["final"] else record["phase"],
                      summary=summary(record, time.time()),
                      record=record if p["full"] or record["final"] else None)
    if job and job.get("failed") and not (record or {}).get("final"):
        # The master's agent failed: before it kept any state (its script is missing, its
        # control port is taken, ...), or on its way (killed, out of memory, crashed): then
        # its last record comes along, for the controller to judge the master lost.
        result.update(state="start_failed" if record is None else "master_died",
                      msg=str(job.get("msg", "the job failed"))[:1000], record=record)
    return result
