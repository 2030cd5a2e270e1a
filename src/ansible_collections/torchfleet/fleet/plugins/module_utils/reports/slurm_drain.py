"""Drains in Slurm (`slurm_drain=true`, docs/slurm.md): each host with a fatal hardware cause, or
quarantined by the run's end, drained by its Slurm node name with a reason that names torchfleet
(`torchfleet hosts release` resumes only such a node), and what Slurm answered.

run_summary runs it on the controller before the report and the ledger's audit are written, so
that a drain's `done` is Slurm's answer (scontrol's exit status), and one it refused says why
(scontrol's own words) and the command an administrator may run instead. The ledger holds the
drains as pending meanwhile (ledger.Fleet.decide_drains), so another controller's breaker
counts them while scontrol runs.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import time

SCONTROL_TIMEOUT_S = 30  # slurmctld answers in well under a second when it answers at all
TOTAL_S = 60             # every call together: the run's end waits no longer for slurmctld
EVIDENCE_MAX = 120       # of the drain's reason (Slurm keeps a node's reason short)
SAID_MAX = 300           # of scontrol's words kept in the audit
NOT_TRIED = "not tried: scontrol did not answer"
# A call that timed out may have drained all the same (slurmctld took the update, its answer
# came late): such a drain is neither done nor refused, and the breaker counts it (unanswered).
UNANSWERED = "Slurm did not answer in time: the node may be drained all the same"
# A host's kernel line may hold a NUL (an argv cannot: ValueError) or other control characters
# (a reason Slurm prints on one line).
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def reason(entry, run_id):
    """The drain's reason: torchfleet's, the check and the evidence, on one line, bounded."""
    evidence = _CONTROL.sub(" ", str(entry.get("evidence") or "")).strip()
    if len(evidence) > EVIDENCE_MAX:
        evidence = evidence[:EVIDENCE_MAX - 3] + "..."
    return _CONTROL.sub(" ", "torchfleet %s: %s: %s" % (run_id, entry.get("reason"), evidence))


def drain(entries, run_id, nodes=None, scontrol="scontrol", scontrols=None):
    """Drains the entries, one scontrol call per distinct reason (and scontrol) with its nodes
    as one hostlist; returns {host: "" (drained) or why Slurm did not, with the command an
    administrator may run}. nodes: {host: its Slurm node name} (the inventory plugin's
    slurm_node; a host not named, or named "", is its own node); scontrols: {host: its
    scontrol} (slurm_scontrol), `scontrol` where none. After the first call that timed out or
    could not run, none more is made (slurmctld is not answering: the run's end would wait
    SCONTROL_TIMEOUT_S per call); every call together is bounded by TOTAL_S. A call that
    timed out may have drained its nodes: their words begin UNANSWERED (unanswered())."""
    nodes = nodes if isinstance(nodes, dict) else {}
    scontrols = scontrols if isinstance(scontrols, dict) else {}
    calls = {}
    for entry in entries:
        cmd = scontrols.get(entry["host"]) or scontrol or "scontrol"
        calls.setdefault((cmd, reason(entry, run_id)), []).append(entry)
    out, stuck, end = {}, "", time.monotonic() + TOTAL_S
    for (cmd, why), group in calls.items():
        names = ",".join(dict.fromkeys(nodes.get(e["host"]) or e["host"] for e in group))
        full = [cmd, "update", "nodename=" + names, "state=drain", "reason=" + why]
        said, timed_out = stuck, False
        left = end - time.monotonic()
        if not said and left <= 0:
            said = stuck = "%s (torchfleet waits %d s for every drain together)" % (
                NOT_TRIED, TOTAL_S)
        if not said:
            try:
                done = subprocess.run(full, capture_output=True, text=True, errors="replace",
                                      timeout=min(SCONTROL_TIMEOUT_S, left),
                                      stdin=subprocess.DEVNULL, check=False)
                said = "" if done.returncode == 0 else "scontrol exited %d: %s" % (
                    done.returncode, (done.stderr or done.stdout or "").strip()[:SAID_MAX])
            except subprocess.TimeoutExpired as exc:
                said, timed_out = "scontrol timed out after %g s" % exc.timeout, True
                stuck = NOT_TRIED
            except (OSError, ValueError) as exc:
                said = "scontrol could not run: %s" % str(exc)[:SAID_MAX]
                stuck = NOT_TRIED
        command = shlex.join(["scontrol"] + full[1:])
        if timed_out:  # (this call's: the calls not tried after it were never sent)
            said = "%s (%s); the circuit breaker counts it as drained; as a Slurm " \
                "administrator: %s, and where it is not drained: %s" % (
                    UNANSWERED, said, shlex.join(["scontrol", "show", "node", names]), command)
        elif said:
            said = "Slurm did not drain it (%s); as a Slurm administrator: %s" % (said, command)
        for e in group:
            out[e["host"]] = said
    return out


def unanswered(said):
    """Whether drain()'s words of a host say its scontrol call timed out: the drain may be
    done, and stays pending in the ledger (counted by every controller's breaker)."""
    return isinstance(said, str) and said.startswith(UNANSWERED)
