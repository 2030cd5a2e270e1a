"""Follow a run to its end by looking at its master only.

The hosts stop each other (the agents' control channel, plugins/module_utils/run/agent.py);
the controller's part is one look at one host every poll_s at most, whatever the number of
hosts: it renews the master's lease, prints progress at least every progress_every_s, appends
the summary to progress_file, and at the end writes the whole record to state_file
(run_state.json), which the summary, the API and the report read, with the master's clock
offset from the controller's measured from the looks (the record's `clock`: Clock).

A look is the torchrun_watch module's code run as a plain script by the master's `python`
when one is given (see look_script). The hosts whose start task failed (`starts`: each host's
registered start result) go to the master's store with the first look, which names them as
the run's failures. A look that fails is tried again until lease_s has passed since the last
good one (a cut between the controller and the hosts is ridden out while the master's lease
holds); then the controller has lost the run, and no host is named: a controller cut off and
a master that is down look the same from here. The master stops the run when its lease runs
out (its agents stop by themselves within lost_after_s if it is down), and the play's stop
tasks follow.

How the run ended is never decided here: the master's record (runstate.py) decides it; when
the master kept none the controller can read (its own start failed, or it was lost), runstate
builds the record from what is known.

mode (watch.MODES) says whose run it is. attached: the controller's, as above. detach: the
same until every rank of every host runs, then one look marks the run detached (the master's
lease is off from then on: the hosts judge and end the run alone) and the watch returns.
detached: a run detached before (attach.yml): followed to its end without renewing anything;
the watch's end (Ctrl-C, its controller gone, a cut longer than lease_s) leaves the run
running. look: one look at the master's whole record, renewing nothing (status.yml).

Returns: outcome (runstate.PHASE_OUTCOME of the record's phase, or `detached`), failure (the
record's first failure) and summary (the last look's).
"""
from __future__ import annotations

import functools
import json
import os
import shlex
import signal
import time

from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import goodput, status, summary
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import exits, flight, rundir, runstate, straggle, watch
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.watch import ACTION_SPEC

display = Display()

MODULE_ARGS = ("run_dir", "run_id", "async_jid", "async_dir")
DETACHED = "detached"  # the outcome of a watch in mode detach that detached the run
LOOK = "look"


def start_failures(starts):
    """{host: Ansible's reason} of the hosts whose registered start result failed."""
    failed = {}
    for host, res in (starts or {}).items():
        res = res if isinstance(res, dict) else {}
        if not res or res.get("failed") or res.get("unreachable"):
            failed[host] = str(res.get("msg") or ("unreachable" if res.get("unreachable")
                                                  else "the start task did not run"))[:1000]
    return failed


@functools.lru_cache(maxsize=1)
def _loader():
    """The part of every look's program that loads defaults, exits, flight, straggle, rundir, runstate and watch under
    their one module name (ansible_collections.torchfleet.fleet.plugins.module_utils.X), as
    AnsiballZ would, from their source read and quoted once per worker, not at every look. This is the
    project's one import bootstrap: a look is a bare interpreter start on the master, ten
    times cheaper than an AnsiballZ module's, and the host has no collection installed."""
    sources = {}
    for module in (defaults, exits, flight, straggle, rundir, runstate, watch):
        with open(module.__file__) as f:
            sources[module.__name__] = f.read()
    return "\n".join([
        "import json, sys, types",
        "for name, source in %r.items():" % sources,
        "    parts = name.split('.')",
        "    for i in range(1, len(parts)):",
        "        sys.modules.setdefault('.'.join(parts[:i]), types.ModuleType('.'.join(parts[:i])))"
        ".__path__ = []",
        "    module = sys.modules[name] = types.ModuleType(name)",
        "    exec(compile(source, name, 'exec'), module.__dict__)",
    ]) + "\n"


def look_script(args):
    """A plain Python program that makes one look (plugins/module_utils/run/watch.py) with these
    arguments and prints its JSON answer. The arguments travel as a JSON literal inside the
    program, on stdin, never through a shell. The answer also says when the program began on
    the master's clock (`began`; the look's own `now` is when it ended): the clock offset's
    measure (Clock)."""
    return ("import time\n_began = time.time()\n" + _loader()
            + "_answer = sys.modules[%r].look(json.loads(%r))\n" % (watch.__name__, json.dumps(args))
            + "_answer['began'] = _began\nprint(json.dumps(_answer))\n")


