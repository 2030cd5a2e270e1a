"""Whether a failed attempt is started again (`max_restarts`), on which hosts, and why: the
one place that decides it. How the attempt ended is not decided here: the master's record
(runstate.py) judged that; this reads its first failure and the re-check's choice.

A restart answers a failure a host explains: a host lost during the run, whose start failed,
that the gather could not reach, that had a fatal hardware event or that stayed a straggler
(straggler_action=restart) (left out of every later attempt, whatever the first failure names), a rank that never joined the collective the
others died in (its host stays a candidate unless its re-check fails), or a rank's death on a
host that then fails its re-check.
A failure no host explains (a rank's error on a host that passes its re-check, a hang, the
job's time limit, the OOM killer ending a rank: the workload's memory, not the host's) is not
retried unless restart_on=any. Two steps, with the playbook's re-check
(preflight's probe and port test of the remaining candidates) between them:

    after_attempt(...)   -> {"recheck", "hosts", "probe", "exclude", "suspect", "cause", "why"}
    after_recheck(...)   -> {"restart", "hosts", "replaced", "why"}

The re-check probes again only what the failure could have changed (`probe`): after a host
lost or never started, with every other host of the attempt stopped by its own agent and the
same master, that is the master (its port) and the candidates the attempt did not use; the
others keep their last probe. Any other failure re-probes every remaining candidate.
"""
from __future__ import annotations

from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import read_json
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.runstate import (
    CONTROLLER_LOST, EXITED, FAILED, HARDWARE, LOST, NOT_STARTED, OOM, STOPPED, STOPPED_BY_USER,
    STRAGGLER, SUCCEEDED)
from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults

RESTART_ON = ("host", "any")
# playbooks/attempt.yml is imported once per attempt: this many restarts at most.
MAX_RESTARTS = 5
# The words a failure's reason has in the verdict ("node2 host.lost, replaced by node4").
CAUSE_ID = {LOST: "host.lost", NOT_STARTED: "host.not_started", FAILED: "run.exit",
            HARDWARE: "run.hardware", OOM: "run.oom", STRAGGLER: "run.straggler"}


def _text(failure, key):
    """A failure's field when it is a string, else None: the record came from the master's host
    and is read as outside input (its shape is checked, never assumed)."""
    value = failure.get(key) if isinstance(failure, dict) else None
    return value if isinstance(value, str) else None


def _left_out(record, unreachable):
    """{host: why} of the hosts no later attempt may use: lost or never started (the record's
    own failures of theirs, not consequences), with a fatal hardware event (even one after the
    first failure), a straggler that ended the attempt, or unreachable when the attempt was stopped and gathered."""
    out = {}
    for f in record.get("failures") if isinstance(record.get("failures"), list) else []:
        host, reason = _text(f, "host"), _text(f, "reason")
        if host and (reason in (LOST, NOT_STARTED) and not f.get("consequence")
                     or reason in (HARDWARE, STRAGGLER)):
            out.setdefault(host, CAUSE_ID[reason])
    for host in unreachable:
        out.setdefault(host, "host.unreachable")
    return out


def _probe_only(record, failure, left_out, hosts, remaining, probed):
    """The candidates a restart must probe again when the failure could have changed only the
    hosts it left out, else None (every remaining candidate is probed again). Only after a host
    lost or never started (host.lost, host.not_started, or unreachable at the gather) whose every
    other failure in the record is a consequence of it, with every other host of the attempt
    stopped by its own agent (its ranks ended, as the record says) and the same master: then the
    master (its port is tested again: its listener, the others' connections) and the candidates
    the attempt did not use (the spares that may replace the lost) are probed; the attempt's
    other hosts keep their last probe, when the controller holds one (`probed`: attach.yml's
    restart of a detached run holds none). run.exit, run.oom, run.hardware, run.straggler, a hang
    and a lost master re-probe every candidate."""
    if _text(failure, "reason") not in (LOST, NOT_STARTED) or failure.get("stalled"):
        return None
    if any(why not in (CAUSE_ID[LOST], CAUSE_ID[NOT_STARTED], "host.unreachable")
           for why in left_out.values()):
        return None
    failures = record.get("failures")
    for f in failures if isinstance(failures, list) else [None]:
        if not isinstance(f, dict) or not (_text(f, "reason") in (LOST, NOT_STARTED)
                                           or f.get("consequence") is True):
            return None
    if not hosts or not remaining or remaining[0] != hosts[0] or hosts[0] in left_out:
        return None  # a new master: every host's port test is against it
    rows = record.get("hosts")
    states = {_text(r, "host"): _text(r, "state") for r in rows if isinstance(r, dict)} \
        if isinstance(rows, list) else {}
    if any(states.get(h) not in (EXITED, STOPPED) or h not in probed
           for h in hosts if h not in left_out and h != hosts[0]):
        return None
    return [h for h in remaining if h == hosts[0] or h not in hosts]


