"""Layout of one run's directory on a host, shared by the launch, watch, stop and results
modules:

    <runs_root>/<run_id>/<inventory_hostname>/
        torchrun.pid    {"pid", "run_id", "argv", "started"}
        exitcode.json   {"rc", "reason", "ended"} once torchrun ended
        control.json    on the master: the run's state record (runstate.py), kept by its agent
        lease           on the master: made and touched by the controller's watch at each
                        look; stale means the controller is gone
        detached        on the master: the run was detached (detach=true); its lease is off
                        and the master judges the run alone
        guarded         this host's guard_ports table is up (the agent removes the table and
                        this file when it ends; stop.yml removes what a killed agent left)
        start_failed.json  on the master: {host: Ansible's reason} of the hosts whose start
                        task failed, written by the watch's look for the run's store
        agent.log       on the master: what its store decided and refused, one line each
        torchrun.log    torchrun's own output
        logs/<rdzv>/attempt_<n>/<local_rank>/{stdout,stderr}.log   per rank (torchrun --log-dir)
        results/rank-<RANK>.json                                    per rank (the workloads)
        attempt_<n>/    a restarted run's attempt n >= 1 (max_restarts): the same layout
"""
from __future__ import annotations

import errno
import glob
import json
import os
import random
import re
import time
from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults

# A run id names a directory on every host: no separators, no glob characters, no dot first.
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def new_run_id():
    """UTC time to the second and 16 random bits: sortable, and two runs started in the same
    second (two users, two API calls) still get different directories."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-%04x" % random.randrange(65536)


PIDFILE = "torchrun.pid"
EXITCODE = "exitcode.json"
CONTROL = "control.json"
LEASE = "lease"
START_FAILED = "start_failed.json"
STOP_REQUEST = "stop_request.json"  # the controller is ending: the master stops the run now
DETACHED = "detached"
GUARDED = "guarded"
AGENT_LOG = "agent.log"
TORCHRUN_LOG = "torchrun.log"
LOGS = "logs"
ATTEMPT_GLOB = "attempt_[0-9]*"
RESULTS = "results"
STACK_DUMP = "py-spy-dump.txt"

# The torchrun_stop module's arguments (stop.py does the work).
STOP_SPEC = dict(
    runs_root=dict(type="path", required=True),
    run_id=dict(type="str"),
    host_dir=dict(type="str"),
    grace_s=dict(type="float", default=defaults.STOP_GRACE_S),
    async_jid=dict(type="str"),
    async_dir=dict(type="path", default="~/.ansible_async"),
)

# The rank_results module's arguments (dest is its action plugin's), validated by both. With
# stop, the host's run is stopped first: stop and gather cost one module run per host, not two.
RANK_RESULTS_SPEC = dict(
    run_dir=dict(type="path", required=True),
    max_log_bytes=dict(type="int", default=1 << 20),
    dest=dict(type="str"),
    stop=dict(type="dict", options=STOP_SPEC),
)


def _beside(path):
    """A name beside path that no other writer uses: two writers of one file (two looks, an
    agent and a look) with one shared temporary name would truncate each other's half-written
    file, and the second one's rename would find it gone (FileNotFoundError)."""
    return "%s.%d.%s.tmp" % (path, os.getpid(), os.urandom(4).hex())


def write_json(path, data, mode=0o600, indent=None):
    """Replace path with data: written beside it and renamed into place, so a reader (another
    process: the watch's look, status, a test) sees the old file or the new one, whole, and a
    writer beside this one changes nothing of it."""
    replace_text(path, json.dumps(data, indent=indent), mode)


def replace_text(path, text, mode=0o600, sync=False):
    """write_json's replace-in-place of any text. sync: the file's bytes and then the rename
    reach the disk before it returns (what a crash must not leave half: the ledger's textfile).
    A failed write leaves nothing beside path."""
    tmp = _beside(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "w") as f:
            os.fchmod(fd, mode)  # (the umask does not decide who may read it)
            f.write(text)
            if sync:
                f.flush()
                os.fsync(f.fileno())  # the rename never points at a file still in the page cache
        os.replace(tmp, path)
        if sync:
            dirfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
            try:
                os.fsync(dirfd)  # and the rename itself survives a crash
            finally:
                os.close(dirfd)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# A filesystem without hard links (vfat, some FUSE mounts) says one of these to os.link.
NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV}


def create_json(path, data):
    """Create path holding data, or raise FileExistsError: written beside it and linked into
    place, so no reader ever sees it empty or half written. Without hard links: created
    exclusively, then written."""
    tmp = _beside(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        try:
            os.link(tmp, path)
            return
        except OSError as exc:
            if exc.errno not in NO_LINKS:
                raise
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)


def read_json(path, max_bytes=64 << 20):
    """A JSON file's value; None when missing, unreadable, larger than max_bytes or garbled."""
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
        return None if len(data) > max_bytes else json.loads(data)
    except (OSError, ValueError, RecursionError):
        return None


