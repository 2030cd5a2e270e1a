"""torchfleet from Python: preflight, collective, train and stop, each a playbook run through
ansible-runner that returns a typed Result.

    import torchfleet
    result = torchfleet.preflight(nnodes=2)
    if not result.ok:
        for check in result.failures:
            print(check.host, check.id, check.detail, check.fix)

The playbooks' public variables (nnodes, master_port, socket_ifname, code_dir, data_paths,
script, ...) are keyword arguments with the types and defaults of the roles' argument specs
(torchfleet/variables.py; help(torchfleet.train) lists them), checked before anything runs;
any other variable goes in variables={...}. A failing check or run returns ok=False; only
misuse of the API raises (ValueError / TypeError).
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Callable

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults as _defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import detach as _detach
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import report as _report
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import rundir as _rundir

from torchfleet.paths import ansible_root
from torchfleet import rundirs as _rundirs
from torchfleet.results import Check, Host, Result, load
from torchfleet.runner import Event, run_playbook
from torchfleet.variables import typed

# One definition of a run id and how one is made, shared with the modules (run_plan).
RUN_ID, new_run_id = _rundir.RUN_ID, _rundir.new_run_id
VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Set by the API itself from its own arguments.
RESERVED = {"run_id", "run_dir"}

EventHandler = Callable[[Event], None]
CancelCheck = Callable[[], bool]


def default_inventory() -> Path:
    """The embedded default: two nodes on this machine over loopback (gloo, CPU)."""
    return ansible_root() / "inventory" / "local.yml"




def _inventory(inventory: str | Path | None) -> Path:
    if inventory is None:
        return default_inventory()
    path = Path(inventory).expanduser()
    if not path.exists():
        raise ValueError("inventory %s does not exist; pass the path of an Ansible inventory "
                         "(see inventory/example-cluster.yml) or None for the embedded default"
                         % path)
    return path.resolve()


def _make_run_dir(run_dir: Path, runs_root: Path | None = None) -> None:
    """The playbooks' run directory contract (plugins/module_utils/reports/report.py): its mode, and
    runs_root/latest pointed at it."""
    try:
        _report.make_run_dir(str(run_dir), str(runs_root) if runs_root else None)
    except OSError as exc:
        raise ValueError("cannot create the run directory %s (%s); pass runs_root= a directory "
                         "you can write" % (run_dir, exc.strerror or exc)) from exc


def _runs_root(runs_root: str | Path | None) -> Path:
    return (Path(runs_root) if runs_root else Path.cwd() / "runs").expanduser().resolve()


def _extravars(variables: dict[str, Any]) -> dict[str, Any]:
    for key, value in variables.items():
        if not VAR_NAME.match(key):
            raise ValueError("variable %r is not a valid Ansible variable name" % key)
        if key in RESERVED:
            raise ValueError("%s is set through the run_id= / runs_root= arguments" % key)
        try:
            json.dumps(value)
        except TypeError as exc:
            raise TypeError("variable %s=%r is not JSON-serialisable; pass numbers, strings, "
                            "lists or dicts" % (key, value)) from exc
    return {k: v for k, v in variables.items() if v is not None}


def _run(kind: str, playbook: str, inventory, runs_root, run_id, on_event, cancel,
         variables) -> Result:
    if run_id is not None and not RUN_ID.match(str(run_id)):
        raise ValueError("run_id %r cannot name a directory: use letters, digits, '.', '_' and "
                         "'-' (at most 64)" % run_id)
    if on_event is not None and not callable(on_event):
        raise TypeError("on_event must be callable(Event)")
    if cancel is not None and not callable(cancel):
        raise TypeError("cancel must be callable() -> bool")
    inv = _inventory(inventory)
    extravars = _extravars(variables)
    run_id = str(run_id or new_run_id())
    root = _runs_root(runs_root)
    run_dir = root / run_id
    _make_run_dir(run_dir, root)
    # The playbook chooses runs_root/run_id itself, as for a run started by hand.
    extravars.update(run_id=run_id, runs_root=str(root))
    outcome = run_playbook(playbook, inventory=inv, extravars=extravars, run_dir=run_dir,
                           on_event=on_event, cancel=cancel)
    if outcome.cancelled and kind in ("train", "collective"):
        # ansible-runner stopped ansible-playbook only; torchrun runs on as async jobs.
        # Ctrl-C is ignored until it ends: an interrupted clean-up would leave them running.
        _stop(run_id, inv, run_dir.parent, None, {}, interruptible=False)
    result = load(run_dir, kind)
    if kind != "preflight" and not outcome.cancelled and outcome.status == "successful" and \
            _detach.waiting(run_dir):
        # Detached: every rank runs; the report comes with attach(run_id).
        result = Result(kind=kind, ok=True, run_id=run_id, run_dir=run_dir, detached=True,
                        preflight=load(run_dir, "preflight"))
    if result is None:
        detail = ("cancelled before %s.json was written" % kind if outcome.cancelled else
                  "ansible-playbook ended (%s, rc %s) before writing %s.json%s; see %s"
                  % (outcome.status, outcome.rc, kind,
                     ": " + outcome.error if outcome.error else "", run_dir / "ansible.log"))
        result = Result(kind=kind, ok=False, run_id=run_id, run_dir=run_dir, checks=[
            Check("controller", "run.cancelled" if outcome.cancelled else "ansible.error",
                  False, detail, "" if outcome.cancelled else
                  "read ansible.log; run the same playbook with -vvv")])
    elif outcome.cancelled:
        result.ok = False
        result.checks.append(Check("controller", "run.cancelled", False,
                                   "cancelled; torchrun was stopped on every host"))
    result.cancelled = outcome.cancelled
    result.ansible_status, result.ansible_rc = outcome.status, outcome.rc
    return result


@typed
def preflight(inventory: str | Path | None = None, *, on_event: EventHandler | None = None,
              cancel: CancelCheck | None = None, runs_root: str | Path | None = None,
              run_id: str | None = None, **variables: Any) -> Result:
    """Check every host of group `nodes`; changes nothing on any host."""
    return _run("preflight", "preflight.yml", inventory, runs_root, run_id, on_event, cancel,
                variables)


@typed
def collective(inventory: str | Path | None = None, *, on_event: EventHandler | None = None,
               cancel: CancelCheck | None = None, runs_root: str | Path | None = None,
               run_id: str | None = None, **variables: Any) -> Result:
    """Preflight, then the collective test under torchrun; result.busbw holds the table."""
    return _run("collective", "collective.yml", inventory, runs_root, run_id, on_event, cancel,
                variables)


@typed
def train(inventory: str | Path | None = None, *, on_event: EventHandler | None = None,
          cancel: CancelCheck | None = None, runs_root: str | Path | None = None,
          run_id: str | None = None, **variables: Any) -> Result:
    """Preflight, then torchrun with `script` (the built-in DDP job by default) on every host.

    cancel() returning True, or Ctrl-C, stops torchrun on every host before this returns."""
    return _run("train", "train.yml", inventory, runs_root, run_id, on_event, cancel, variables)


def stop(run_id: str | None = None, inventory: str | Path | None = None, *,
         runs_root: str | Path | None = None, on_event: EventHandler | None = None,
         **variables: Any) -> Result:
    """Stop run `run_id` (every torchfleet run when None) on every host, by recorded PID.

    A detached run is asked to stop through its master, then gathered and reported as
    attach() does: the Result is its report (run.stopped_by_user)."""
    if run_id is not None and not RUN_ID.match(str(run_id)):
        raise ValueError("run_id %r is not a torchfleet run id" % run_id)
    root = _runs_root(runs_root)
    detached = run_id is not None and _detach.waiting(root / str(run_id))
    result = _stop(run_id, _inventory(inventory), root, on_event, variables,
                   interruptible=True)
    if detached:
        # Another attach (the controller's unattended finisher) followed the run: it gathers
        # and reports it once every host has stopped.
        end = time.monotonic() + _defaults.STOP_REPORT_WAIT_S
        while (_detach.waiting(root / str(run_id)) and _detach.attached_by(str(root / str(run_id)))
               and time.monotonic() < end):
            time.sleep(0.5)
    gathered = load(root / str(run_id), None) if detached else None
    if gathered is not None and gathered.kind != "preflight":
        gathered.ansible_status, gathered.ansible_rc = result.ansible_status, result.ansible_rc
        return gathered
    return result


def _record(run_id: str, root: Path) -> dict:
    try:
        return _detach.read(str(root), str(run_id))
    except ValueError:
        if _rundirs.report_of(root / str(run_id))[0]:
            return {}  # an attached run that ended: its report says everything
        raise


def attach(run_id: str, inventory: str | Path | None = None, *,
           runs_root: str | Path | None = None, on_event: EventHandler | None = None,
           cancel: CancelCheck | None = None) -> Result:
    """Follow a detached run to its end (live progress through on_event), then stop what is
    left, gather every host, restart it where a host failed it (its max_restarts, spares) and
    write its report: the Result an attached run would have had. Where another attach owns the
    run (the controller's unattended finisher, an earlier attach), this one follows beside it
    and returns the report it writes; it takes over when that owner is gone.
    A run gathered already returns its report at once. cancel() or Ctrl-C ends the attach and
    leaves the run running (Result.cancelled). The run's hosts come from its record; an
    inventory given must hold them."""
    root = _runs_root(runs_root)
    record = _record(run_id, root)
    run_dir = root / str(run_id)
    if not record or not _detach.waiting(run_dir):
        done = load(run_dir, record.get("kind") if record else None)
        if done is None:
            raise ValueError("run %s has no report in %s" % (run_id, run_dir))
        return done
    extravars: dict[str, Any] = {"run_id": str(run_id), "runs_root": str(root),
                                 "attach_check_inventory": inventory is not None}
    outcome = run_playbook("attach.yml", inventory=_inventory(inventory), extravars=extravars,
                           run_dir=run_dir, on_event=on_event, cancel=cancel,
                           log_name="ansible-attach.log")
    result = load(run_dir, record["kind"])
    if result is None or result.kind != record["kind"]:  # (load falls back on the preflight)
        why = ("attach cancelled" if outcome.cancelled else "attach ended (%s%s)" % (
            outcome.status, ": " + outcome.error if outcome.error else ""))
        result = Result(kind=record["kind"], ok=False, run_id=str(run_id), run_dir=run_dir,
                        detached=True, checks=[Check(
                            "controller", "run.cancelled" if outcome.cancelled else
                            "ansible.error", False,
                            "%s before the run's end; the detached run goes on (see %s)"
                            % (why, run_dir / "ansible-attach.log"),
                            "" if outcome.cancelled else "torchfleet attach %s" % run_id)])
    result.cancelled = outcome.cancelled
    result.ansible_status, result.ansible_rc = outcome.status, outcome.rc
    return result


def runs(runs_root: str | Path | None = None) -> list[_rundirs.RunListing]:
    """The runs under runs_root (./runs), oldest first, with their phase as the controller
    knows it (a detached run's live phase: status(run_id))."""
    return _rundirs.list_runs(_runs_root(runs_root))


def status(run_id: str, inventory: str | Path | None = None, *,
           runs_root: str | Path | None = None) -> _rundirs.RunStatus:
    """A run at a glance: one look at its master's record while it goes on (renewing
    nothing), its report once it was gathered."""
    root = _runs_root(runs_root)
    record = _record(run_id, root)
    run_dir = root / str(run_id)
    kind, report = _rundirs.report_of(run_dir)
    if report:
        return _rundirs.from_report(str(run_id), kind, report)
    looked: dict[str, dict] = {}

    def collect(action: str, host: str, res: dict) -> None:
        if action == "torchrun_watch":
            looked["res"] = res

    outcome = run_playbook("status.yml", inventory=_inventory(inventory),
                           extravars={"run_id": str(run_id), "runs_root": str(root)},
                           run_dir=run_dir, on_module_result=collect,
                           log_name="ansible-status.log")
    res = looked.get("res") or {}
    if not res.get("status"):
        why = res.get("msg") or outcome.error or "no record on the master %s yet" % record[
            "master"]
        raise ValueError("status of run %s: %s (see %s)" % (
            run_id, why, run_dir / "ansible-status.log"))
    return _rundirs.from_view(record["kind"], res["status"])


def logs(run_id: str, inventory: str | Path | None = None, *, rank: int | None = None,
         host: str | None = None, tail: int = 50, follow: bool = False,
         runs_root: str | Path | None = None,
         on_text: Callable[[str], None] | None = None) -> str:
    """A rank's log (rank 0, or `host`'s first rank, by default): read on its host while the
    run goes on, from runs/<id>/logs once it was gathered. follow reads on until that host's
    part of the run ends, handing each new piece to on_text as it comes."""
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise ValueError("rank must be a whole number >= 0, not %r" % (rank,))
    if not isinstance(tail, int) or tail < 0:
        raise ValueError("tail must be a whole number of lines >= 0, not %r" % (tail,))
    root = _runs_root(runs_root)
    record = _record(run_id, root)
    run_dir = root / str(run_id)
    kind, report = _rundirs.report_of(run_dir)
    if report:
        text = _rundirs.gathered_log(run_dir, report, rank, host, tail)
        if on_text:
            on_text(text)
        return text
    _detach.place(record, rank, host)  # a rank or host the run does not have: said here
    sink = run_dir / ("logs-follow-%s.txt" % new_run_id())
    extravars: dict[str, Any] = {"run_id": str(run_id), "runs_root": str(root), "tail": tail,
                                 "follow": follow, "dest": str(sink)}
    if rank is not None:
        extravars["rank"] = rank
    if host is not None:
        extravars["host"] = host
    pieces: list[str] = []

    def take(text: str) -> None:
        pieces.append(text)
        if on_text:
            on_text(text)

    reader = _Tail(sink, take)
    try:
        outcome = run_playbook("logs.yml", inventory=_inventory(inventory), extravars=extravars,
                               run_dir=run_dir, on_event=lambda _event: reader.poll(),
                               log_name="ansible-logs.log", tick=reader.poll)
        reader.poll()
    finally:
        sink.unlink(missing_ok=True)
    if outcome.status != "successful" and not outcome.cancelled:
        raise ValueError("logs of run %s: %s (see %s)" % (
            run_id, outcome.error or "the read failed", run_dir / "ansible-logs.log"))
    return "".join(pieces)


class _Tail:
    """Hands on what a file gained since the last poll."""

    def __init__(self, path: Path, emit: Callable[[str], Any]):
        self.path, self.emit, self.offset = path, emit, 0

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        if data:
            self.offset += len(data)
            self.emit(data.decode("utf-8", "replace"))


def _stop(run_id: str | None, inv: Path, runs_root: str | Path | None,
          on_event: EventHandler | None, variables: dict[str, Any], *,
          interruptible: bool) -> Result:
    extravars = _extravars(variables)
    if run_id is not None:
        extravars["run_id"] = str(run_id)
    extravars["runs_root"] = str(_runs_root(runs_root))  # where a detached run's record is
    log_dir = _runs_root(runs_root) / ("stop-" + new_run_id())
    _make_run_dir(log_dir)
    stopped: dict[str, list] = {}

    def collect(action: str, host: str, res: dict) -> None:
        if action == "torchrun_stop":
            stopped[host] = res.get("stopped", [])

    outcome = run_playbook("stop.yml", inventory=inv, extravars=extravars, run_dir=log_dir,
                           on_event=on_event, on_module_result=collect,
                           interruptible=interruptible)
    hosts = [Host(host=h, outcome=("stopped %d process(es) of %s" % (
        sum(len(r["processes"]) for r in runs), ", ".join(r["run_id"] for r in runs))
        if runs else "nothing running")) for h, runs in sorted(stopped.items())]
    return Result(kind="stop", ok=outcome.status == "successful", run_id=run_id or "",
                  run_dir=log_dir, hosts=hosts, ansible_status=outcome.status,
                  ansible_rc=outcome.rc)
