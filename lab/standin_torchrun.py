"""A stand-in for `python -m torch.distributed.run` and its ranks, for the scale harness
(lab/scale.py): what a host's agent sees of torchrun, without torch. Not the product.

The agent starts it exactly as it starts torchrun (agent.torchrun_argv: the harness hands the
agent this file, executable, as its `python`). It reads the options torchrun would, makes
torchrun's log layout (<log-dir>/<rdzv-id>_standin/attempt_0/<local rank>/{stdout,stderr}.log)
and forks --nproc-per-node ranks from itself, copy-on-write: 4,096 interpreters do not fit in
the harness's memory, 4,096 forks of 512 small ones do. Each rank:

- (every TORCHFLEET_STANDIN_STEP_S, a training step) writes a line to its stdout.log and its
  place in a collective to fr_position.json, as the Flight Recorder watcher writes it
  (flight.py: {rank, pid, pgs}); the collectives' sequence
  number is the step of a clock every rank shares (TORCHFLEET_STANDIN_T0), so every rank of
  the fleet is in the same collective at the same time, as a real all_reduce would have them;
- on SIGUSR1 dies with exit code 1 after a Python-like traceback on stderr.log;
- reads the fleet's control file (TORCHFLEET_STANDIN_CONTROL, its mtime each step): with
  {"hang": {"rank": r, "seq": s}} every rank stops at collective s, rank r before it (it never
  joins) and the others inside it, and nobody prints any more: a hang as the master sees one.

The launcher waits for its ranks; when one dies by itself it writes torchrun's failure summary
(the lines rundir.root_cause reads) to its own output, stops the others and exits 1, as
torchrun does. SIGTERM (the agent's stop) stops every rank and exits. What a stand-in cannot
show the agent: the ranks' environment (RANK, LOCAL_RANK) in /proc, which a fork does not
change, so the agent learns a rank's death from the launcher's exit, not from watching it.

Only the standard library; run with `python -IS`.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time

CONTROL_ENV, T0_ENV = "TORCHFLEET_STANDIN_CONTROL", "TORCHFLEET_STANDIN_T0"
STEP_ENV = "TORCHFLEET_STANDIN_STEP_S"  # seconds a collective takes (a training step)


def options(argv):
    """torchrun's --name value pairs before the script, and the script's own arguments."""
    opts, i = {}, 0
    if argv[:2] == ["-m", "torch.distributed.run"]:
        i = 2
    while i + 1 < len(argv) and argv[i].startswith("--"):
        opts[argv[i][2:]] = argv[i + 1]
        i += 2
    return opts, argv[i:]


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def rank_main(rank, rdir, control, t0, step_s):
    def die(_signum, _frame):
        with open(os.path.join(rdir, "stderr.log"), "a") as err:
            err.write("Traceback (most recent call last):\n  File \"standin\", line 1, in "
                      "<module>\nRuntimeError: stand-in rank %d told to die\n" % rank)
        os._exit(1)
    signal.signal(signal.SIGUSR1, die)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    out = open(os.path.join(rdir, "stdout.log"), "a", buffering=1)
    position = os.path.join(rdir, "fr_position.json")
    pid, said, seen_mtime, hang = os.getpid(), None, None, None
    phase = (pid * 0.618034) % 1.0 * step_s
    while True:
        now = time.time()
        seq = int((now - t0) / step_s)
        try:
            mtime = os.stat(control).st_mtime
            if mtime != seen_mtime:
                seen_mtime = mtime
                with open(control) as f:
                    hang = json.load(f).get("hang")
        except (OSError, ValueError, AttributeError):
            pass
        if hang and seq >= hang["seq"]:
            s = hang["seq"]
            place = [s - 1, s - 1, s - 1] if rank == hang["rank"] else [s, s - 1, s]
        else:
            place = [seq, seq, seq]
            out.write("step %d\n" % seq)
        if place != said:
            said = place
            write_atomic(position, json.dumps({"rank": rank, "pid": pid, "pgs": {"0": [
                place[0], place[1], "gloo:all_reduce", "[[1024]]", "Float", place[2]]}}))
        # Each rank wakes at its own phase of the step: a thousand ranks waking at once would
        # be a burst no fleet of separate hosts makes on one machine.
        time.sleep(max(0.01, step_s - (time.time() - t0 - phase) % step_s))


def main(argv):
    opts, _script = options(argv)
    nproc, node_rank = int(opts["nproc-per-node"]), int(opts["node-rank"])
    attempt = os.path.join(opts["log-dir"], "%s_standin" % opts.get("rdzv-id", "run"),
                           "attempt_0")
    control, t0 = os.environ[CONTROL_ENV], float(os.environ[T0_ENV])
    step_s = float(os.environ[STEP_ENV])
    ranks = {}
    for local in range(nproc):
        rdir = os.path.join(attempt, str(local))
        os.makedirs(rdir, exist_ok=True)
        pid = os.fork()
        if pid == 0:
            try:
                rank_main(node_rank * nproc + local, rdir, control, t0, step_s)
            finally:
                os._exit(1)
        ranks[pid] = local

    def stop(code):
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
        os._exit(code)
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop(143))
    while ranks:
        pid, status = os.wait()
        local = ranks.pop(pid, None)
        code = os.waitstatus_to_exitcode(status)
        if local is not None and code != 0:
            # torchrun's ChildFailedError summary, as its own log carries it.
            print("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
                  "Root Cause (first observed failure):\n[0]:\n  time      : %s\n"
                  "  host      : standin\n  rank      : %d (local_rank: %d)\n"
                  "  exitcode  : %d (pid: %d)\n" % (time.strftime("%Y-%m-%d_%H:%M:%S"),
                                                    node_rank * nproc + local, local, code, pid),
                  flush=True)
            stop(1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
