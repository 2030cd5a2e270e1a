"""The record of a detached run on the controller, runs/<run_id>/run.json, and the attach lock.

A detached run (detach=true) belongs to its hosts once every rank runs; what the controller
knew then is written here, so that attach, status, logs and stop find the run's hosts, master,
directories and settings by its id alone (`-i` is accepted, never required):

    {"version": 1, "run_id", "kind": "train" | "collective", "run_dir", "runs_root",
     "detached_at": UNIX time, "inventory": [the inventory sources],
     "master": host, "hosts": {host: {"remote_dir", "async_jid", "connection": {ansible_* vars},
                                      "settings": {public variable: value}}},
     "watch": {the watch's and the stop's settings}, "attempts": [...], "restarts": [...],
     "preflight": preflight's result,
     for a restart: "settings": {the controller's public variables}, "candidates": [the hosts
     preflight checked, in inventory order], "spares": {the others, as "hosts"},
     "excluded": [hosts a restart left out for good]}

The file is the controller user's (0600): it holds the hosts' connection variables (never a
password: CONNECTION names what is kept). `attach.lock` in the same directory holds the PID of
the ansible-playbook that owns the run's controller part (the gather, the restarts, the report):
the unattended finisher where it runs, else the first attach. Any number of other attaches
follow beside it (`follow`): they show the owner's progress, end with its report, and the first
to see the owner gone takes the lock and carries on from the record.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import time

from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import RUN_ID, create_json, write_json

RECORD = "run.json"
LOCK = "attach.lock"
KINDS = ("train", "collective")  # a run's report: <kind>.json beside its record
VERSION = 1
# What a host's connection needs, as Ansible names it; passwords are never written.
CONNECTION = ("ansible_host", "ansible_port", "ansible_user", "ansible_connection",
              "ansible_ssh_private_key_file", "ansible_ssh_common_args",
              "ansible_ssh_extra_args", "ansible_python_interpreter", "ansible_become",
              "ansible_become_method", "ansible_become_user", "python")
# The host variable (and controller fact) holding the run's recorded public variables in a play
# that continues the run from its record: the lookup torchfleet.fleet.default reads it after the
# play's own variables.
SETTINGS = "torchfleet_run_settings"
# A record bigger than this is not one torchfleet wrote (512 hosts' record is ~1 MiB).
MAX_BYTES = 64 * 1024 * 1024

ARGUMENT_SPEC = dict(
    state=dict(type="str", choices=["present", "attached", "followed", "read", "released"],
               default="attached"),
    run_id=dict(type="str", required=True),
    runs_root=dict(type="path", required=True),
    record=dict(type="dict", default={}),
    inventory_hosts=dict(type="list", elements="str", default=[]),
    owner_pid=dict(type="int"),
    stop=dict(type="bool", default=False),
    rank=dict(type="int"),
    host=dict(type="str"),
)


def run_dir(runs_root, run_id):
    if not RUN_ID.match(run_id or ""):
        raise ValueError("run_id %r is not a torchfleet run id (letters, digits, '.', '_', '-'; "
                         "as `torchfleet status` lists them)" % (run_id,))
    return os.path.join(runs_root, run_id)


def waiting(where):
    """A detached run whose report is not written yet (its record without a report): attach
    still has to gather it, and nothing may prune it."""
    where = str(where)
    return (os.path.exists(os.path.join(where, RECORD))
            and not any(os.path.exists(os.path.join(where, "%s.json" % kind)) for kind in KINDS))


def write(path, record):
    write_json(path, record, indent=1)


def read(runs_root, run_id):
    """The run's record; ValueError with the one sentence to say when there is none to use."""
    where = run_dir(runs_root, run_id)
    path = os.path.join(where, RECORD)
    if not os.path.isdir(where):
        raise ValueError("no run %s under %s; `torchfleet status` lists the runs there (or pass "
                         "-e runs_root=DIR where the run was started)" % (run_id, runs_root))
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise ValueError("run %s was not detached (%s has no %s): it was followed to its end "
                         "by the play that started it; its report is in %s"
                         % (run_id, where, RECORD, where)) from None
    try:
        record = json.loads(raw) if len(raw) <= MAX_BYTES else None
    except ValueError:
        record = None
    if not (isinstance(record, dict) and record.get("version") == VERSION
            and record.get("run_id") == run_id and isinstance(record.get("hosts"), dict)
            and record.get("master") in record["hosts"]):
        raise ValueError("%s is not a record torchfleet wrote for run %s; remove it and stop "
                         "the run with stop.yml -e run_id=%s -i <its inventory>"
                         % (path, run_id, run_id))
    return record


