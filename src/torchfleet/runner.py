"""Run one of torchfleet's playbooks through ansible-runner, with live events and cancel.

The playbooks are the package's own (torchfleet.paths.ansible_root), so this works from an
installed wheel. Events come from ansible-runner's structured job events (module results) and
from the run's progress.jsonl (one line per look at the master, written by torchrun_watch), never
from Ansible's stdout. ansible-runner runs in a private data dir that is removed afterwards and
is told not to write env files, so no variables or keys are left behind in artifacts.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ansible_collections.torchfleet.fleet.plugins.module_utils.run import detach as _detach
from torchfleet import ansible_cli, forks
from torchfleet.paths import ansible_root, collections_path
from torchfleet.results import Check

# Actions whose results carry check records (preflight.json / <kind>.json rows).
COLLECTION_PREFIX = "torchfleet.fleet."  # the plays name every module by its FQCN
CHECK_ACTIONS = {"preflight_checks", "run_summary"}
HOST_EVENTS = {"runner_on_ok": "ok", "runner_on_failed": "failed",
               "runner_on_unreachable": "unreachable", "runner_on_skipped": "skipped"}


@dataclass(frozen=True)
class Event:
    """Something that just happened.

    kind "task": a task ended on a host (status ok / failed / unreachable / skipped);
    kind "check": a check was decided (check is set);
    kind "plan": the run was planned (summary: candidates, the number of hosts preflight checks);
    kind "run": the controller looked at the run on its master (status is the run's phase,
    summary the run at a glance: ranks alive of all, hosts running, the slowest host, the
    last line, the first failure; the same few fields at any number of hosts);
    kind "attempt": a failed attempt is started again (max_restarts; summary: attempt, the
    new attempt's number, and why: which host was replaced by which).
    """

    kind: str
    host: str | None = None
    task: str | None = None
    action: str | None = None  # the task's module (kind "task")
    status: str | None = None
    check: Check | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float | None = None


@dataclass
class Outcome:
    status: str  # ansible-runner's: successful, failed, canceled, timeout
    rc: int | None
    cancelled: bool
    error: str = ""  # what ansible-playbook said first when it stopped before any play


# An inventory source that fails: Ansible tries every plugin and prints each one's reason; the
# one that took the file (auto: a plugin's config file) says what is wrong.
INVENTORY_ERROR = re.compile(r"Failed to parse inventory with 'auto' plugin: (.+)")
ERROR_LINE = re.compile(r"^\[ERROR\]: (.+)$", re.M)


def first_error(log: str) -> str:
    """The sentence that says why ansible-playbook stopped, from its output ('' if none)."""
    found = INVENTORY_ERROR.search(log) or ERROR_LINE.search(log)
    return found.group(1).strip() if found else ""


def module_name(task_action: str | None) -> str:
    """A task's module as the API names it: torchfleet.fleet.node_probe -> node_probe."""
    return (task_action or "").removeprefix(COLLECTION_PREFIX)


def translate(event: dict) -> list[Event]:
    """Events for one ansible-runner job event (an empty list for most of them)."""
    name = event.get("event")
    if name not in HOST_EVENTS:
        return []
    data = event.get("event_data") or {}
    host, res = data.get("host"), data.get("res") or {}
    action = module_name(data.get("task_action"))
    out = [Event(kind="task", host=host, task=data.get("task"), action=action,
                 status=HOST_EVENTS[name])]
    if action == "run_plan" and name == "runner_on_ok":
        out.append(Event(kind="plan", summary={"candidates": res.get("candidates")}))
    if action == "restart_plan" and name == "runner_on_ok" and res.get("restart") is True:
        out.append(Event(kind="attempt", summary={"attempt": res.get("next_attempt"),
                                                  "why": res.get("why") or ""}))
    if action in CHECK_ACTIONS and name == "runner_on_ok":
        for raw in res.get("checks", []):
            out.append(Event(kind="check", host=raw["host"], task=data.get("task"),
                             status="ok" if raw["ok"] else "failed",
                             check=Check.from_json(raw)))
    return out


class ProgressFollower:
    """Turns the lines torchrun_watch appends to progress.jsonl (one per look at the master)
    into events: those written from now on (an attach of a run that has gone on for weeks does
    not replay its history)."""

    def __init__(self, path: Path, emit: Callable[[Event], None]):
        self._lines, self._emit = _detach.ProgressLines(str(path)), emit

    def poll(self) -> None:
        for raw in self._lines.new_lines():
            self._emit(Event(kind="run", status=raw.get("phase"), summary=raw,
                             elapsed_s=raw.get("elapsed_s")))


@contextlib.contextmanager
def ctrl_c_sets(flag: threading.Event | None):
    """While a playbook runs, Ctrl-C sets `flag` (None: is ignored) instead of raising.

    A KeyboardInterrupt raised inside Thread.join() can mark ansible-runner's thread as finished
    while it still runs (CPython 3.11's _wait_for_tstate_lock releases the running thread's
    lock), and the run would be abandoned with ansible-playbook still alive. Only the main
    thread receives signals; a SIGINT that was ignored stays ignored.
    """
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is signal.SIG_IGN):
        yield
        return
    def on_sigint(signum, frame):
        if flag is not None:
            flag.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _path(private: Path) -> str:
    """PATH for ansible-runner, which starts `ansible-playbook` by name: the folder of the one
    ansible_cli finds first (a script written into `private` where ansible-core has none),
    then this interpreter's bin directory (torchrun on the default inventory's local hosts:
    `.venv/bin/torchfleet` is often run without the venv on PATH), then the user's PATH."""
    first = [os.path.dirname(ansible_cli.executable("ansible-playbook", private)),
             os.path.dirname(sys.executable)]
    return os.pathsep.join(first + [p for p in os.environ.get("PATH", "").split(os.pathsep)
                                    if p and p not in first])