class Clock:
    """The master's clock offset from the controller's (master - controller, seconds), measured
    from the looks: the controller's send and receive times (t0, t1) around the master's own
    (began, now), as NTP does: offset = ((began - t0) + (now - t1)) / 2, within +/- half the
    round trip less the time the look spent on the master (its wait). The look with the
    shortest such round trip is kept. None until a look answered both times."""

    def __init__(self):
        self.offset_s, self.rtt_s, self.looks = None, None, 0

    def take(self, t0, t1, answer):
        began, now = (answer.get(k) if isinstance(answer, dict) else None for k in ("began", "now"))
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (began, now)):
            return
        rtt = (t1 - t0) - (now - began)
        if rtt < 0 or now < began:
            return  # a clock stepped during the look: no measure
        self.looks += 1
        if self.rtt_s is None or rtt < self.rtt_s:
            self.offset_s, self.rtt_s = ((began - t0) + (now - t1)) / 2, rtt

    def record(self):
        """What is kept with the attempt: {offset_s (0.0 unmeasured), rtt_s, looks}."""
        return {"offset_s": round(self.offset_s or 0.0, 6), "rtt_s": None if self.rtt_s is None
                else round(self.rtt_s, 6), "looks": self.looks}


def append_progress(path, line):
    """One short JSON line per look (O_APPEND: a reader never sees half a line)."""
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def write_state(path, record):
    if not path:
        return
    # An attempt's directory (max_restarts) is made by the first thing written into it.
    os.makedirs(os.path.dirname(path) or ".", mode=0o750, exist_ok=True)
    rundir.write_json(path, record, mode=0o640)


def judged_lost(record):
    """The hosts the master judged lost (the play does not stop or gather them before a
    restart: each would cost its SSH timeout; report.yml stops and gathers them at the end)."""
    return [h["host"] for h in record.get("hosts") or []
            if isinstance(h, dict) and h.get("state") == runstate.HOST_LOST
            and isinstance(h.get("host"), str)]


def progress_text(s):
    slow = s.get("slowest") or {}
    failure = s.get("failure") or {}
    text = "  %7.1f s  %s  ranks alive %d of %d  hosts running %d of %d" % (
        s["elapsed_s"], s["phase"], s["ranks_alive"], s["nranks"], s["hosts_running"],
        s["nnodes"])
    if slow.get("host") and slow.get("idle_s") is not None:
        text += "  quietest %s (no log line for %.0f s)" % (slow["host"], slow["idle_s"])
    if s.get("warnings"):
        text += "  hardware warnings on %s" % ", ".join(s["warnings"][:3]) + (
            " and %d more" % (len(s["warnings"]) - 3) if len(s["warnings"]) > 3 else "")
    if failure:
        text += "  first failure: %s" % runstate.failure_text(failure)[:200]
    return text + "  | %s" % (s.get("last_line") or "")[-100:]


def all_running(summary):
    """Every rank of every host runs: a run can be detached."""
    return (summary["phase"] == runstate.RUNNING and summary["nranks"] > 0
            and summary["ranks_alive"] == summary["nranks"]
            and summary["hosts_running"] == summary["nnodes"])


def controller_times(task_vars):
    """run_summary's times of this run so far, from the controller's facts (the plays note
    them: torchfleet_started, torchfleet_launched, launch_attempts); {} outside a launch."""
    try:
        local = task_vars["hostvars"]["localhost"]
        started = local.get("torchfleet_started")
        return {"started": float(started) if started is not None else None,
                "launched": {str(k): float(v) for k, v in
                             dict(local.get("torchfleet_launched") or {}).items()},
                "attempts": [{"attempt": int(a["attempt"]), "dir": str(a["dir"])}
                             for a in local.get("launch_attempts") or []]}
    except (KeyError, TypeError, ValueError, AttributeError):
        return {}


class _Terminated(Exception):
    """SIGTERM reached the worker (ansible-playbook forwards it)."""


