"""How a module runs a command on a host: an argv list (never a shell string), bounded by
coreutils' `timeout`: a hung nvidia-smi, git or python must fail its check, not hang the play.

Not through AnsibleModule.run_command: it has no time limit of its own, and its read loop
sleeps a whole second whenever the command exits between its two looks at the process (it
then polls an empty selector for its 1 s timeout: strace of node_probe, 2026-11-27, about one
probe in three, a second each time). subprocess.run reads until both pipes close and reaps at
once."""
from __future__ import annotations

import os
import subprocess

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults

# timeout(1)'s exit statuses: it killed the command (124, or 137 after --kill-after), it
# could not run it (126), the command does not exist (127).
TIMED_OUT = (124, 137)
NOT_RUNNABLE = 126
NOT_FOUND = 127


class Missing(str):
    """run()'s `why` when the command does not exist on the host: told apart by its type, not
    its words (a command that ran and failed may print "not found" too)."""


class Failed(str):
    """run()'s `why` when the command ran and exited non-zero (`rc`: nvidia-smi's own codes
    name the fault), or did not answer in time (`rc` None)."""

    rc = None

    def __new__(cls, text, rc=None):
        self = super().__new__(cls, text)
        self.rc = rc
        return self


# timeout(1) sends SIGKILL this long after its own signal; past both, this process gives up.
KILL_AFTER_S = 2


def _env(module):
    """The module's environment for a command, as run_command builds it: with the module's
    run_command_environ_update, without AnsiballZ's own entries on PYTHONPATH."""
    env = dict(os.environ, **{k: str(v) for k, v in
                              (module.run_command_environ_update or {}).items()})
    if "PYTHONPATH" in env:
        kept = [x for x in env["PYTHONPATH"].split(":")
                if x and not x.endswith(("/ansible_modlib.zip", "/debug_dir"))]
        if kept:
            env["PYTHONPATH"] = ":".join(kept)
        else:
            del env["PYTHONPATH"]
    return env


def bounded(module, timeout_s=defaults.COMMAND_TIMEOUT_S):
    """run(argv, timeout_s=timeout_s, data=None) -> (stdout, None) when argv exits 0, else
    (None, why); data: text for the command's stdin."""
    # Fails the module, naming `timeout`, on a host without coreutils.
    timeout = module.get_bin_path("timeout", required=True)

    def run(argv, timeout_s=timeout_s, data=None):
        argv = [os.path.expanduser(str(argv[0]))] + [str(a) for a in argv[1:]]
        try:
            proc = subprocess.run(
                [timeout, "--kill-after=%d" % KILL_AFTER_S, "%g" % timeout_s] + argv,
                input=None if data is None else data.encode(),
                stdin=subprocess.DEVNULL if data is None else None, capture_output=True,
                env=_env(module), timeout=timeout_s + KILL_AFTER_S + 5, check=False)
        except subprocess.TimeoutExpired:  # a child of the command kept its pipes open
            return None, Failed("%s did not answer within %g s" % (argv[0], timeout_s))
        except OSError as exc:
            return None, "%s: cannot be run (%s)" % (argv[0], exc.strerror or exc)
        rc = proc.returncode
        out = proc.stdout.decode("utf-8", "replace")
        err = proc.stderr.decode("utf-8", "replace")
        if rc in TIMED_OUT:
            return None, Failed("%s did not answer within %g s" % (argv[0], timeout_s))
        if rc == NOT_FOUND:
            return None, Missing("%s: not found" % argv[0])
        if rc == NOT_RUNNABLE:
            return None, "%s: cannot be run (%s)" % (argv[0], err.strip()[-200:])
        if rc != 0:
            return None, Failed((err or out).strip()[-300:] or "%s exited with %d" % (argv[0], rc),
                                rc)
        return out, None
    return run


def missing(why):
    """Whether run()'s `why` says the command does not exist on the host (not that it ran and
    failed, whatever its own message says)."""
    return isinstance(why, Missing)