class Locked(Exception):
    """Another live process holds the attach lock."""

    def __init__(self, text, pid):
        super().__init__(text)
        self.pid = pid


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A killed attach whose parent is gone too waits as a zombie until init reaps it.
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _holder(path):
    """The PID in a lock file, 0 when it holds none."""
    try:
        with open(path) as f:
            holder = json.loads(f.read(4096))
        return int(holder["pid"]), holder
    except (OSError, ValueError, KeyError, TypeError):
        return 0, {}


def attached_by(where):
    """The PID of the live process attached to the run in `where`, else 0."""
    pid = _holder(os.path.join(where, LOCK))[0]
    return pid if pid and _alive(pid) else 0


def _drop_stale(path):
    if not attached_by(os.path.dirname(path)):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _serialized(where):
    """An exclusive flock on the run's directory, held while a lock is judged stale and taken
    (two attaches that both saw the same dead holder each removed the other's new lock), or
    None where the filesystem has no flock."""
    try:
        fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        os.close(fd)
        return None
    return fd


def lock(where, owner_pid):
    """Take the attach lock for owner_pid; Locked naming the holder when it lives."""
    path = os.path.join(where, LOCK)
    guard = _serialized(where)
    try:
        for _attempt in range(2):
            try:
                create_json(path, {"pid": owner_pid, "since": time.time()})  # never seen empty
            except OSError as exc:
                if exc.errno != errno.EEXIST:
                    raise
                pid, holder = _holder(path)
                if pid and pid != owner_pid and _alive(pid):
                    raise Locked("run %s is already attached (process %d follows it, since %s); "
                                 "wait for it, or stop the run" % (
                                     os.path.basename(where), pid,
                                     time.strftime("%H:%M:%S", time.localtime(
                                         float(holder.get("since") or 0)))), pid) from None
                try:  # the holder is gone: its lock is stale
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                continue
            return path
        raise ValueError("cannot take the attach lock %s: another attach keeps taking it" % path)
    finally:
        if guard is not None:
            os.close(guard)  # (closing releases the flock)


def release(where, owner_pid):
    path = os.path.join(where, LOCK)
    if _holder(path)[0] == owner_pid:
        try:
            os.unlink(path)
            return True
        except FileNotFoundError:
            pass
    return False


# The progress lines a follower reads from the owner's watch at one poll, at most.
PROGRESS_READ_BYTES = 1024 * 1024


def report_path(where, record):
    return os.path.join(where, "%s.json" % record.get("kind"))


def read_report(path):
    """{ok, verdict} of a written report (bounded; a report it cannot read is not ok)."""
    try:
        with open(path, "rb") as f:
            report = json.loads(f.read(MAX_BYTES))
    except (OSError, ValueError):
        report = None
    if not isinstance(report, dict):
        return {"ok": False, "verdict": "%s cannot be read as a torchfleet report" % path}
    return {"ok": report.get("ok") is True, "verdict": str(report.get("verdict") or "")}


