"""Watch one host's torchrun until the run ends, fail-fast across hosts.

Looks at the host's run in a loop; each look waits on the host up to `poll_s` seconds for the
run's state to change, so an exit is seen at once. A look is the torchrun_watch module's code,
run as a plain script by the host's `python` when one is given (see look_script). The hosts'
watchers share one file on the controller, `abort_file`: the first host whose torchrun fails,
vanishes, hangs or cannot be reached writes it (O_EXCL: the first failure wins), and every
other watcher, seeing it at its next look, returns at once so the play can stop every host.
On a hang every watcher first has py-spy dump its ranks' stacks.

Returns: outcome (succeeded | failed | hung | aborted | lost | timeout), the last module
answer (state, rc, ranks, root_cause) and, for the first failure, the abort record.
"""
from __future__ import annotations

import functools
import json
import os
import shlex
import time

from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()

MODULE_ARGS = ("run_dir", "run_id", "py_spy", "async_jid")
UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     "module_utils", "torchfleet")


@functools.lru_cache(maxsize=1)
def _loader():
    """The part of every look's program that loads procs, rundir and watch: read and quoted
    once per worker, not at every look."""
    sources = {}
    for name in ("procs", "rundir", "watch"):
        with open(os.path.join(UTILS, name + ".py")) as f:
            sources[name] = f.read()
    return "\n".join([
        "import json, sys, types",
        "for name, source in %r.items():" % sources,
        "    module = sys.modules[name] = types.ModuleType(name)",
        "    exec(compile(source, name + '.py', 'exec'), module.__dict__)",
    ]) + "\n"


def look_script(args):
    """A plain Python program that makes one look (module_utils/torchfleet/watch.py) with these
    arguments and prints its JSON answer: what the module would answer, for a bare interpreter
    start instead of an AnsiballZ one. The arguments travel as a JSON literal inside the
    program, on stdin, never through a shell."""
    return _loader() + "print(json.dumps(sys.modules['watch'].look(json.loads(%r))))\n" % (
        json.dumps(args))


def read_abort(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def append_progress(path, host, elapsed, state, outcome):
    """One JSON line per look; lines are short, so O_APPEND writes from every host interleave whole."""
    if not path:
        return
    ranks = [{k: r.get(k) for k in ("local_rank", "rank", "alive", "idle_s", "last_line")}
             for r in state.get("ranks", [])]
    line = json.dumps({"host": host, "elapsed_s": round(elapsed, 3), "state": state.get("state"),
                       "rc": state.get("rc"), "outcome": outcome, "ranks": ranks}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def write_abort(path, record):
    """Record the first failure; False when another host's was already there."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    return True


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def _poll(self, task_vars, **extra):
        args = {k: v for k, v in self._task.args.items() if k in MODULE_ARGS and v is not None}
        args["wait_s"] = float(self._task.args.get("poll_s", 2))
        args.update(extra)
        python = self._task.args.get("python")
        if not python:
            return self._execute_module(module_name="torchrun_watch", module_args=args,
                                        task_vars=task_vars)
        res = self._low_level_execute_command(shlex.join([python, "-"]),
                                              in_data=look_script(args).encode(), sudoable=True)
        if res["rc"] == 255:  # ssh's own failure: the host is not reachable
            raise AnsibleConnectionFailure(res["stderr"][-500:] or "ssh exited with 255")
        try:
            return json.loads(res["stdout"].strip().splitlines()[-1])
        except (IndexError, ValueError):
            return {"failed": True, "msg": "the look at the run failed on the host (rc %s): %s"
                                           % (res["rc"], (res["stderr"] or res["stdout"])[-500:])}

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        a = self._task.args
        host = task_vars["inventory_hostname"]
        abort_file = a["abort_file"]
        hang_s = float(a.get("hang_timeout_s", 300))
        job_s = float(a.get("job_timeout_s", 86400))
        start_grace_s = float(a.get("start_grace_s", 60))
        show = bool(a.get("progress", False))
        nranks = int(a.get("nranks_total", 0))
        progress_file = a.get("progress_file")
        begin = time.monotonic()
        state, outcome, record = {}, None, None

        while outcome is None:
            elapsed = time.monotonic() - begin
            try:
                state = self._poll(task_vars)
            except (AnsibleConnectionFailure, AnsibleError) as exc:
                state = {"failed": True, "msg": str(exc)}
            if state.get("unreachable") or state.get("failed"):
                outcome = "lost"
                record = {"host": host, "reason": "lost",
                          "detail": "cannot reach the host: %s" % state.get("msg", "")[:300]}
            elif state["state"] == "exited":
                if state["rc"] == 0:
                    outcome = "succeeded"
                else:
                    outcome = "failed"
                    record = {"host": host, "reason": "failed", "rc": state["rc"],
                              "root_cause": state.get("root_cause")}
            elif state["state"] == "vanished":
                outcome = "failed"
                record = {"host": host, "reason": "vanished",
                          "detail": "torchrun (pid %s) disappeared without an exit code"
                                    % state.get("pid")}
            elif state["state"] == "start_failed":
                outcome = "failed"
                record = {"host": host, "reason": "not started", "detail": state["msg"]}
            elif state["state"] == "pending" and elapsed > start_grace_s:
                outcome = "failed"
                record = {"host": host, "reason": "not started",
                          "detail": "torchrun did not start within %.0f s" % start_grace_s}
            elif self._hung(state, hang_s):
                state = self._poll(task_vars, dump_stacks=True)
                outcome = "hung"
                record = {"host": host, "reason": "hang", "hang_timeout_s": hang_s,
                          "stuck": [{"local_rank": r["local_rank"], "last_line": r["last_line"]}
                                    for r in state["ranks"]]}
            elif elapsed > job_s:
                outcome = "timeout"
                record = {"host": host, "reason": "timeout",
                          "detail": "still running after job_timeout_s=%.0f" % job_s}

            append_progress(progress_file, host, elapsed, state, outcome)
            if record is not None:
                record["detected_s"] = round(elapsed, 3)
                record["first"] = write_abort(abort_file, record)
                break
            other = read_abort(abort_file)
            if other is not None:
                outcome = "aborted"
                if other.get("reason") == "hang":
                    state = self._poll(task_vars, dump_stacks=True)
                break
            if show:
                self._progress(host, state, elapsed, nranks)

        if outcome == "aborted":
            append_progress(progress_file, host, time.monotonic() - begin, state, outcome)
        result.update(outcome=outcome, abort=record, watch=state, changed=False,
                      watched_s=round(time.monotonic() - begin, 3))
        return result

    @staticmethod
    def _hung(state, hang_s):
        ranks = [r for r in state.get("ranks", []) if r.get("idle_s") is not None]
        return (state.get("state") == "running" and bool(ranks)
                and all(r["idle_s"] > hang_s for r in ranks))

    @staticmethod
    def _progress(host, state, elapsed, nranks):
        ranks = state.get("ranks", [])
        alive = sum(1 for r in ranks if r.get("alive"))
        last = ranks[0]["last_line"] if ranks else ""
        display.display("  [%s] %6.1f s  %s  ranks alive here: %d%s  local rank 0: %s" % (
            host, elapsed, state.get("state"), alive,
            " (of %d in the run)" % nranks if nranks else "", last[-100:]))
