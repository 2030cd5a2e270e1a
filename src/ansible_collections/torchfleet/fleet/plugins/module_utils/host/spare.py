"""A spare's preparation while the run trains (module spare_prepare): one detached process
that imports torch, so a restart that takes the spare finds torch's files in its page cache."""
from __future__ import annotations

import os
import shutil
import subprocess
import time

from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import create_json

# The child: lowest priority, bounded by SIGALRM, the record written once done (argv: path,
# timeout_s, modules...). Only the standard library before the imports it is there to make.
CHILD = r'''
import json, os, signal, sys, time
path, timeout_s, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
signal.alarm(timeout_s)
os.nice(19)
began = time.time()
record = {"pid": os.getpid(), "started": round(began, 3), "imports": names}
try:
    for name in names:
        __import__(name)
    record["ok"] = True
except BaseException as exc:  # an import that raises anything: said, never more
    record.update(ok=False, error=("%s: %s" % (type(exc).__name__, exc))[:300])
record["seconds"] = round(time.time() - began, 3)
tmp = path + ".tmp"
try:
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)
except OSError:  # a full disk: no record, and no half-written file left
    try:
        os.unlink(tmp)
    except OSError:
        pass
'''


def prepare(python, path, imports, timeout_s, env=None):
    """(pid, None) with the process started, or (None, why)."""
    if not shutil.which(python):  # (ionice below would be what starts, and say nothing)
        return None, "%s: not prepared: no such interpreter on this host" % python
    argv = [python, "-c", CHILD, path, str(timeout_s)] + list(imports)
    ionice = shutil.which("ionice")
    if ionice:
        # Idle I/O: the run's own reads of the same files go first (-t: where the class cannot
        # be set, a container's, run anyway).
        argv = [ionice, "-c", "3", "-t"] + argv
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        if os.path.lexists(path):
            os.unlink(path)  # an earlier try's record is not this one's
        # In /: `python -c` puts its working directory first on sys.path (a checkout in $HOME).
        proc = subprocess.Popen(argv, cwd="/", env=dict(os.environ, **{str(k): str(v) for k, v in (env or {}).items()}),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    except OSError as exc:
        return None, "%s: not prepared: %s" % (python, exc)
    # Its PID on record at once (a child ended by its bound writes nothing), unless the child's
    # own record is there already: never replaced.
    try:
        create_json(path, {"pid": proc.pid, "started": round(time.time(), 3), "imports": list(imports)})
    except OSError:
        pass  # (FileExistsError: the child was faster)
    return proc.pid, None
