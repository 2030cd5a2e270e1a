"""The run's state: one record, owned by the master's agent, changed only through this class.

Every host's agent reports to the master (control.py carries the messages); the master's agent
feeds them here and calls tick() to decide what time alone decides (a host gone silent, a hang,
the job's time limit). The first failure is recorded once; every later one is ignored, so two
failures racing each other end the run once, naming the first.

record() is the one definition of what a run's state looks like. The master's agent writes it
to control.json on the host; the controller's watch copies it to run_state.json; the summary
(train.json / collective.json), the Python API and the HTML report read that copy.

    {"run_id", "phase", "started", "updated", "final", "nnodes", "nproc_per_node",
     "failure": null | {"host", "node_rank", "reason", "detail", "rc", "root_cause",
                        "last_line", "detected_s"},
     "hosts": [{"host", "node_rank", "ranks": [first, ..., last], "state", "rc", "alive",
                "progress_ts", "last_line", "last_seen", "pid", "elapsed_s"}]}

Only the standard library: it runs inside the agent on every host.
"""
from __future__ import annotations

import time

# phase: the run as a whole. RUNNING until the first failure or until every host exited 0.
RUNNING = "running"
SUCCEEDED = "succeeded"
# A failure's reason is also the phase it ends the run in.
FAILED = "failed"          # a host's torchrun exited non-zero (a rank failed)
VANISHED = "vanished"      # torchrun disappeared without an exit code
NOT_STARTED = "not_started"  # a host's agent could not start torchrun, or never reached the master
LOST = "lost"              # a host stopped answering (host.lost)
HANG = "hung"              # no rank anywhere made progress for hang_timeout_s
TIMEOUT = "timeout"        # the run outlived job_timeout_s
CONTROLLER_LOST = "controller_lost"  # the controller stopped watching (lease ran out)
TERMINAL = (SUCCEEDED, FAILED, VANISHED, NOT_STARTED, LOST, HANG, TIMEOUT, CONTROLLER_LOST)

# host state
PENDING = "pending"      # not heard from yet
STARTED = "running"      # its torchrun runs
EXITED = "exited"        # its torchrun ended by itself (rc says how)
STOPPED = "stopped"      # its agent stopped torchrun after the run failed elsewhere
HOST_LOST = "lost"       # silent for lost_after_s
DONE = (EXITED, STOPPED, HOST_LOST)

# What each phase means for a host that did not cause it (summary's per-host outcome).
LINE_MAX = 300


def host_outcome(phase, failure, host_record):
    """How the run ended for one host: succeeded | failed | hung | lost | timeout | aborted."""
    if host_record["state"] == EXITED and host_record["rc"] == 0:
        return SUCCEEDED
    if phase == HANG:
        return HANG
    if failure and failure["host"] == host_record["host"]:
        return {FAILED: FAILED, VANISHED: FAILED, NOT_STARTED: FAILED, LOST: LOST,
                TIMEOUT: TIMEOUT}.get(failure["reason"], "aborted")
    if phase == TIMEOUT:
        return TIMEOUT
    if phase == RUNNING:
        return "running"
    return "aborted"


