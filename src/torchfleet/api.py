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
from pathlib import Path
from typing import Any, Callable

from ansible_collections.torchfleet.fleet.plugins.module_utils import report as _report
from ansible_collections.torchfleet.fleet.plugins.module_utils import rundir as _rundir

from torchfleet.paths import ansible_root
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
    """The playbooks' run directory contract (plugins/module_utils/report.py): its mode, and
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
    """Stop run `run_id` (every torchfleet run when None) on every host, by recorded PID."""
    if run_id is not None and not RUN_ID.match(str(run_id)):
        raise ValueError("run_id %r is not a torchfleet run id" % run_id)
    return _stop(run_id, _inventory(inventory), runs_root, on_event, variables,
                 interruptible=True)


def _stop(run_id: str | None, inv: Path, runs_root: str | Path | None,
          on_event: EventHandler | None, variables: dict[str, Any], *,
          interruptible: bool) -> Result:
    extravars = _extravars(variables)
    if run_id is not None:
        extravars["run_id"] = str(run_id)
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
