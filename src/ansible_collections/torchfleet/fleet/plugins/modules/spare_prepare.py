#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: spare_prepare
short_description: Import torch on a spare host while the run trains, so a restart that takes it starts warm
description:
  - Starts one Python process on the host, detached from the task, at the lowest CPU priority
    and in the idle I/O class (C(ionice -c 3) where it exists), in C(/) with the run's O(env),
    that imports O(imports) and exits; the module returns at once. A spare's
    first import of torch is cold (preflight reads torch's version from its files and never
    imports it, and on a GPU host torch is several GB of CUDA libraries), while every survivor of a failed
    attempt has torch in its page cache, so without this the replacement's import would set the
    pace of the restarted rendezvous.
  - The process writes what it did to O(path) (JSON, replaced atomically) - its PID when it
    starts, then whether the imports succeeded, the error when not, and the seconds they took -
    and bounds itself with O(timeout_s) (SIGALRM, whose default action ends it).
  - Best effort, never a failure of the run; a missing interpreter or a directory that cannot be
    made is RV(prepared=false) with RV(msg), and the restart's re-check probes the spare anyway.
version_added: "0.1.0"
author: torchfleet developers (@torchfleet)
options:
  python:
    description: The interpreter the run's ranks use on this host (its preflight probe's).
    type: path
    required: true
  path:
    description: Where the process writes its record (the spare's directory of the run).
    type: path
    required: true
  imports:
    description: Modules to import, in order.
    type: list
    elements: str
    default: [torch, torch.distributed]
  env:
    description: The environment the run's ranks get on top of the host's (the public variable
      C(env)), so the imports find what the ranks will (PYTHONPATH, LD_LIBRARY_PATH).
    type: dict
    default: {}
  timeout_s:
    description: The process ends itself after this many seconds, done or not.
    type: int
    default: 300
attributes:
  check_mode:
    support: full
    details: In check mode nothing is started.
  diff_mode:
    support: none
  platform:
    platforms: posix
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
"""

EXAMPLES = r"""
- name: Import torch on the spare, detached
  torchfleet.fleet.spare_prepare:
    python: /opt/venv/bin/python
    path: ~/.torchfleet/runs/20261128-101500-ab12/node5/spare_prepare_0.json
"""

RETURN = r"""
prepared:
  description: Whether the process was started.
  returned: always
  type: bool
  sample: true
pid:
  description: The process's PID; null when none was started.
  returned: always
  type: int
  sample: 4242
record:
  description: Its record's path, O(path) expanded.
  returned: always
  type: str
  sample: /home/u/.torchfleet/runs/20261128-101500-ab12/node5/spare_prepare_0.json
"""

import json
import os
import shutil
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule

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
        argv = [ionice, "-c", "3"] + argv  # idle I/O: the run's own reads of the same files go first
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
    # own record is there already: linked, never replaced.
    first = path + ".pid.tmp"
    try:
        fd = os.open(first, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"pid": proc.pid, "started": round(time.time(), 3), "imports": list(imports)}, f)
        os.link(first, path)
    except OSError:
        pass  # (FileExistsError: the child was faster)
    finally:
        try:
            os.unlink(first)
        except OSError:
            pass
    return proc.pid, None


def main():
    module = AnsibleModule(argument_spec=dict(
        python=dict(type="path", required=True),
        path=dict(type="path", required=True),
        imports=dict(type="list", elements="str", default=["torch", "torch.distributed"]),
        env=dict(type="dict", default={}),
        timeout_s=dict(type="int", default=300),
    ), supports_check_mode=True)
    p = module.params
    path = os.path.abspath(os.path.expanduser(p["path"]))
    if p["timeout_s"] < 1:
        module.fail_json(msg="timeout_s must be at least 1 (it is %s)" % p["timeout_s"])
    if module.check_mode:
        module.exit_json(changed=False, prepared=False, pid=None, record=path)
    pid, why = prepare(p["python"], path, p["imports"], p["timeout_s"], p["env"])
    if pid is None:
        module.exit_json(changed=False, prepared=False, pid=None, record=path, msg=why)
    module.exit_json(changed=True, prepared=True, pid=pid, record=path)


if __name__ == "__main__":
    main()