class RunState:
    def __init__(self, run_id, hosts, nproc_per_node, *, now=None, join_timeout_s=60.0,
                 lost_after_s=30.0, hang_timeout_s=300.0, job_timeout_s=86400.0):
        self.run_id, self.nproc = run_id, int(nproc_per_node)
        self.started = time.time() if now is None else now
        self.updated = self.started
        self.join_timeout_s, self.lost_after_s = float(join_timeout_s), float(lost_after_s)
        self.hang_timeout_s, self.job_timeout_s = float(hang_timeout_s), float(job_timeout_s)
        self.phase, self.failure, self.final = RUNNING, None, False
        self.order = list(hosts)
        self.hosts = {h: {"host": h, "node_rank": i,
                          "ranks": [i * self.nproc, i * self.nproc + self.nproc - 1],
                          "state": PENDING, "rc": None, "alive": 0, "progress_ts": None,
                          "last_line": "", "last_seen": None, "pid": None, "elapsed_s": None}
                      for i, h in enumerate(self.order)}

    # -- what the agents report -------------------------------------------------------------

    def beat(self, host, now, alive=0, progress_ts=None, last_line="", pid=None):
        """A live agent's report: its torchrun runs with `alive` ranks."""
        rec = self.hosts.get(host)
        if rec is None or rec["state"] in DONE:
            return None
        rec.update(state=STARTED, alive=int(alive), last_seen=now, pid=pid,
                   elapsed_s=round(now - self.started, 3))
        if progress_ts is not None:
            rec["progress_ts"] = max(progress_ts, rec["progress_ts"] or 0)
        if last_line:
            rec["last_line"] = last_line[-LINE_MAX:]
        self.updated = now
        return None

    def exited(self, host, now, rc, stopped=False, vanished=False, root_cause=None,
               last_line=""):
        """A host's torchrun ended: rc 0, a failure, or stopped by its agent after the run
        failed elsewhere. Returns the failure it caused, if it is the first."""
        rec = self.hosts.get(host)
        if rec is None or rec["state"] in DONE:
            return None
        rec.update(state=STOPPED if stopped else EXITED, rc=rc, alive=0, last_seen=now,
                   elapsed_s=round(now - self.started, 3))
        if last_line:
            rec["last_line"] = last_line[-LINE_MAX:]
        self.updated = now
        if stopped:
            return None
        if vanished:
            return self.fail(host, VANISHED, now, "torchrun (pid %s) disappeared without an "
                                                  "exit code" % rec["pid"])
        if rc != 0:
            return self.fail(host, FAILED, now, "torchrun exited with %s" % rc, rc=rc,
                             root_cause=root_cause)
        if all(r["state"] == EXITED and r["rc"] == 0 for r in self.hosts.values()):
            self.phase = SUCCEEDED
        return None

    def not_started(self, host, now, detail):
        rec = self.hosts.get(host)
        if rec is None or rec["state"] in DONE:
            return None
        rec.update(state=EXITED, last_seen=now, last_line=detail[-LINE_MAX:])
        return self.fail(host, NOT_STARTED, now, detail)

    # -- what time decides --------------------------------------------------------------------

    def tick(self, now, lease_age_s=None, lease_s=0.0):
        """Decide what silence decides; returns a failure when this tick made the first one."""
        if self.phase != RUNNING:
            return None
        if lease_s and lease_age_s is not None and lease_age_s > lease_s:
            return self.fail(None, CONTROLLER_LOST, now, "the controller stopped watching the run "
                             "for %.0f s (interrupted or lost); every host was stopped"
                             % lease_age_s)
        elapsed = now - self.started
        for rec in self.hosts.values():
            if rec["state"] == PENDING and elapsed > self.join_timeout_s:
                return self.fail(rec["host"], NOT_STARTED, now,
                                 "its agent never reached the master's control port within "
                                 "join_timeout_s=%.0f" % self.join_timeout_s)
            if rec["state"] == STARTED and now - rec["last_seen"] > self.lost_after_s:
                rec["state"] = HOST_LOST
                return self.fail(rec["host"], LOST, now, "no heartbeat for %.0f s "
                                 "(lost_after_s=%.0f): network cut, host frozen or its agent "
                                 "killed" % (now - rec["last_seen"], self.lost_after_s))
        running = [r for r in self.hosts.values() if r["state"] == STARTED]
        if running and elapsed > self.hang_timeout_s:
            last = max([r["progress_ts"] or 0 for r in self.hosts.values()] + [self.started])
            if now - last > self.hang_timeout_s:
                return self.fail(None, HANG, now, "no rank made progress for %.0f s "
                                 "(hang_timeout_s)" % (now - last))
        if elapsed > self.job_timeout_s:
            return self.fail(None, TIMEOUT, now, "still running after job_timeout_s=%.0f"
                             % self.job_timeout_s)
        return None

    def fail(self, host, reason, now, detail, rc=None, root_cause=None):
        """Record the run's first failure; False-y (None) when one was already recorded."""
        if self.failure is not None or self.phase != RUNNING:
            return None
        rec = self.hosts.get(host) or {}
        self.failure = {"host": host, "node_rank": rec.get("node_rank"), "reason": reason,
                        "detail": detail, "rc": rc, "root_cause": root_cause,
                        "last_line": rec.get("last_line", ""),
                        "detected_s": round(now - self.started, 3)}
        self.phase, self.updated = reason, now
        return self.failure

    def all_done(self):
        return all(r["state"] in DONE or r["state"] == PENDING and self.phase != RUNNING
                   for r in self.hosts.values())

    # -- what is read -------------------------------------------------------------------------

    def record(self):
        return {"run_id": self.run_id, "phase": self.phase, "started": self.started,
                "updated": self.updated, "final": self.final, "nnodes": len(self.order),
                "nproc_per_node": self.nproc, "failure": self.failure,
                "hosts": [self.hosts[h] for h in self.order]}


def summary(record, now):
    """What the controller shows while a run goes on: the same few fields at any N."""
    hosts = record["hosts"]
    running = [h for h in hosts if h["state"] == STARTED]
    # The slowest host: the one whose ranks made progress longest ago.
    slowest = min(running, key=lambda h: h["progress_ts"] or 0, default=None)
    failure = record.get("failure")
    return {
        "phase": record["phase"], "final": record["final"], "failure": failure,
        "elapsed_s": round(now - record["started"], 3),
        "nranks": record["nnodes"] * record["nproc_per_node"],
        "ranks_alive": sum(h["alive"] for h in hosts),
        "hosts_running": len(running), "nnodes": record["nnodes"],
        "hosts_done": sum(1 for h in hosts if h["state"] in DONE),
        "slowest": None if slowest is None else {
            "host": slowest["host"], "idle_s": None if slowest["progress_ts"] is None
            else round(now - slowest["progress_ts"], 1)},
        "last_line": (failure or {}).get("last_line") or (hosts[0]["last_line"] if hosts else ""),
    }