def run_playbook(playbook: str, *, inventory: Path, extravars: dict[str, Any], run_dir: Path,
                 on_event: Callable[[Event], None] | None = None,
                 cancel: Callable[[], bool] | None = None,
                 on_module_result: Callable[[str, str, dict], None] | None = None,
                 interruptible: bool = True, log_name: str = "ansible.log",
                 tick: Callable[[], None] | None = None) -> Outcome:
    """Run `playbook` (a root-level playbook of the package) and wait for it.

    on_module_result(action, host, result) sees every module result that ended ok.
    cancel() is asked about once a second; True, or Ctrl-C when `interruptible`, stops
    ansible-playbook (the caller then stops what it started on the hosts); a clean-up run is
    not interruptible, Ctrl-C is then ignored until it ends. ansible-playbook's own output goes
    to run_dir/<log_name> (ansible.log). tick() is called about every 0.25 s while it runs.
    """
    import ansible_runner  # imported here: `import torchfleet` stays light

    root = ansible_root()
    run_dir.mkdir(parents=True, exist_ok=True)
    interrupted = threading.Event()
    emit = on_event or (lambda event: None)
    lock = threading.Lock()

    def deliver(event: Event) -> None:
        with lock:  # runner's thread and this one both emit
            emit(event)

    def handle(event: dict) -> bool:
        data = event.get("event_data") or {}
        if on_module_result and event.get("event") == "runner_on_ok":
            on_module_result(module_name(data.get("task_action")), data.get("host") or "",
                             data.get("res") or {})
        for e in translate(event):
            deliver(e)
        return False  # no per-event artifacts: they would hold module arguments

    left: list[tuple[int, str]] = []
    # run_dir is in ansible-playbook's extravars, on its command line (suppress_env_files), as
    # a JSON string: quoted, so that /runs/a never matches /runs/ab.
    marker = json.dumps(str(run_dir))

    def should_cancel() -> bool:
        stop = interrupted.is_set() or bool(cancel and cancel())
        if stop and not left:
            # Before ansible-runner kills ansible-playbook: its setsid() forks survive that.
            left.extend(forks.snapshot(os.getpid(), marker))
        return stop

    private = Path(tempfile.mkdtemp(prefix="torchfleet-runner-"))
    follower = ProgressFollower(run_dir / "progress.jsonl", deliver)
    try:
        with ctrl_c_sets(interrupted if interruptible else None):
            thread, runner = ansible_runner.run_async(
                private_data_dir=str(private), project_dir=str(root), playbook=playbook,
                inventory=str(inventory), extravars=extravars, quiet=True,
                suppress_env_files=True, event_handler=handle, cancel_callback=should_cancel,
                # The collection this package imports, whatever ansible.cfg's relative
                # collections_path finds beside an installed copy of it.
                envvars={"ANSIBLE_CONFIG": str(root / "ansible.cfg"),
                         "ANSIBLE_COLLECTIONS_PATH": str(collections_path()),
                         "ANSIBLE_NOCOLOR": "1", "PYTHONUNBUFFERED": "1", "PATH": _path(private)},
                settings={"suppress_ansible_output": True})
            while thread.is_alive():
                thread.join(0.25)
                follower.poll()
                if tick:
                    tick()
            follower.poll()
            cancelled = runner.status == "canceled" or interrupted.is_set()
            if cancelled:  # what runner's kill missed
                forks.kill_left(left + forks.stray_forks(marker))
            stdout = Path(runner.config.artifact_dir) / "stdout"
            log = stdout.read_text(errors="replace") if stdout.is_file() else ""
            (run_dir / log_name).write_text(log)
            return Outcome(status=runner.status, rc=runner.rc, cancelled=cancelled,
                           error=first_error(log) if runner.rc else "")
    finally:
        shutil.rmtree(private, ignore_errors=True)
