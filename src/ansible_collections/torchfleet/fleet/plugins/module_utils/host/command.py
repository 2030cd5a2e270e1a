"""How a module runs a command on a host: an argv list (never a shell string) through the
module's own run_command, bounded by coreutils' `timeout`: a hung nvidia-smi, git or python
must fail its check, not hang the play, and run_command has no time limit of its own."""
from __future__ import annotations

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


def bounded(module, timeout_s=defaults.COMMAND_TIMEOUT_S):
    """run(argv, timeout_s=timeout_s) -> (stdout, None) when argv exits 0, else (None, why)."""
    # Fails the module, naming `timeout`, on a host without coreutils.
    timeout = module.get_bin_path("timeout", required=True)

    def run(argv, timeout_s=timeout_s):
        rc, out, err = module.run_command(
            [timeout, "--kill-after=2", "%g" % timeout_s] + [str(a) for a in argv])
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
