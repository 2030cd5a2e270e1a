"""A rank's own exit, as the rank itself saw it, and the words for a rank's death.

torchrun reports a rank's exit code only when it ends by itself; an agent that stops a torchrun
still tearing down (a sibling slow to stop on SIGTERM) loses it, and a rank that ended its
script and then aborted while the interpreter shut down (a process group never destroyed:
SIGABRT, -6) is reported with that -6, which hides the code its script ended with. So each
rank notes its own end (NOTE, in the run's sitecustomize): when its interpreter reaches exit,
the code its script gave (sys.exit's argument, 1 for an uncaught exception, none for a script
that returned) and the time, in `exit.json` beside its logs. Only the rank writes it: a
process it spawns (a DataLoader worker) inherits the marker and writes nothing, nor does a
child os.fork made, which inherits the hook itself. A rank killed
by a signal notes nothing.

The agent reads the note of a rank that died (read_note: hostile bytes, bounded) and the judge
words the death (words).
"""
from __future__ import annotations

import json
import os
import signal

NOTE_MAX = 256  # bytes of a note: {"code": int|null, "ts": float}
TS_MAX = 1e11   # a note's time: seconds since the epoch, well past any real clock

NOTE = r'''

def _torchfleet_exit_note():
    """torchfleet: note how this rank's script ended, when its interpreter exits."""
    import atexit
    import json
    import os
    import sys
    import time
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    marker = os.environ.get("TORCHFLEET_RANK_PID")
    if not error_file or marker not in (None, str(os.getpid())):
        return  # not a rank (torchrun itself), or a process a rank spawned
    os.environ["TORCHFLEET_RANK_PID"] = str(os.getpid())
    ended, mine = {"code": None}, os.getpid()
    real_exit, real_hook = sys.exit, sys.excepthook

    def _exit(code=None):
        ended["code"] = code if code is None or isinstance(code, int) else 1
        real_exit(code)

    def _hook(kind, value, tb):
        ended["code"] = 1
        real_hook(kind, value, tb)

    def _note():
        if os.getpid() != mine:
            return  # a child os.fork made inherits the hook: its end is not the rank's
        path = os.path.join(os.path.dirname(error_file), "exit.json")
        try:
            with open(path + ".tmp", "w") as f:
                json.dump({"code": ended["code"], "ts": time.time()}, f)
            os.replace(path + ".tmp", path)
        except OSError:
            pass

    sys.exit, sys.excepthook = _exit, _hook
    atexit.register(_note)


_torchfleet_exit_note()
'''


NOTE_FILE = "exit.json"


def read_note(rank_dir):
    """{"code": int|None, "ts": float} a rank noted at its exit, else None (none written, or
    anything else than a small note of that shape)."""
    try:
        with open(os.path.join(rank_dir, NOTE_FILE), "rb") as f:
            raw = f.read(NOTE_MAX + 1)
    except (OSError, TypeError):
        return None
    if len(raw) > NOTE_MAX:
        return None
    try:
        note = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(note, dict):
        return None
    code, ts = note.get("code"), note.get("ts")
    if code is not None and (not isinstance(code, int) or isinstance(code, bool)
                             or abs(code) > 1 << 31):
        return None
    # A time of this host's clock: a number of seconds since the epoch (NaN, infinities and
    # integers too large for a float are not).
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not 0 <= ts < TS_MAX:
        return None
    return {"code": code, "ts": float(ts)}


def _signal_name(code):
    try:
        return signal.Signals(-code).name
    except ValueError:
        return "signal %d" % -code


def words(rank, exitcode, script_code=None, at_exit=False):
    """How rank died, in words: its exit code as torchrun saw it (None: not known), the code its
    script ended with and whether it got that far (its exit note)."""
    if at_exit and exitcode is not None and exitcode < 0:
        if script_code:
            return "rank %d exited with %d (then %s at interpreter exit)" % (
                rank, script_code, _signal_name(exitcode))
        return ("rank %d ended its script, then died of %s at interpreter exit (%d): its "
                "process group was never destroyed; call "
                "torch.distributed.destroy_process_group() before the script ends"
                % (rank, _signal_name(exitcode), exitcode))
    if exitcode is None:
        if at_exit:
            return "rank %d exited with %d" % (rank, script_code or 0)
        return "rank %d died (killed by a signal: no exit code)" % rank
    return "rank %d exited with %d" % (rank, exitcode)
