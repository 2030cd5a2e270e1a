"""How a hung rank's stacks are taken, on every host and for every user.

py-spy reads a rank's frames from outside, which needs ptrace: as root, or as the ranks' user
under Yama's ptrace_scope 0 (or without Yama), or with py-spy carrying CAP_SYS_PTRACE under
ptrace_scope 1 and 2 (Ubuntu's default is 1, where a user may trace only its own descendants:
py-spy cannot attach to ranks it did not start); ptrace_scope 3 forbids it to everyone.

Where py-spy cannot attach (or is not installed), the ranks dump their own Python stacks: every
process of the run starts with a sitecustomize, first on its PYTHONPATH, that registers
faulthandler on SIGUSR1 (and then loads the sitecustomize it shadows, if any), so the agent
signals each rank and copies what the rank wrote to its stderr. faulthandler shows Python
frames only, and a rank's own SIGUSR1 handler, if it sets one, replaces it.

Used by node_probe (what preflight's hang.stacks reports) and by the agent (the dump).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults

PTRACE_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"
CAP_SYS_PTRACE = 19
HOOK_DIR = "_stack_hook"
METHODS = ("auto", "py-spy", "faulthandler")
STEADY_S = 1.0  # a faulthandler dump without a module frame is whole once it held still this long

SITECUSTOMIZE = r'''"""torchfleet: this rank's Python stacks to stderr on SIGUSR1 (faulthandler), for a hang's
diagnosis where py-spy cannot attach. Then the sitecustomize this one shadows, if any."""
import faulthandler as _faulthandler
import os as _os
import signal as _signal
import sys as _sys

try:
    _faulthandler.register(_signal.SIGUSR1, file=_sys.stderr, all_threads=True)
except (AttributeError, RuntimeError, ValueError):
    pass
_here = _os.path.dirname(_os.path.abspath(__file__))
for _entry in _sys.path:
    _path = _os.path.join(_os.path.abspath(_entry or "."), "sitecustomize.py")
    if _os.path.dirname(_path) != _here and _os.path.isfile(_path):
        with open(_path) as _f:
            exec(compile(_f.read(), _path, "exec"), {"__name__": "sitecustomize",
                                                     "__file__": _path})
        break
'''


def find_py_spy(python):
    """py-spy beside the host's python (a venv's), else on PATH; None when there is none."""
    beside = os.path.join(os.path.dirname(python or ""), "py-spy")
    return beside if os.access(beside, os.X_OK) else shutil.which("py-spy")


def permitted_caps(raw):
    """The permitted set of a security.capability xattr (struct vfs_cap_data, revisions 1-3:
    magic_etc, then permitted/inheritable pairs of 32-bit words, low word first)."""
    if len(raw) < 12:
        return 0
    words = struct.unpack("<%dI" % (len(raw) // 4), raw[:len(raw) // 4 * 4])
    return words[1] | ((words[3] << 32) if len(words) > 3 else 0)


def has_cap(path, cap=CAP_SYS_PTRACE):
    """Whether the file carries cap in its permitted file capabilities (setcap cap+ep)."""
    try:
        raw = os.getxattr(path, "security.capability")
    except (OSError, AttributeError):
        return False
    return bool(permitted_caps(raw) >> cap & 1)


def ptrace_scope(path=PTRACE_SCOPE):
    """Yama's ptrace_scope, or None without Yama (classic ptrace: the same user may attach)."""
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def ptrace_capable(status="/proc/self/status"):
    """Whether this process holds CAP_SYS_PTRACE in its effective set: root in a container
    usually does not, so uid 0 alone says nothing."""
    try:
        with open(status) as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def attach_facts(python, cap_eff=None, scope=None, py_spy=None):
    """Whether py-spy can attach to the ranks here, by the kernel's rules: {py_spy,
    ptrace_scope, cap_sys_ptrace, can_attach, why}; why says what stops it, '' when nothing
    does. cap_eff: whether this process holds CAP_SYS_PTRACE (read from /proc when None).
    probe_attach() then tries it for real."""
    py_spy = py_spy if py_spy is not None else find_py_spy(python)
    scope = ptrace_scope() if scope is None else scope
    cap_eff = ptrace_capable() if cap_eff is None else cap_eff
    cap = bool(py_spy) and has_cap(py_spy)
    if not py_spy:
        why = "py-spy is not installed beside %s or on PATH" % python
    elif scope == 3:
        why = "kernel.yama.ptrace_scope=3 forbids attaching to any process"
    elif scope in (1, 2) and not cap_eff and not cap:
        why = ("kernel.yama.ptrace_scope=%d and neither the run's user nor %s holds "
               "CAP_SYS_PTRACE" % (scope, py_spy))
    else:
        why = ""
    return {"py_spy": py_spy, "ptrace_scope": scope, "cap_sys_ptrace": cap or cap_eff,
            "can_attach": not why, "why": why}


PROBE = "import sys, time\nsys.stdout.write('ready\\n')\nsys.stdout.flush()\ntime.sleep(60)\n"