def after_attempt(record, attempt, max_restarts, restart_on, candidates, hosts, excluded=(),
                  unreachable=(), probed=(), observe=False):
    """After attempt `attempt` (0 first) ended with `record`: re-check for a restart or not.

    candidates: preflight's candidates in inventory order; hosts: the attempt's (as many as the
    run needs); excluded: hosts earlier attempts left out; probed: the candidates whose last
    probe the controller holds. Returns recheck (bool), hosts (the candidates to re-check),
    probe (those of them to probe again: _probe_only), exclude (every host left out so far),
    suspect (a host whose rank failed: the re-check decides), cause (the failure answered) and
    why (a sentence when there is no re-check and restarts were asked)."""
    record = record if isinstance(record, dict) else None
    failure = (record or {}).get("failure")
    failure = failure if isinstance(failure, dict) else None
    out = {"recheck": False, "hosts": [], "probe": [], "exclude": list(excluded), "left_out": {},
           "suspect": None, "cause": None, "why": ""}
    if not record or record.get("phase") == SUCCEEDED or not failure:
        return out
    if attempt >= max_restarts:
        if max_restarts:
            out["why"] = "not restarted: max_restarts=%d used" % max_restarts
        return out
    host, reason = _text(failure, "host"), _text(failure, "reason")
    out["cause"] = {"host": host, "reason": reason,
                    "id": "run.hang" if failure.get("stalled") else CAUSE_ID.get(
                        reason, "run." + str(reason))}
    if reason == CONTROLLER_LOST:
        out["why"] = "not restarted: the controller lost the run"
        return out
    if reason == STOPPED_BY_USER:
        out["why"] = "not restarted: the run was stopped by the user"
        return out
    if reason == OOM and restart_on != "any":
        out["why"] = ("not restarted: the kernel's OOM killer ended a rank on %s, the workload's "
                      "memory rather than the host's (restart_on=any restarts it)" % host)
        return out
    # Everything the attempt found counts: a host lost or never started (a failure of the
    # record beside the first) or unreachable at the gather explains the failure, whatever
    # the first failure names (a peer's error can be judged before a cut host is).
    left_out = _left_out(record, unreachable)
    if host is None and not left_out and restart_on != "any":
        out["why"] = ("not restarted: no host explains a run that ended %s (restart_on=any "
                      "restarts it)" % reason)
        return out
    exclude = list(dict.fromkeys(list(excluded) + list(left_out)))
    # A rank that never joined the collective the others died in explains the failure: its
    # host is re-checked like every candidate, not suspected.
    if reason == FAILED and host not in exclude and not left_out and not failure.get("stalled"):
        out["suspect"] = host
    remaining = [h for h in candidates if h not in exclude]
    out.update(exclude=exclude, left_out=left_out)
    if len(remaining) < len(hosts):
        out["why"] = ("not restarted: %d candidate(s) remain without %s and the run needs %d "
                      "(add spares: -e spares=K)"
                      % (len(remaining), ", ".join(exclude), len(hosts)))
        return out
    if observe:  # actions=observe: what a restart would have been, said; nothing restarts
        out["why"] = ("not restarted: actions=observe (would have re-checked %d candidate(s) "
                      "for a restart%s)" % (len(remaining), " without %s" % ", ".join(exclude)
                                            if exclude else ""))
        out["would"] = True
        return out
    probe = _probe_only(record, failure, left_out, hosts, remaining, probed)
    out.update(recheck=True, hosts=remaining, probe=remaining if probe is None else probe)
    return out