def rank_dirs(run_dir):
    """{local_rank: directory} of the latest torchrun attempt."""
    attempts = glob.glob(os.path.join(run_dir, LOGS, "*", "attempt_*"))
    if not attempts:
        return {}
    latest = max(attempts, key=lambda a: int(a.rsplit("_", 1)[1]))
    dirs = {}
    for entry in os.listdir(latest):
        if entry.isdigit():
            dirs[int(entry)] = os.path.join(latest, entry)
    return dict(sorted(dirs.items()))


def tail_bytes(path, max_bytes):
    """(the last max_bytes bytes of a file, its size); OSError when it cannot be read."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - max_bytes))
        return f.read(), size


def tail(path, lines=20, max_bytes=16384):
    """The last `lines` lines of a text file ('' when missing)."""
    try:
        data = tail_bytes(path, max_bytes)[0].decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


FAILURE_RE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def failed_ranks(torchrun_log_text):
    """[{rank, local_rank, exitcode}] from torchrun's ChildFailedError summary."""
    seen = []
    for rank, local_rank, code in FAILURE_RE.findall(torchrun_log_text):
        item = {"rank": int(rank), "local_rank": int(local_rank), "exitcode": int(code)}
        if item not in seen:
            seen.append(item)
    return seen


def root_cause(torchrun_log_text):
    """{rank, local_rank, exitcode} torchrun names as the root cause (first observed failure),
    else the first failure it lists, else None."""
    marker = torchrun_log_text.rfind("Root Cause")
    found = failed_ranks(torchrun_log_text[marker:] if marker >= 0 else torchrun_log_text)
    return found[0] if found else None


# How a rank dies when another rank went away first: its connection to that rank closed or
# reset, or its collective timed out waiting for it (gloo, NCCL, c10d's store). Such a death is
# a consequence of a failure elsewhere, never the first failure while a cause is known.
# (Recorded texts: tests/fixtures/ranks/.)
PEER_LOSS = re.compile(
    r"Connection closed by (?:remote )?peer|Connection reset by peer|Broken pipe"
    r"|Connection refused|ncclRemoteError|remote process exited|NCCL communicator was aborted"
    r"|DistNetworkError|recvValue failed|recvBytes failed|Socket Timeout"
    r"|Timed out waiting|Watchdog caught collective operation timeout", re.I)
# The rank's own failure, though torch raises it as a network error: its port is taken.
OWN_NETWORK_ERROR = re.compile(r"EADDRINUSE|failed to listen on any local network address",
                               re.I)
# The line a Python traceback ends with ("[rank3]: " where torchrun prefixes the rank's lines).
EXCEPTION_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?[A-Za-z_][\w.]*(?:Error|Exception):",
                            re.M)
# Python's words between two exceptions of one chain (traceback.py): the one raised in an
# `except` block, or `raise ... from` it. A user's RuntimeError wrapping a collective's
# DistBackendError is the same death as the DistBackendError.
CHAINED = re.compile(r"The above exception was the direct cause of the following exception"
                     r"|During handling of the above exception, another exception occurred")
# How much of a failed rank's stderr peer_loss reads: a chain of two tracebacks with NCCL's
# "Last error" lines and torchrun's prefixes is ~60 lines; bounded in bytes as every tail.
PEER_TAIL_LINES, PEER_TAIL_BYTES = 200, 1 << 16


def peer_loss(rank_stderr_tail):
    """Whether a failed rank's last lines say it died because another rank went away. The
    rank's last exception is read with every exception chained to it ("The above exception
    was the direct cause ...", "During handling of the above exception ..."), and what
    follows it (NCCL's "Last error"): a collective's error anywhere in that chain is the
    death's cause, whatever the user's code wrapped it in. A warning about a peer printed
    before the rank's own error (a traceback of its own, not chained) does not make that error
    a consequence."""
    text = rank_stderr_tail or ""
    starts = [m.start() for m in EXCEPTION_LINE.finditer(text)]
    first = len(starts) - 1
    # Back through the chain: an exception whose traceback follows the one before it by
    # Python's chaining words belongs with it (the tail's first one may have lost its start:
    # the chain's words before it keep the tail's beginning).
    while first > 0 and CHAINED.search(text, starts[first - 1], starts[first]):
        first -= 1
    if first == 0 and CHAINED.search(text, 0, starts[0]):
        first = -1
    scope = text[starts[first]:] if starts and first >= 0 else text
    return bool(PEER_LOSS.search(scope)) and not OWN_NETWORK_ERROR.search(scope)


def peer_loss_of(rank_dir):
    """peer_loss() of a rank's stderr.log in its directory (False where there is none)."""
    if not rank_dir:
        return False
    return peer_loss(tail(os.path.join(rank_dir, "stderr.log"), PEER_TAIL_LINES,
                          PEER_TAIL_BYTES))
