"""Drains in Slurm (`slurm_drain=true`, docs/slurm.md): each host with a fatal hardware cause, or
quarantined by the run's end, drained by its Slurm node name with a reason that names torchfleet
(`torchfleet hosts release` resumes only such a node), and what Slurm answered.

run_summary runs it on the controller before the report and the ledger's audit are written, so
that a drain's `done` is Slurm's answer (scontrol's exit status), and one it refused says why
(scontrol's own words) and the command an administrator may run instead.
"""
from __future__ import annotations

import shlex
import subprocess

SCONTROL_TIMEOUT_S = 30  # slurmctld answers in well under a second when it answers at all
EVIDENCE_MAX = 120       # of the drain's reason (Slurm keeps a node's reason short)
SAID_MAX = 300           # of scontrol's words kept in the audit


def argv(entry, run_id, node=None, scontrol=None):
    """scontrol's command line to drain one entry ({host, reason, evidence}) as Slurm's node
    `node` (the inventory's slurm_node; the host's name where none)."""
    evidence = str(entry.get("evidence") or "")
    if len(evidence) > EVIDENCE_MAX:
        evidence = evidence[:EVIDENCE_MAX - 3] + "..."
    return [scontrol or "scontrol", "update", "nodename=%s" % (node or entry["host"]),
            "state=drain", "reason=torchfleet %s: %s: %s" % (run_id, entry.get("reason"),
                                                              evidence)]


def drain(entries, run_id, nodes=None, scontrol="scontrol"):
    """Drains each entry; returns {host: "" (drained) or why Slurm did not, with the command an
    administrator may run}. nodes: {host: its Slurm node name} (the inventory plugin's
    slurm_node; a host not named, or named "", is its own node); scontrol: the command (its
    slurm_scontrol)."""
    nodes = nodes if isinstance(nodes, dict) else {}
    out = {}
    for entry in entries:
        cmd = argv(entry, run_id, nodes.get(entry["host"]), scontrol)
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                                  timeout=SCONTROL_TIMEOUT_S, stdin=subprocess.DEVNULL,
                                  check=False)
            said = "" if done.returncode == 0 else "scontrol exited %d: %s" % (
                done.returncode, (done.stderr or done.stdout or "").strip()[:SAID_MAX])
        except (OSError, subprocess.TimeoutExpired) as exc:
            said = "scontrol could not run: %s" % str(exc)[:SAID_MAX]
        out[entry["host"]] = said and "Slurm did not drain it (%s); as a Slurm administrator: %s" % (
            said, shlex.join(["scontrol"] + cmd[1:]))
    return out