def gather_later(record, hosts, lost):
    """The hosts of a failed attempt whose stop and gather may wait for the run's end
    (playbooks/report.yml gathers the attempt's left_behind; attempt.yml at once when no restart
    follows), off the restart's path: after a host lost (`lost`, the watch's), every other host
    whose agent stopped its torchrun and every rank (the record's state stopped: the agent swept
    torchrun's tree before it said so). The master (hosts[0]) only once the record is final:
    its agent closed the control port as it wrote it, and its torchrun (the store's port) is
    gone; the restart's re-check tests that port again on it. A host whose torchrun ended by
    itself, or the record says nothing of, is stopped and gathered now."""
    if not lost or not isinstance(record, dict) or not isinstance(record.get("hosts"), list):
        return []
    stopped = {r.get("host") for r in record["hosts"]
               if isinstance(r, dict) and r.get("state") == STOPPED}
    later = [h for h in hosts if h not in lost and h in stopped]
    return later if record.get("final") is True else [h for h in later if h != hosts[0]]


def after_recheck(plan, recheck, hosts, restart_on):
    """The decision once the re-check of plan["hosts"] is in (preflight_checks' answer):
    restart on the hosts it chose, or not, and why. hosts: the attempt's hosts in rank order."""
    cause = plan.get("cause") or {}
    no = {"restart": False, "hosts": [], "replaced": [], "why": ""}
    if not plan.get("recheck"):  # (observe's would-be restart carried to the audit)
        return dict(no, why=plan.get("why", ""), would=bool(plan.get("would")))
    skipped = (recheck.get("choice") or {}).get("skipped") or {}
    if recheck.get("retest"):
        first = plan["hosts"][0] if plan["hosts"] else "?"
        why = "not restarted: the re-check found %s, the next master, failing %s" % (
            first, ", ".join(skipped.get(first, [])) or "a check")
        return dict(no, why=why)
    if not recheck.get("ok"):
        why = "not restarted: the re-check failed (%s)" % (
            recheck.get("verdict") or "see its preflight.json")
        return dict(no, why=why)
    chosen = [n["host"] for n in recheck.get("nodes") or []]
    suspect = plan.get("suspect")
    if suspect and suspect in chosen and restart_on != "any":
        why = ("not restarted: %s passed its re-check, so no host explains the failure "
               "(restart_on=any restarts it)" % suspect)
        return dict(no, why=why)
    gone = [h for h in hosts if h not in chosen]
    new = [h for h in chosen if h not in hosts]
    left_out = plan.get("left_out") or {}
    replaced = [{"host": old, "by": by, "reason": left_out.get(old) or "failed its re-check (%s)"
                 % ", ".join(skipped.get(old) or ["a check"])}
                for old, by in zip(gone, new, strict=True)]
    words = ["%s %s, replaced by %s" % (r["host"], r["reason"], r["by"]) for r in replaced]
    if not words:  # the same hosts again
        words = ["%s %s, the same hosts again (%s)"
                 % (cause.get("host") or "the run", cause.get("id", "failed"),
                    "restart_on=any" if restart_on == "any" else "it passed its re-check")]
    return {"restart": True, "hosts": chosen, "replaced": replaced, "why": "; ".join(words)}


ARGUMENT_SPEC = dict(
    attempt=dict(type="int", required=True),
    max_restarts=dict(type="int", default=defaults.default("max_restarts")),
    restart_on=dict(type="str", default=defaults.default("restart_on"), choices=list(RESTART_ON)),
    state_file=dict(type="str", default=""),
    candidates=dict(type="list", elements="str", default=[]),
    excluded=dict(type="list", elements="str", default=[]),
    gathered=dict(type="dict", default={}),
    hosts=dict(type="list", elements="str", default=[]),
    probed=dict(type="list", elements="str", default=[]),
    actions=dict(type="str", default=defaults.default("actions"), choices=["enforce", "observe"]),
    plan=dict(type="dict"),
    recheck=dict(type="dict"),
)


def decide(params):
    """The restart_plan module: after_attempt, or with plan and recheck given after_recheck."""
    if params["plan"] is not None:
        return dict(after_recheck(params["plan"], params["recheck"] or {}, params["hosts"],
                                  params["restart_on"]), next_attempt=params["attempt"] + 1)
    record = read_json(params["state_file"]) if params["state_file"] else None
    # A host the stop-and-gather could not reach (a network cut) is out of later attempts.
    unreachable = [h for h, res in sorted(params["gathered"].items())
                   if isinstance(res, dict) and res.get("unreachable")]
    return after_attempt(record, params["attempt"], params["max_restarts"],
                         params["restart_on"], params["candidates"], params["hosts"],
                         params["excluded"], [h for h in params["hosts"] if h in unreachable],
                         params["probed"], observe=params["actions"] == "observe")