class ProgressLines:
    """A run's progress.jsonl (one JSON line per look its watch makes), read from its end at
    the reader's start: only what is new is shown, however long the run has been going. The
    one reader of that file (an attach that follows another, the API's events)."""

    def __init__(self, path):
        self.path, self.partial = path, b""
        try:
            self.offset = os.path.getsize(path)
        except OSError:
            self.offset = 0

    def new_lines(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(PROGRESS_READ_BYTES)
        except OSError:
            return []
        self.offset += len(data)
        parts = (self.partial + data).split(b"\n")
        self.partial = parts.pop()[-PROGRESS_READ_BYTES:]
        lines = []
        for part in parts:
            try:
                line = json.loads(part)
            except ValueError:
                continue
            if isinstance(line, dict):
                lines.append(line)
        return lines


def follow(runs_root, record, owner_pid, on_progress=None, poll_s=0.5, sleep=time.sleep):
    """Follow a run whose controller part another live process owns (it holds the lock),
    showing that owner's progress (on_progress(line) for each line its watch appends), until
    the owner has written the run's report ({"reported": path, "report": {ok, verdict}}) or
    is gone: then the lock is taken here and the run's record read again, as a restart may have
    rewritten it ({"followed_by": 0, "record": ...}: this process carries on as the owner; a
    gather the dead owner left half done is done again, the attempt it started is followed)."""
    where = run_dir(runs_root, record["run_id"])
    progress = ProgressLines(os.path.join(where, "progress.jsonl"))
    report = report_path(where, record)
    reported = {"reported": report, "followed_by": 0, "record": record}
    while True:
        for line in progress.new_lines():
            if on_progress is not None:
                on_progress(line)
        if os.path.exists(report):
            return dict(reported, report=read_report(report))
        if not attached_by(where):
            try:
                lock(where, owner_pid)
            except Locked:
                sleep(poll_s)  # another follower took over first: follow it
                continue
            if os.path.exists(report):  # written as the owner ended: nothing left to do
                release(where, owner_pid)
                return dict(reported, report=read_report(report))
            return {"reported": "", "followed_by": 0,
                    "record": read(runs_root, record["run_id"])}
        sleep(poll_s)


def hosts_in_rank_order(record):
    """The run's hosts, node rank 0 first (preflight's nodes; the record's order else)."""
    nodes = (record.get("preflight") or {}).get("nodes") or []
    order = [n.get("host") for n in nodes if isinstance(n, dict)]
    return order if sorted(order) == sorted(record["hosts"]) else list(record["hosts"])


def place(record, rank=None, host=None):
    """Where a rank's log is: {host, local_rank, rank}; rank 0 when neither is given, a host's
    first local rank with host alone. ValueError with the sentence for a rank or host the run
    does not have."""
    order = hosts_in_rank_order(record)
    try:
        nproc = max(1, int((record.get("watch") or {}).get("nproc_per_node") or 1))
    except (TypeError, ValueError):
        nproc = 1
    world = nproc * len(order)
    if host is not None:
        if host not in order:
            raise ValueError("run %s has no host %s; its hosts: %s" % (
                record["run_id"], host, ", ".join(order[:8]) + (" ..." if len(order) > 8 else "")))
        first = order.index(host) * nproc
        if rank is None:
            rank = first
        elif not first <= rank < first + nproc:
            raise ValueError("rank %d does not run on %s (its ranks are %d to %d)"
                             % (rank, host, first, first + nproc - 1))
    rank = 0 if rank is None else rank
    if not 0 <= rank < world:
        raise ValueError("run %s has ranks 0 to %d; rank %d is not one of them"
                         % (record["run_id"], world - 1, rank))
    return {"host": order[rank // nproc], "local_rank": rank % nproc, "rank": rank}


def decide(p, on_progress=None):
    """run_record's answer; on_progress(line) sees the owner's progress while state followed
    waits. Its paths are absolute: a relative runs root is the one ansible-playbook was started
    in (this runs in its process), and the tasks that use them (a copy) run elsewhere."""
    p = dict(p, runs_root=os.path.abspath(p["runs_root"]))
    where = run_dir(p["runs_root"], p["run_id"])
    owner = p["owner_pid"] or os.getppid()
    if p["state"] == "present":
        record = dict(p["record"], version=VERSION, run_id=p["run_id"], detached_at=time.time())
        write(os.path.join(where, RECORD), record)
        return {"file": os.path.join(where, RECORD), "record": {}}
    if p["state"] == "released":
        return {"file": os.path.join(where, LOCK), "record": {},
                "released": release(where, owner)}
    record = read(p["runs_root"], p["run_id"])
    if p["state"] == "read":  # status and logs: no lock
        report = report_path(where, record)
        return {"file": os.path.join(where, RECORD), "record": record,
                "reported": report if os.path.exists(report) else "",
                "place": place(record, p["rank"], p["host"])}
    known = set(p["inventory_hosts"])
    if known:
        missing = [h for h in record["hosts"] if h not in known]
        if missing:
            raise ValueError("run %s ran on %s, which the inventory given does not hold; attach "
                             "without -i (the run's record names its hosts) or with the "
                             "inventory the run was started with (%s)" % (
                                 p["run_id"], ", ".join(missing[:5]),
                                 ", ".join(record.get("inventory") or ["unknown"])))
    report = report_path(where, record)
    if p["state"] == "followed":
        return dict(follow(p["runs_root"], record, owner, on_progress),
                    file=os.path.join(where, RECORD))
    if os.path.exists(report):  # gathered already: nothing to follow, nothing to lock
        _drop_stale(os.path.join(where, LOCK))  # the attach that reported failed the play
        return {"file": os.path.join(where, RECORD), "record": record, "reported": report}
    answer = {"file": os.path.join(where, RECORD), "record": record, "reported": "",
              "followed_by": 0}
    try:
        lock(where, owner)
    except Locked as exc:
        # The owner gathers and reports the run; this attach follows it (state followed), a
        # stop asks the master to stop and leaves the rest to the owner.
        answer["followed_by"] = exc.pid
    return answer