def _sigterm(_signum, _frame):
    raise _Terminated()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = False  # it renews the master's lease and writes on the controller

    def _look(self, task_vars, **extra):
        # As given, not as validated: a path such as ~/... is the master's, expanded there.
        args = {k: v for k, v in self._task.args.items() if k in MODULE_ARGS and v is not None}
        if self.params["mode"] in (DETACHED, LOOK):  # nobody's lease: the run is the hosts'
            args["touch_lease"] = False
        args.update(extra)
        python = self.params["python"]
        if not python:
            return self._execute_module(module_name="torchrun_watch", module_args=args,
                                        task_vars=task_vars)
        t0 = time.time()
        res = self._low_level_execute_command(shlex.join([python, "-"]),
                                              in_data=look_script(args).encode(), sudoable=True)
        t1 = time.time()
        if res["rc"] == 255:  # ssh's own failure: the host is not reachable
            raise AnsibleConnectionFailure(res["stderr"][-500:] or "ssh exited with 255")
        try:
            answer = json.loads(res["stdout"].strip().splitlines()[-1])
            self.clock.take(t0, t1, answer)
            return answer
        except (IndexError, ValueError):
            return {"failed": True, "msg": "the look at the run failed on the master (rc %s): %s"
                                           % (res["rc"], (res["stderr"] or res["stdout"])[-500:])}

    def _goodput(self, task_vars, record, master_now):
        """Goodput so far in one line (reports/goodput.py's), from this run's times on the
        controller and this attempt's record as it is now; '' where it cannot be said."""
        try:
            times = controller_times(task_vars)
            if times.get("attempts"):
                g = summary.run_goodput(times, dict(record, clock=self.clock.record()))
                return goodput.line(g, so_far=True) if g else ""  # the report counts the gather
            return status.live_goodput(record, master_now, self.params["attempt"])
        except Exception as exc:  # noqa: BLE001 - a figure shown must never end the watch
            display.vvv("goodput so far: %s" % exc)
            return ""

    def _follow(self, task_vars, master, failed_starts, begin):
        """Look at the run until its record is final (or the master cannot be looked at);
        returns (the last look, the first failure, the record or None)."""
        a = self.params
        poll_s, every_s = a["poll_s"], a["progress_every_s"]
        settle_s = a["settle_s"] if a["settle_s"] is not None else defaults.watch_settle_s(
            a["lost_after_s"])
        good, shown, decided_at, look, failure, record = begin, 0.0, None, {}, None, None
        goodput_at = 0.0  # goodput so far is said GOODPUT_SAY_S into the run, then as often
        said = float("-inf")  # when stragglers were last named
        parent = os.getppid()  # ansible-playbook: a new parent says it is gone
        while failure is None:
            if os.getppid() != parent:
                if a["mode"] == DETACHED:
                    raise AnsibleError("ansible-playbook is gone; the detached run goes on")
                self._look(task_vars, stop="stopped: the controller ended (ansible-playbook %d "
                                           "is gone: killed, or its terminal closed)" % parent)
                raise AnsibleError("ansible-playbook is gone: the run was asked to stop")
            try:
                if a["stop_now"]:  # stop.yml of a detached run: asked once, then followed
                    look = self._look(task_vars, stop=a["stop_now"])
                    a["stop_now"] = ""
                else:
                    full = (a["mode"] != "detach"
                            and time.monotonic() - begin - goodput_at >= defaults.GOODPUT_SAY_S)
                    look = self._look(task_vars, wait_s=poll_s, start_failed=failed_starts,
                                      **({"full": True} if full else {}))
            except (AnsibleConnectionFailure, AnsibleError) as exc:
                look = {"failed": True, "unreachable": True, "msg": str(exc)}
            now = time.monotonic()
            elapsed = now - begin
            if look.get("failed"):
                # A cut between the controller and the hosts (a VPN that reconnects) is ridden
                # out as long as the master's lease holds, since the hosts run on without it.
                if now - good <= a["lease_s"]:
                    time.sleep(min(poll_s, 1.0))  # a passing fault: look again
                    continue
                if a["mode"] == DETACHED:  # not this controller's run to judge
                    raise AnsibleError(
                        "the controller could not reach the master %s for %.0f s (%s); the "
                        "detached run goes on without it: attach again once the hosts answer"
                        % (master, now - good, look.get("msg", "")[:300]))
                # From here neither the controller nor the run can tell a controller cut off
                # from a master that is down: no host is named (the gather says who answers).
                failure = {"host": None, "reason": runstate.CONTROLLER_LOST,
                           "detail": "the controller could not reach the master %s for %.0f s "
                                     "(lease_s=%g): the controller was cut off from the hosts, "
                                     "or the master is down; the master stops the run when "
                                     "its lease runs out (%s)" % (
                                         master, now - good, a["lease_s"],
                                         look.get("msg", "")[:300])}
                break
            good = now
            if a["mode"] == DETACHED and look.get("missing"):
                raise AnsibleError(
                    "the master %s has no run %s (%s is missing there): the run is on other "
                    "hosts than its record names, or their run directories were removed"
                    % (master, a["run_id"], a["run_dir"]))
            if look["state"] == "start_failed":
                failure = {"host": master, "reason": runstate.NOT_STARTED,
                           "detail": look["msg"]}
                break
            if look["state"] == "master_died":
                # (Ansible's job record holds only the async wrapper's traceback: not shown.)
                record = runstate.master_lost(
                    look["record"], master, "its agent ended without finishing the run's "
                    "record (killed, out of memory, or crashed); the other hosts stop by "
                    "themselves")
                failure = record["failure"]
                break
            summary = look.get("summary")
            if a["mode"] == "detach" and summary and all_running(summary):
                self._look(task_vars, detach=True)
                display.display(progress_text(summary))
                return look, None, None
            if summary:
                line = ""  # (not `said`: that is when stragglers were last named)
                if look.get("record") and summary["phase"] == "running":
                    goodput_at, line = elapsed, self._goodput(task_vars, look["record"],
                                                              look.get("now"))
                    if line:
                        display.display("  " + line)
                append_progress(a.get("progress_file"), dict(
                    summary, watched_s=round(elapsed, 3), **({"goodput": line} if line else {})))
                if elapsed - shown >= every_s or summary["phase"] != "running":
                    shown = elapsed
                    display.display(progress_text(summary))
                if summary.get("stragglers") and elapsed - said >= defaults.STRAGGLER_SAY_S:
                    said = elapsed
                    for words in summary["stragglers"][:3]:
                        display.display("  straggler: %s" % words)
                if summary["phase"] != "running":
                    decided_at = decided_at or time.monotonic()
                    if summary["final"] or time.monotonic() - decided_at > settle_s:
                        record = look.get("record") or self._look(task_vars, full=True)["record"]
                        failure = record["failure"]
                        break
        return look, failure, record

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        checked, self.params = self.validate_argument_spec(argument_spec=ACTION_SPEC)
        self.clock = Clock()
        a = self.params
        master = self._task.delegate_to or task_vars["inventory_hostname"]
        hosts = list(a["starts"]) or [master]
        failed_starts = start_failures(a["starts"])
        begin = time.monotonic()
        if a["mode"] == LOOK:  # status: the master's record as it is, nothing renewed or kept
            try:
                look = self._look(task_vars, full=True)
            except (AnsibleConnectionFailure, AnsibleError) as exc:
                look = {"failed": True, "unreachable": True, "msg": str(exc)}
            result.update({k: v for k, v in look.items() if k != "changed"}, changed=False)
            if look.get("record"):
                view = status.view(look["record"], look.get("now"), a["attempt"])
                result.update(status=view, table=status.text(view))
            return result
        look, failure, record = {}, None, None
        if master in failed_starts:  # no store on the master: nothing to look at
            failure = {"host": master, "reason": runstate.NOT_STARTED,
                       "detail": "its start failed: %s" % failed_starts[master]}
        # This runs in an Ansible worker, a session of its own: ansible-playbook killed (SIGKILL
        # of its process group, an OOM kill) or ended by SIGHUP (its terminal closed) leaves it
        # running, renewing the lease of a run nobody watches; Ctrl-C and SIGTERM reach it.
        # Each asks the master to stop the run now, instead of at the end of its lease.
        try:
            old_term = signal.signal(signal.SIGTERM, _sigterm)
        except ValueError:  # not the worker's main thread: Ansible's own handling stands
            old_term = None
        try:
            if failure is None:
                look, failure, record = self._follow(task_vars, master, failed_starts, begin)
        except (KeyboardInterrupt, _Terminated) as exc:
            why = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else "SIGTERM"
            if a["mode"] == DETACHED:  # the watch ends; the detached run goes on
                raise
            try:
                self._look(task_vars, stop="stopped by the user (%s to the controller)" % why)
            except Exception:  # noqa: BLE001 - best effort: the lease still ends the run
                pass
            raise
        finally:
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
        if record is None and failure is None and a["mode"] == "detach":
            result.update(outcome=DETACHED, failure=None, master_lost=False, changed=False,
                          summary=look.get("summary"),
                          watched_s=round(time.monotonic() - begin, 3))
            return result
        if record is None:
            # The master's store kept no record the controller can read: what is known.
            record = runstate.controller_record(a["run_id"], hosts, a["nproc_per_node"],
                                                failure)
            failure = record["failure"]
        # The attempt's record on the controller keeps the master's clock offset measured here:
        # goodput puts every time of it on the controller's clock (reports/summary.py).
        record = dict(record, clock=self.clock.record())
        write_state(a.get("state_file"), record)
        said = self._goodput(task_vars, record, look.get("now"))
        if said:  # the attempt's end: goodput so far (the report's counts the gather too)
            display.display("  " + said)
            if look.get("summary"):
                append_progress(a.get("progress_file"), dict(
                    look["summary"], watched_s=round(time.monotonic() - begin, 3), goodput=said))
        # master_lost: the controller could not reach the master (the play then does not try
        # it again); a run whose phase is 'lost' because of another host still gathers there.
        result.update(outcome=runstate.PHASE_OUTCOME.get(record["phase"], runstate.FAILED),
                      failure=failure,
                      master_lost=bool(look.get("failed")),
                      summary=look.get("summary"), changed=False, clock=record["clock"],
                      lost=judged_lost(record),
                      watched_s=round(time.monotonic() - begin, 3))
        return result