def probe_attach(facts, python, run):
    """The kernel's rules as read can still be wrong (a container's seccomp profile, an LSM):
    py-spy dumps a Python process of this user that it did not start, as it would a rank.
    Returns facts with can_attach and why from that try. run: command.bounded."""
    if not facts["can_attach"]:
        return facts
    try:
        proc = subprocess.Popen([python or sys.executable, "-c", PROBE], stdout=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError as exc:
        return dict(facts, can_attach=False, why="no Python to try py-spy on: %s" % exc)
    try:
        proc.stdout.readline()  # the interpreter is up (or it ended: py-spy says so)
        out, err = run([facts["py_spy"], "dump", "--pid", str(proc.pid)],
                       timeout_s=defaults.PYSPY_TIMEOUT_S)
    finally:
        proc.kill()
        proc.wait()
    if out is None:
        return dict(facts, can_attach=False, why="py-spy could not dump a process of the "
                    "run's user: %s" % str(err)[-300:])
    return facts


def install_hook(run_dir, env, extra=""):
    """Write the sitecustomize (and extra code after it: flight.WATCHER) into the run's
    directory and put it first on PYTHONPATH in env (a dict, changed in place)."""
    hook = os.path.join(run_dir, HOOK_DIR)
    os.makedirs(hook, mode=0o700, exist_ok=True)
    with open(os.path.join(hook, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE + extra)
    env["PYTHONPATH"] = os.pathsep.join([hook] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                                                  else []))


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


# A frame as faulthandler prints it: file, line, function (py-spy's are "    func (file:line)").
FAULTHANDLER_FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (.+)$')
# The functions of a main thread's outermost frame: the script's module (or runpy's, -m).
MAIN_OUTERMOST = ("<module>", "_run_module_as_main")


def _dump_state(text):
    """(has a thread's header, ends with the main thread's outermost frame) of what a rank
    wrote after SIGUSR1: CPython dumps the newest thread first, so the main thread comes last.
    Other threads' writes meanwhile (a warning, a log line) may lie between faulthandler's
    lines and are skipped."""
    head = "most recent call first" in text
    frames = [m for m in map(FAULTHANDLER_FRAME.match, text.splitlines()) if m]
    return head, bool(head and frames and frames[-1].group(3) in MAIN_OUTERMOST)


def faulthandler_dumps(workers, dirs, wait_s=3.0):
    """{local_rank: text}: SIGUSR1 to each rank, then what each wrote to its stderr.log.
    A dump is taken once it ends with the main thread's outermost frame; one that never does
    (no module frame) once it held still for STEADY_S, or at wait_s as far as it got: a rank
    descheduled in the middle of its dump on a loaded host (its other threads writing
    meanwhile) must not leave the main thread out."""
    before = {}
    for local_rank, (pid, _rank) in workers.items():
        path = os.path.join(dirs.get(local_rank, ""), "stderr.log")
        before[local_rank] = (path, _size(path))
        try:
            os.kill(pid, signal.SIGUSR1)
        except OSError:
            pass
    deadline, texts = time.monotonic() + wait_s, {}
    steady = {}  # local_rank: (size, since)
    while len(texts) < len(before):
        last = time.monotonic() >= deadline
        for local_rank, (path, size) in before.items():
            now = _size(path)
            if local_rank in texts or now <= size:
                continue
            with open(path, "rb") as f:
                f.seek(size)
                text = f.read(1 << 20).decode("utf-8", "replace")  # a chatty thread's lines may be in it
            head, whole = _dump_state(text)
            if steady.get(local_rank, (None,))[0] != now:
                steady[local_rank] = (now, time.monotonic())
            held = time.monotonic() - steady[local_rank][1] >= STEADY_S
            if whole or (head and (held or last)):
                texts[local_rank] = text
        if last:
            break
        time.sleep(0.2)
    return texts


def dump(run, facts, method, workers, dirs, out_name):
    """Each live rank's stack into its log directory as out_name; `run` is the module's
    command runner (command.bounded), facts attach_facts(), workers {local_rank: (pid, rank)},
    dirs {local_rank: log directory}. py-spy dumps every rank at once (8 ranks take as long as
    one: the budget, defaults.DUMP_S, is one py-spy call and the fallback); a rank py-spy
    could not dump dumps itself (faulthandler). Says in each file how the stack was taken, or
    why not."""
    use_py_spy = facts["py_spy"] and (method == "py-spy" or (method == "auto"
                                                             and facts["can_attach"]))
    spied = {}
    if use_py_spy and workers:
        def one(pid):
            return run([facts["py_spy"], "dump", "--pid", str(pid)],
                       timeout_s=defaults.PYSPY_TIMEOUT_S)

        with ThreadPoolExecutor(max_workers=len(workers)) as pool:
            spied = dict(zip(sorted(workers), pool.map(
                one, [workers[lr][0] for lr in sorted(workers)]), strict=True))
    left = {lr: w for lr, w in workers.items() if spied.get(lr, (None, None))[0] is None}
    texts = faulthandler_dumps(left, dirs) if left else {}
    for local_rank, (pid, rank) in sorted(workers.items()):
        text = "# rank %s (local rank %s, pid %s)\n" % (rank, local_rank, pid)
        out, err = spied.get(local_rank, (None, None))
        if out is not None:
            text += out
        else:
            why = ("py-spy failed: %s" % str(err).strip()[-300:] if local_rank in spied
                   else facts["why"] or "stack_dump=%s" % method)
            text += "# faulthandler (SIGUSR1) of the rank itself: %s\n" % why
            text += texts.get(local_rank) or ("the rank wrote no stack within 3 s of SIGUSR1 "
                                              "(its own SIGUSR1 handler, or stuck in the kernel)\n")
        if local_rank in dirs:
            with open(os.path.join(dirs[local_rank], out_name), "w") as f:
                f.write(text)
