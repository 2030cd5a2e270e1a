"""One run on one host: the host's agent, and on the master also the run's store.

Every host runs this as the async torchrun_job task, one loop owning the fate of its torchrun
(the shape of torch elastic's agent loop):

- HostAgent starts torchrun, sends a heartbeat each second (ranks alive, how long ago its ranks
  last wrote to their logs, measured on this host), a rank's failure as soon as it knows it
  for sure (DIED: the rank's exit status, read the moment it ended, before torchrun reaps
  it; torchrun itself tears down for a second or more before it says it) and its torchrun's
  exit, and obeys the master: an abort stops its torchrun (SIGTERM to every rank at once,
  SIGKILL to torchrun, SIGKILL to what is left after abort_grace_s; a torchrun already ending
  by itself after a rank's death is given a moment to end and say which rank it was). It
  stops by itself when the master is silent for lost_after_s, or never reached within
  join_timeout_s. torchrun dies with its agent (PR_SET_PDEATHSIG): a killed agent leaves
  nothing running.
- MasterStore (node_rank 0 only) serves the control channel and owns the run's record
  (runstate.RunState, the one judge): it feeds it every verified message, asks it what time
  decides (a silent host, a hang, the job's limit, the controller's lease), tells every host
  to stop at the first failure, writes the record for the controller, and stays until every
  host reported or the settle time is over.

The master's loop steps both; another host's steps its agent only. Every timing is derived in
Timings from the module's arguments.

torchrun uses the static rendezvous (--node-rank = the host's position in the inventory), so
rank order is inventory order at any N; its store lives under the run id's prefix, so a stale
agent of an earlier run is never joined.
"""
from __future__ import annotations

import errno
import os
import signal
import subprocess
import time

from ansible_collections.torchfleet.fleet.plugins.module_utils.host import hwwatch
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import ckptwatch, container, exits, flight, guard, procs, runstate, stacks, straggle
from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.control import Client, Server
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.procs import HOST_ENV, RUN_ID_ENV, stop_run
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import (
    AGENT_LOG, CONTROL, DETACHED, EXITCODE, GUARDED, LEASE, LOGS, PIDFILE, RESULTS, STACK_DUMP, START_FAILED,
    STOP_REQUEST, TORCHRUN_LOG, peer_loss_of, rank_dirs, read_json, root_cause, tail, write_json)


class Timings:
    """The timings an agent runs by: the module's arguments, and the constants of
    plugins/module_utils/defaults.py (where every timing is written, the rules beside it)."""

    LOOK_S = defaults.LOOK_S
    BEAT_S = defaults.BEAT_S
    TEARDOWN_S = defaults.TEARDOWN_S
    RANK_EXIT_S = defaults.RANK_EXIT_S

    def __init__(self, p):
        self.lost_after_s = float(p["lost_after_s"])
        self.join_timeout_s = float(p["join_timeout_s"])
        self.abort_grace_s = float(p["abort_grace_s"])
        self.lease_s = float(p["lease_s"])
        # The lease counts from the controller's first look: the starts of every fork batch
        # come before it, and the join timeout already covers them (it grows by batch).
        self.start_bound_s = self.join_timeout_s + self.lease_s if self.lease_s else None


def rdzv_id(run_id, attempt):
    """The rendezvous id of one attempt: torchrun's store keys live under it, so a torchrun of
    an earlier attempt still running somewhere never joins this one."""
    return run_id if not attempt else "%s-attempt%d" % (run_id, attempt)


def torchrun_argv(p, script):
    """torchrun with the static rendezvous: the node rank is the host's place in the inventory."""
    return [
        p["python"], "-m", "torch.distributed.run",
        "--nnodes", str(p["nnodes"]),
        "--nproc-per-node", str(p["nproc_per_node"]),
        "--node-rank", str(p["node_rank"]),
        "--rdzv-backend", "static",
        "--rdzv-endpoint", "%s:%d" % (p["master_addr"], p["master_port"]),
        "--rdzv-id", rdzv_id(p["run_id"], p["attempt"]),
        "--rdzv-conf", "timeout=%d" % p["join_timeout_s"],
        "--local-addr", p["local_addr"],
        "--max-restarts", str(p["max_restarts"]),
        "--log-dir", os.path.join(p["run_dir"], LOGS),
        "--redirects", "3",
        script, *p["script_args"],
    ]


class RankDeaths:
    """This host's ranks (torchrun's direct children), found here only: their PIDs (for a
    hang's stacks, for the hardware watch's OOM victims and GPU holders), and when each was
    first seen dead, looked at every step of the agent's loop: a rank's death is known when it
    happens, not when torchrun ends (which a sibling slow to stop can delay past the abort that
    ends the run). How each ended is read the moment it does (procs.ExitWatch), before
    torchrun reaps it."""

    # Signals torchrun forwards to its ranks when it is stopped itself
    # (TORCHELASTIC_SIGNALS_TO_HANDLE): a rank that died of one may have died of that stop.
    # A rank that handles one (a checkpoint on SIGTERM) and then exits says 128 + it.
    STOP_SIGNALS = tuple(x for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP,
                                     signal.SIGQUIT) for x in (-s, 128 + s))
    WATCH_LAG_S = 0.05  # a rank seen dead before the exit watch read it: awaited this long

    def __init__(self):
        self.ranks = {}   # pid -> (local_rank, rank)
        self.dead = {}    # pid -> (monotonic time first seen dead, before any stop of ours)
        self.status = {}  # pid -> its exit code, where read before torchrun reaped it
        self.exits = procs.ExitWatch()
        self.watched = {}      # pid -> whether the exit watch has it
        self.stopped_m = None  # when this agent signalled its torchrun (HostAgent._stop)
        self.abort_m = None    # when this agent obeyed the master's abort (HostAgent.obey)
        self.awaited = set()   # local ranks already ending with a failing note at the abort
        self.unsure = False    # a death here only torchrun can name (failed())

    def look(self, torchrun_pid, now_m, stopping, refresh):
        """stopping: this agent has signalled its torchrun (a death seen now may be of it)."""
        if refresh:
            for pid in procs.children(torchrun_pid):
                if pid not in self.ranks:
                    ids = procs.rank_ids(pid)
                    if ids is not None:
                        self.ranks[pid] = ids
        for pid in self.ranks:
            if pid not in self.watched:
                self.watched[pid] = self.exits.watch(pid, torchrun_pid)
            if pid in self.dead:
                continue
            ended = self.exits.ended.get(pid)
            if ended is not None:
                when = min(ended[0], now_m)
                self.dead[pid] = (when, self._before(when, stopping, True))
                self.status[pid] = ended[1]
            elif not procs.alive(pid):
                if self.watched[pid]:  # the watch reads it within a moment: awaited, briefly
                    ended = self.exits.wait_for(pid, self.WATCH_LAG_S)
                if ended is None and self.watched[pid]:
                    continue  # (the watch's at a later look)
                when = now_m if ended is None else min(ended[0], now_m)
                self.dead[pid] = (when, self._before(when, stopping, ended is not None))
                self.status[pid] = None if ended is None else ended[1]

    def _before(self, when, stopping, dated):
        """Whether a death seen at `when` came before any stop of ours: one the watch dated
        before this agent signalled torchrun did; one seen only now, if nothing was
        signalled yet."""
        return not stopping or dated and self.stopped_m is not None and when < self.stopped_m

    def failed(self, dirs, now_m):
        """(root cause, age_s) of the first rank here that ended with a failure, before any
        stop of ours, as its exit status says it (read the moment it ended); else None.

        Only a death known for sure is named here; any other is left to torchrun's own report
        (its EXIT), and so is every later death of this host (unsure):
        - a rank whose status was not read (torchrun reaped it first, or it was never
          watched) may be the one that failed (a rank killed by a signal leaves no note), and
          its siblings die of torchrun's stop after it: none of them is named;
        - a rank that died of a signal torchrun forwards when it is stopped (SIGTERM first)
          may have died of that stop;
        - several failing ranks seen ended in one round (which was first is not known);
        - a death after the abort this agent obeyed (of the run's stop; _own).
        A rank's exit note (exits.py) counts only beside a non-zero status of its own process:
        a SystemExit caught, or a thread's, noted a code the rank did not end with. A rank
        still in its interpreter's exit is not dead yet: it is told once it is."""
        if self.unsure:
            return None
        own = sorted((when, pid) for pid, (when, before) in self.dead.items()
                     if self._own(pid, when, before))
        if any(self.status.get(pid) is None for _when, pid in own):
            self.unsure = True  # (its time is when it was seen: it may have come first)
            return None
        for when, pid in own:
            if self.status[pid] == 0:
                continue  # it ended well; torchrun waits for its siblings
            together = [p for w, p in own if w == when and self.status[p] != 0]
            # Several failing in one round: which came first is not known (a round spans the
            # watch's wake-up, 100 ms and more on a busy host), and one may have died of the
            # other (a CUDA or NCCL error after a sibling's crash).
            if len(together) > 1 or self.status[pid] in self.STOP_SIGNALS:
                self.unsure = True
                return None
            local_rank, rank = self.ranks[pid]
            note = exits.read_note(dirs.get(local_rank)) if local_rank in dirs else None
            age_s = now_m - when
            if note is not None:  # (written as its interpreter began to exit)
                age_s = max(age_s, time.time() - note["ts"])
            return {"rank": rank, "local_rank": local_rank, "exitcode": self.status[pid],
                    "script_code": None if note is None else note["code"],
                    "at_exit": note is not None}, max(0.0, age_s)
        return None

    def close(self):
        self.exits.close()

    def _own(self, pid, when, before):
        """Whether a death is this host's own: before any stop of ours and before the abort
        this agent obeyed, unless the rank was already ending with a failing note then (a
        death after the abort is of the run's stop: another host's ranks killed, a collective
        failed here)."""
        return before and (self.abort_m is None or when < self.abort_m
                           or self.ranks[pid][0] in self.awaited)

    def first_own(self):
        """(pid, local_rank, rank, when) of the first rank that died before this host was
        told to stop, else None."""
        own = [(m, pid) for pid, (m, before) in self.dead.items()
               if self._own(pid, m, before) and self.status.get(pid) != 0]
        if not own:
            return None
        when, pid = min(own)
        return (pid,) + self.ranks[pid] + (when,)

    def pid_of(self, local_rank):
        return next((pid for pid, (lr, _r) in self.ranks.items() if lr == local_rank), None)

    def live(self):
        """{local_rank: (pid, rank)} of the ranks alive now."""
        return {lr: (pid, r) for pid, (lr, r) in self.ranks.items()
                if pid not in self.dead and procs.alive(pid)}


def live_children(pid):
    """torchrun's workers still running (a dead one not yet reaped is not)."""
    return [c for c in procs.children(pid) if procs.alive(c)]


def local_status(run_dir, pid, now=None, first_dead=None):
    """What a beat reports: ranks alive, seconds since any rank last wrote to its logs (on this
    host's clock, so the master never compares two hosts' clocks), local rank 0's last line;
    with recording (first_dead given, flight.positions), where each rank is in its
    collectives and how long that held still."""
    newest, last = None, ""
    dirs = rank_dirs(run_dir)
    for local_rank, rdir in dirs.items():
        for name in ("stdout.log", "stderr.log"):
            try:
                mtime = os.stat(os.path.join(rdir, name)).st_mtime
            except OSError:
                continue
            newest = mtime if newest is None else max(newest, mtime)
        if local_rank == 0:
            last = tail(os.path.join(rdir, "stdout.log"), 1) or tail(os.path.join(rdir,
                                                                                  "stderr.log"), 1)
    now = time.time() if now is None else now
    status = {"alive": len(live_children(pid)),
              "idle_s": None if newest is None else max(0.0, round(now - newest, 3)),
              "last_line": last[-runstate.LINE_MAX:], "pid": pid}
    if first_dead is not None:
        firsts = {}  # each rank's first collective (flight.py's watcher): goodput's init
        status["coll"], status["steady"] = flight.positions(dirs, first_dead, procs.alive, now,
                                                            firsts)
        if firsts:
            status["first"] = firsts
    return status


def failure_evidence(run_dir):
    """(root cause, consequence) from this host's torchrun log and the failing rank's stderr:
    consequence when that rank died because its connection to another rank broke."""
    cause = root_cause(tail(os.path.join(run_dir, TORCHRUN_LOG), 200, 1 << 20))
    if cause is None:
        return None, False
    return cause, peer_loss_of(rank_dirs(run_dir).get(cause["local_rank"]))


class HostAgent:
    """This host's part: its torchrun, its reports, obeying the master."""

    def __init__(self, p, proc, command, timings, send, watch, box=None):
        self.p, self.proc, self.command, self.t = p, proc, command, timings
        self.box = box              # the run's container (container_image), else None
        self.watch = watch          # hwwatch.HostWatch: this host's hardware since the start
        self.send = send            # a report to the master: True once it is on its way
        self.host = p["host"]
        self.started_m = time.monotonic()
        self.next_beat = 0.0
        self.stopping = None        # the abort this agent obeyed, if any
        self.stop_at = None         # an obeyed abort's deadline for a torchrun already ending
        self.reason = "exited"      # exited | aborted | master_lost
        self.stopped = False        # this agent signalled torchrun
        self.ended_m = None         # when torchrun's exit was seen
        self.exit_sent = False
        self.exit_acked = False
        self.most_workers = 0
        self.stack_facts = stacks.attach_facts(p["python"])
        self.recording = p["flight_recorder"] > 0
        self.first_dead = {} if self.recording else None  # rank -> when first seen dead
        self.samples = straggle.Reader() if self.recording else None  # for stragglers
        self.deaths = RankDeaths()
        self.dirs = {}              # the ranks' log directories, once torchrun made them
        self.died_sent = False      # a rank's failure is told (DIED)
        self.died = None            # (root cause, consequence) it told
        # Local ranks that had ended noting a failing code when the abort came, though no look
        # saw them die (obey, _ended_failing): their own failures, not deaths of the stop.
        self.ended_failing = set()
        self.up_m = None            # when every rank of this host was first seen running
        self.log = _logger(p["run_dir"])

    def root(self):
        """torchrun's PID on this host, whose children are the ranks: the agent's child, or
        in a container torchrun's host PID once found (podman, docker: 0 before; apptainer,
        enroot: the agent's child before, where nothing is found either)."""
        if self.box is None:
            return self.proc.pid
        found = self.box.find_pid(self.command, self.proc.pid)
        return self.proc.pid if found is None and container.pid_argv(
            self.box.runtime, self.box.name) is None else (found or 0)

    def step(self, now_m):
        """Look at torchrun once: beat, report its end, carry out a pending stop."""
        rc = self.proc.poll()
        beat = rc is None and now_m >= self.next_beat
        # (Every look until every rank is found: the exit watch has each from its start.)
        self.deaths.look(self.root(), now_m, self.stopped, refresh=beat or len(
            self.deaths.ranks) < self.p["nproc_per_node"])
        if self.up_m is None and len(self.deaths.ranks) >= self.p["nproc_per_node"]:
            self.up_m = now_m
        if rc is None:
            self._tell_death(now_m, refresh=beat)
        if beat or rc is not None and not self.exit_sent:
            # (Before an exit too: the OOM killer's line is written before torchrun sees it.)
            self.watch.look(now_m, self.deaths.ranks)
        if beat:
            self.next_beat = now_m + self.t.BEAT_S
            status = local_status(self.p["run_dir"], self.root(),
                                  first_dead=self.first_dead)
            self.most_workers = max(self.most_workers, status["alive"])
            fr = self.samples.take(rank_dirs(self.p["run_dir"]), now_m) if self.samples else {}
            extra = {"fr": fr} if fr else {}
            if self.up_m is not None:  # (on this host's clock: an age)
                extra["up_s"] = round(now_m - self.up_m, 3)
            if self.samples and self.samples.untimed:
                extra["fr_untimed"] = True
            self.send(dict(status, t=runstate.BEAT, hw=self.watch.take(now_m),
                           watch=self.watch.status(), **extra))
        if rc is None and self.stop_at is not None and (now_m >= self.stop_at
                                                        or self.died_sent):
            # (Told: the rank that failed here is gone and its exit code read.)
            if not self.died_sent:
                self.reason = "aborted"
            self._stop()
            rc = self.proc.poll()
        if rc is not None:
            self.ended_m = self.ended_m or now_m
            if not self.exit_sent:
                self.exit_sent = self.send(self.exit_body(rc, now_m))
        return rc

    def _tell_death(self, now_m, refresh):
        """A rank here ended with a failure before any stop of ours (RankDeaths.failed): the
        master hears it now (DIED), not once torchrun has noticed and torn down, and stops
        every other host. Once per host, and not with torchrun's own restarts (which answer a
        death), nor once this agent has signalled torchrun."""
        if self.died_sent or self.stopped or self.p["max_restarts"]:
            return
        if refresh or not self.dirs:
            self.dirs = rank_dirs(self.p["run_dir"])
        found = self.deaths.failed(self.dirs, now_m)
        if found is None:
            return
        cause, age_s = found
        # (Set first: on the master the abort comes back within send(), and obey() must know.)
        # A rank still ending with a failing note when the abort came (RankDeaths.awaited) may
        # have failed of the run's stop (a peer's collective broken): kept, as a consequence.
        late = self.deaths.abort_m is not None
        self.died_sent, self.died = True, (cause, peer_loss_of(
            self.dirs.get(cause["local_rank"])) or late)
        if not self.send({"t": runstate.DIED, "root_cause": cause,
                          "consequence": self.died[1],
                          "age_s": round(min(age_s, now_m - self.started_m), 3)}):
            self.died_sent, self.died = False, None  # not connected: said at the next look
        else:
            self.log("rank %d failed (%s): told the master" % (cause["rank"], exits.words(
                cause["rank"], cause["exitcode"], cause["script_code"], cause["at_exit"])))

    def _exiting_failed(self):
        """A live rank here noted a failing code: it is in its interpreter's exit (torch's
        teardown takes a second or more on a busy host), or caught its SystemExit. Those
        ranks' deaths, after the abort, are still this host's own (RankDeaths.awaited)."""
        dirs = rank_dirs(self.p["run_dir"])
        for local_rank, (_pid, _rank) in self.deaths.live().items():
            note = exits.read_note(dirs.get(local_rank))
            if note is not None and note["code"] not in (None, 0):
                self.deaths.awaited.add(local_rank)
        return bool(self.deaths.awaited)

    def _ended_failing(self):
        """Local ranks here gone by the abort that noted a failing code: a death this agent's
        looks missed (the rank ended between two looks and the abort came first, or torchrun
        reaped it before its status was read). A script that fails on every host at start
        ends every host's ranks at once; the first host the master hears aborts the others,
        whose ranks' own exits were then taken for the stop's: the failure looked like that
        one host's (the ledger lab)."""
        live = self.deaths.live()
        ended = set()
        for local_rank, rdir in rank_dirs(self.p["run_dir"]).items():
            note = exits.read_note(rdir)
            if local_rank not in live and note is not None and note["code"] not in (None, 0):
                ended.add(local_rank)
        return ended

    def obey(self, message):
        kind = message.get("t")
        ping = message.get("ping")
        if isinstance(ping, float):  # the master measures this host's clock: answered at once
            self.send({"t": runstate.PONG, "echo": ping, "at": time.time()})
        if kind in (runstate.ACK, runstate.ABORT) and self.exit_sent:
            self.exit_acked = True  # the master has heard how this host's torchrun ended
        # A torchrun that already ended is not stopped: its own exit stands.
        if kind != runstate.ABORT or self.stopping is not None or self.proc.poll() is not None:
            return
        # A rank here that failed before this abort came is told first: its own failure (a
        # second one, kept on this host), never a death of the stop.
        now_m = time.monotonic()
        self.deaths.look(self.root(), now_m, self.stopped, refresh=True)
        self._tell_death(now_m, refresh=True)
        if not self.died_sent and not self.p["max_restarts"]:
            self.ended_failing = self._ended_failing()
        self.deaths.abort_m = now_m  # a death from now on is of the run's stop (_own)
        self.stopping = message
        if not self.died_sent:
            self.reason = "aborted"
        if message.get("dump"):  # every live rank's stack, before anything is stopped
            self.deaths.look(self.root(), time.monotonic(), self.stopped, refresh=True)
            workers = self.deaths.live()
            dirs = rank_dirs(self.p["run_dir"])
            if self.recording:  # the recordings are written beside, while the stacks are taken
                flight.ask_dump(self.p["run_dir"])
            stacks.dump(self.command, self.stack_facts, self.p["stack_dump"], workers, dirs,
                        STACK_DUMP)
            if self.recording:
                flight.wait_dumps(dirs, workers, defaults.FR_DUMP_S)
        workers = len(live_children(self.root()))
        if self.died_sent:
            # The rank that failed here is gone and its exit code read: nothing torchrun's
            # own teardown would still say is needed.
            self.log("abort: stopping torchrun and its ranks (a rank here failed)")
            self._stop()
        elif not self.deaths.unsure and self._exiting_failed():
            # Its failure is told once it has ended (step), then everything here is stopped;
            # a rank that caught its SystemExit is stopped RANK_EXIT_S after.
            self.stop_at = time.monotonic() + self.t.RANK_EXIT_S
            self.log("abort: a rank here is ending with a failure; stopping after it")
        elif self.most_workers and workers < self.most_workers or self.ended_failing:
            # A rank here died already and torchrun is ending by itself: let it say which
            # rank it was (its log's root cause) before it is stopped.
            self.stop_at = time.monotonic() + self.t.TEARDOWN_S
            self.log("abort: torchrun is ending by itself (a rank here died)")
        else:
            self.log("abort: stopping torchrun and its ranks")
            self._stop()

    def stop_alone(self, reason):
        """The master is gone: stop without being told."""
        if self.stopping is None:
            self.stopping, self.reason = {"t": runstate.ABORT, "failure": None}, reason
            self._stop()

    def _stop(self):
        self.stop_at = None
        if self.proc.poll() is None:
            self.stopped = True
            self.deaths.stopped_m = time.monotonic()  # a rank that ends after may be of it
            # torchrun's tree goes first (a few reads of its children's files), torchrun itself
            # (this agent's own child, not reaped yet) killed: stop_run's look for the rest
            # reads every process's environment, a tenth of a second or more on a busy host,
            # several agents at once on a shared one.
            # Each with its start time, read before any signal: the sweep takes only the same
            # processes, never a PID freed by the kill and reused.
            tree = {pid: procs.start_time(pid) for pid in procs.tree(self.proc.pid)}
            # The container's torchrun and its ranks too, from its first process (an image's
            # init, before torchrun is known).
            top = self.root() or (self.box.first if self.box is not None else None)
            if top and top != self.proc.pid:
                tree.update({pid: procs.start_time(pid) for pid in
                             [top] + procs.tree(top) if pid})
            for pid in tree:
                try:
                    os.kill(pid, signal.SIGTERM)
                except OSError:
                    pass
            self.proc.kill()
            stop_run(self.p["run_id"], self.proc.pid, grace_s=self.t.abort_grace_s,
                     host=self.host, all_at_once=True, known=tree)
            if self.box is not None:
                self.box.remove(self.command, self.log)

    def exit_body(self, rc, now_m):
        cause, consequence = failure_evidence(self.p["run_dir"]) if rc else (None, False)
        stopped, age_s = self.stopped, now_m - self.ended_m
        dirs = rank_dirs(self.p["run_dir"])
        # (With torchrun's own restarts a rank's death may have been answered already.)
        own = self.deaths.first_own() if not self.p["max_restarts"] else None
        if self.died is not None:
            # Told (DIED), then stopped: its own failure, not the abort's (torchrun's words
            # where it said them before it was stopped, else what was told).
            stopped = False
            if cause is None:
                cause, consequence = self.died
        elif cause is None and stopped and own is not None:
            # A rank here died by itself before the abort, and this agent stopped a torchrun
            # still tearing down, which so never said how: its status, or its own note, does.
            pid, local_rank, rank, _when = own
            code = self.deaths.status.get(pid)
            note = exits.read_note(dirs.get(local_rank))
            if code or code is None and (note is None or note["code"] not in (None, 0)):
                cause = {"rank": rank, "local_rank": local_rank, "exitcode": code}
                consequence = peer_loss_of(dirs.get(local_rank))
                stopped = False
        elif stopped and cause is not None and cause["local_rank"] in self.ended_failing:
            # torchrun's log names a rank that had ended with a failing note before the abort
            # came (obey): its own failure, as if this agent had seen it die then; torchrun,
            # ending by itself, was stopped only after TEARDOWN_S. (Whether it died of another
            # host's failure is the master's to judge, as for a death told: consequence.)
            stopped = False
        if cause is not None:
            note = exits.read_note(dirs.get(cause["local_rank"]))
            died = self.deaths.dead.get(self.deaths.pid_of(cause["local_rank"]))
            if note is not None:
                cause = dict(cause, script_code=note["code"], at_exit=True)
                age_s = max(age_s, time.time() - note["ts"])
            if died is not None:
                age_s = max(age_s, now_m - died[0])
            age_s = min(age_s, now_m - self.started_m)
        # (torchrun has ended: on the host or in a container, no rank of it is alive)
        status = local_status(self.p["run_dir"], self.proc.pid, first_dead=self.first_dead)
        return {"t": runstate.EXIT, "rc": rc, "stopped": stopped, "root_cause": cause,
                "consequence": consequence, "age_s": round(age_s, 3),
                "ended_s": round(now_m - self.ended_m, 3),  # torchrun's own end (goodput)
                "last_line": status["last_line"], "coll": status.get("coll"),
                "steady": status.get("steady"), "first": status.get("first"),
                "hw": self.watch.take(now_m),
                "watch": self.watch.status()}


class Clock:
    """The master's time for the run's record: the wall clock's at its start, then advanced by
    the monotonic clock. A step of the host's wall clock (NTP, an operator, a VM resumed)
    changes no age and no verdict — a step forward of minutes no longer makes every host look
    lost — and the record's times stay close to the wall's."""

    def __init__(self, wall=time.time, mono=time.monotonic):
        self.mono = mono
        self.base = wall() - mono()

    def __call__(self):
        return self.base + self.mono()


class Lease:
    """Seconds since the controller's last look, on the monotonic clock: each look touches the
    lease file, and what counts is seeing its mtime change, not the mtime's distance from a
    wall clock that may step. The first sight trusts the wall once (the first look may come
    before the master's loop), up to lease_s."""

    def __init__(self, path, lease_s, wall=time.time, mono=time.monotonic):
        self.path, self.lease_s, self.wall, self.mono = path, lease_s, wall, mono
        self.mtime = None
        self.seen_m = None

    def age(self):
        """None before the first look."""
        try:
            mtime = os.stat(self.path).st_mtime
        except OSError:
            return None if self.seen_m is None else self.mono() - self.seen_m
        now_m = self.mono()
        if mtime != self.mtime:
            first = self.mtime is None
            self.mtime = mtime
            self.seen_m = now_m - (min(max(0.0, self.wall() - mtime), self.lease_s)
                                   if first else 0.0)
        return now_m - self.seen_m


class MasterStore:
    """The master's part: the channel's server and the run's record, lease and settle."""

    def __init__(self, p, timings, server, state, log, clock):
        self.p, self.t, self.server, self.state, self.log = p, timings, server, state, log
        self.clock = clock          # Clock: every time given to the record
        self.lease = Lease(os.path.join(p["run_dir"], LEASE), timings.lease_s)
        self.detached = False       # detach=true: the run is the hosts' alone, no lease
        self.agents = []            # this host's agent, obeying like any other host's
        self.settle_until = None
        self.last_write = 0.0
        self.next_file_look = 0.0
        self.refused_said = {}
        # The run's checkpoints, seen from outside (checkpoint_dir): node_rank 0 holds global
        # rank 0, which writes them in nearly every framework; with shared storage it sees
        # every host's.
        where = checkpoint_path(p)
        # Per-rank shard files are one save once every rank's is there: the world's size.
        self.checkpoints = ckptwatch.Watcher(
            where, world=int(p["nnodes"]) * int(p["nproc_per_node"])) \
            if where else None

    def handle(self, host, body):
        """One verified message from a host; returns the reply."""
        if self.state.report(host, self.clock(), body) is not None:
            self.abort_everyone()
        if self.state.failure is not None and host != self.p["host"]:
            return self.abort_message()
        reply = {"t": runstate.ACK, "phase": self.state.phase}
        ping = self.state.straggle.offsets.ping(host, self.clock()) \
            if body.get("t") == runstate.BEAT and host != self.p["host"] else None
        return reply if ping is None else dict(reply, ping=ping)

    def closed(self, host):
        self.state.closed(host, self.clock())

    def abort_message(self):
        return {"t": runstate.ABORT, "failure": self.state.failure,
                "dump": self.state.phase == runstate.HANG}

    def abort_everyone(self):
        failure = self.state.failure
        self.log("run failed: %s" % runstate.failure_text(failure))
        message = self.abort_message()
        self.server.broadcast(message)
        for agent in self.agents:
            agent.obey(message)

    def step(self, now_m):
        self.server.step(self.t.LOOK_S, self.handle, self.closed)
        now = self.clock()
        if self.state.straggle.offsets.ping(self.p["host"], now) is not None:
            # This host's own clock against the record's, measured without a trip.
            self.state.straggle.offsets.measured(self.p["host"], time.time() - self.clock(), 0.0)
        if now_m >= self.next_file_look:
            self.next_file_look = now_m + self.t.BEAT_S
            self._take_checkpoints(now)
            self._read_start_failures(now)
            self._read_stop_request(now)
            self._read_detached()
            self._count_refusals()
        if self.detached:  # no controller to hold a lease: the run's own bounds judge it
            judged = self.state.tick(now)
        else:
            judged = self.state.tick(now, self.lease.age(), self.t.lease_s, self.t.start_bound_s)
        if judged is not None:
            self.abort_everyone()
        self.write_state()

    def _take_checkpoints(self, now):
        """What the checkpoint watch found, dated on the record's clock (the watch dates on
        this host's wall clock: at = now - (wall now - t))."""
        if self.checkpoints is None:
            return
        found, warnings = self.checkpoints.take()
        shift = now - time.time()
        for c in found:
            kept = self.state.checkpoint_seen(now, dict(c, began=c["began"] + shift,
                                                        ended=c["ended"] + shift))
            if kept is not None:
                self.log("checkpoint %s (step %s, %d bytes) written in %.1f s" % (
                    kept["path"], kept["step"], kept["bytes"], kept["ended"] - kept["began"]))
        for text in warnings:
            self.state.checkpoint_warning("%s: %s" % (self.p["host"], text))
            self.log("checkpoint watch: %s" % text)
        self.state.checkpoint_blind(self.checkpoints.watch.blind)

    def _read_start_failures(self, now):
        """Hosts whose start task failed, as the controller's watch wrote them here (the
        master's own directory: only the run's user can write it)."""
        failed = read_json(os.path.join(self.p["run_dir"], START_FAILED))
        if not isinstance(failed, dict):
            return
        for host, why in sorted(failed.items(), key=lambda kv: self.state.order.index(kv[0])
                                if kv[0] in self.state.order else 0):
            if isinstance(why, str) and self.state.not_started(
                    host, now, "its start failed: %s" % why) is not None:
                self.abort_everyone()

    def _read_stop_request(self, now):
        """The run is to stop now, asked through a look: the controller is ending (Ctrl-C,
        SIGTERM, its ansible-playbook gone) or the user stops a detached run (stop.yml), the
        request saying which in words (the master's own directory: only the run's user can
        write it)."""
        if self.state.phase != runstate.RUNNING:
            return
        asked = read_json(os.path.join(self.p["run_dir"], STOP_REQUEST))
        if isinstance(asked, dict) and self.state.fail(
                None, runstate.STOPPED_BY_USER, now, str(asked.get("why"))[:300]):
            self.abort_everyone()

    def _read_detached(self):
        """The controller detached the run (a look with detach, once every rank ran): from
        now on no controller's look is awaited (the master's own directory: only the run's
        user can write it)."""
        if not self.detached and os.path.exists(os.path.join(self.p["run_dir"], DETACHED)):
            self.detached = True
            self.log("detached: the controller's lease is off; the run ends on its own")

    def _count_refusals(self):
        refused = {k: v for k, v in self.server.refused.items() if v}
        if refused != self.refused_said:
            self.refused_said = dict(refused)
            self.state.refused = dict(refused)
            self.log("control port: refused %s" % ", ".join(
                "%d %s" % (n, why) for why, n in sorted(refused.items())))

    def done(self, now_m):
        """The master stays while any host may still report, within a bound.

        A host still running when the settle time is over has not reported its stop: it may be
        the silent cause (cut off, frozen) of what its peers reported, so the record waits
        until it reports or tick() judges it lost (lost_after_s after its last beat; its loss
        dates from then and comes first). The bound: lost_after_s more."""
        state = self.state
        if state.phase == runstate.RUNNING:
            return False
        if state.all_done():
            return True
        if self.settle_until is None:
            self.settle_until = now_m + defaults.master_settle_s(
                self.t.abort_grace_s, hang=state.phase == runstate.HANG)
        if now_m <= self.settle_until:
            return False
        unheard = any(r["state"] == runstate.STARTED for r in state.hosts.values())
        return not unheard or now_m > self.settle_until + state.lost_after_s

    def write_state(self, force=False):
        now_m = time.monotonic()
        if force or now_m - self.last_write >= self.t.BEAT_S:
            self.last_write = now_m
            write_json(os.path.join(self.p["run_dir"], CONTROL),
                       self.state.record())

    def finish(self):
        if self.checkpoints is not None:  # every torchrun ended: what is pending counts now
            self.checkpoints.finish()
            self._take_checkpoints(self.clock())
            w = self.checkpoints.watch
            self.log("checkpoint watch: %d looks, %d scans, %.1f ms CPU in all" % (
                w.looks, w.scans, w.cpu_s * 1e3))
        self.state.final = True
        self.write_state(force=True)
        self.server.close()


def checkpoint_path(p):
    """The directory the master's checkpoint watch looks at ('' for none): checkpoint_dir, a
    relative one from where the ranks start (chdir, else the host's run directory)."""
    where = os.path.expanduser(p.get("checkpoint_dir") or "")
    if where and not os.path.isabs(where):
        where = os.path.join(p.get("chdir") or p["run_dir"], where)
    return where


def serve(agent, store, client, t):
    """The loop: the master's steps its agent and the store; another host's its agent and
    its connection. Returns (rc, reason)."""
    while True:
        now_m = time.monotonic()
        rc = agent.step(now_m)
        if store is not None:
            store.step(now_m)
            if rc is not None and store.done(now_m):
                store.finish()
                return rc, agent.reason
            continue
        for message in client.step(t.LOOK_S):
            agent.obey(message)
        if not client.connected:
            agent.exit_sent = False  # said again once reconnected
        heard = client.last_heard
        silent = now_m - (heard if heard is not None else agent.started_m)
        if silent > (t.lost_after_s if heard is not None else t.join_timeout_s):
            agent.stop_alone("master_lost")
            if agent.proc.poll() is not None:
                client.close()
                return agent.proc.wait(), agent.reason
        if rc is not None and (agent.exit_acked or agent.stopping is not None
                               and agent.exit_sent):
            client.close()
            return rc, agent.reason


class Box:
    """The run's container on this host (container_image; run/container.py builds every
    command line): its name, and the host PID of its first process (torchrun) once known."""

    def __init__(self, p, script):
        self.runtime = p["container_runtime"]
        # (an archive's: the tag preflight loaded it under; None where it is not a file here)
        self.image = container.local_image(self.runtime, p["container_image"])
        self.name = container.name(p["run_id"], p["host"], p["attempt"])
        paths = [p["run_dir"], p["chdir"] or "", os.path.dirname(script),
                 checkpoint_path(p)] + [os.path.expanduser(d) for d in p["data_paths"]]
        self.mounts = container.mounts(paths, p["container_mounts"])
        self.options, self.gpus, self.ib = p["container_options"], p["container_gpus"], \
            p["network"] == "ib"
        self.workdir = p["chdir"] or p["run_dir"]
        self.pid = self.first = None
        self.next_look_m = 0.0

    def wrap(self, argv, extra_env):
        """(the runtime's argv that runs torchrun's `argv` in the image, the variables the
        runtime's own process gets besides the agent's)."""
        names, env = container.run_env(self.runtime, extra_env, self.gpus)
        return container.run_argv(self.runtime, self.image, self.name, argv, names, self.mounts,
                                  self.options, gpus=self.gpus, ib=self.ib,
                                  workdir=self.workdir), env

    def find_pid(self, command, child_pid):
        """The host PID of the container's torchrun once found: podman's and docker's under
        their own daemon, not the agent's child (the container's first process, asked of the
        runtime once a beat until it runs, then torchrun at or below it: an image's init,
        tini or --init, or an entrypoint script that does not exec, is first, with torchrun
        its child); apptainer's and enroot's in the agent's own tree below its child
        `child_pid` (the runtime's process), found by its ranks at the look they run."""
        argv = container.pid_argv(self.runtime, self.name)
        if argv is None and not self.pid:
            self.pid = procs.find_torchrun(child_pid)
        if argv is None or self.pid:
            return self.pid
        if self.first is None and time.monotonic() >= self.next_look_m:
            self.next_look_m = time.monotonic() + defaults.BEAT_S  # (a command: once a beat)
            out, why = command(argv, timeout_s=10)
            if why is None and out and out.strip().isdigit() and int(out.strip()) > 0:
                self.first = int(out.strip())
        if self.first is not None:
            self.pid = procs.find_torchrun(self.first)
        # (torchrun only: an init counted as a live rank would beat "alive" before any rank
        # runs, and the hang judge would start counting a slow start; a stop reads `first`)
        return self.pid

    def remove(self, command, log):
        """Remove the container by its name (nothing of the run is left: a stop, an abort,
        the end); one that is gone already is no error."""
        argv = container.remove_argv(self.runtime, self.name)
        if argv is None:
            return
        _out, why = command(argv, timeout_s=30)
        if why is not None and "no such" not in str(why).lower():
            log("container %s not removed: %s" % (self.name, why))


def rank_env(p, box=None):
    """What every rank's environment adds to the agent's: the recorder's and straggler
    watch's settings, the user's env (it wins), the run's identity."""
    env = {}
    if os.environ.get("PYTHONPATH") and box is None:  # (the host's paths mean nothing in an image)
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    env.update(flight.rank_env(p["flight_recorder"], p["run_dir"]))  # the user's env wins
    env.update(straggle.rank_env(p["flight_recorder"]))
    env.update({k: str(v) for k, v in p["env"].items()})
    env.update({RUN_ID_ENV: p["run_id"], HOST_ENV: p["host"],
                "TORCHFLEET_OUT_DIR": os.path.join(p["run_dir"], RESULTS),
                "PYTHONUNBUFFERED": "1"})
    # A hang's stacks where py-spy cannot attach; how each rank's script ended; where each
    # rank is in its collectives.
    stacks.install_hook(p["run_dir"], env, exits.NOTE + (flight.WATCHER if p["flight_recorder"] > 0
                                                         else ""))
    return env


def start_torchrun(p, argv, box=None):
    """torchrun started, on the host or (box) in the run's container; returns (Popen, the
    argv started)."""
    extra = rank_env(p, box)
    env = dict(os.environ, **extra)
    if box is not None:
        argv, runtime_env = box.wrap(argv, extra)
        env.update(runtime_env)
    agent_pid = os.getpid()
    with open(os.path.join(p["run_dir"], TORCHRUN_LOG), "ab") as log:
        # Own session: Ansible's async timeout kills the wrapper's process group, not the run;
        # the run is stopped by its agent, or by its recorded PID (torchrun_stop).
        # (A container's client forwards the SIGTERM to torchrun in it: --sig-proxy.)
        return subprocess.Popen(argv, cwd=p["chdir"] or p["run_dir"], env=env,
                                stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                # SIGTERM: torchrun then stops its workers
                                preexec_fn=lambda: procs.die_with(agent_pid, signal.SIGTERM)), argv


def report_not_started(p, secret, detail):
    """An agent that cannot start torchrun tells the master at once (bounded wait), so the run
    fails in seconds naming this host instead of after join_timeout_s."""
    if p["node_rank"] == 0:
        return
    client = Client(p["master_addr"], p["control_port"], secret, p["host"], 1.0)
    deadline = time.monotonic() + min(10.0, p["join_timeout_s"])
    sent = False
    while time.monotonic() < deadline:
        for message in client.step(Timings.LOOK_S):
            if sent and message.get("t") in (runstate.ACK, runstate.ABORT):
                client.close()
                return
        if client.connected and not sent:
            sent = client.send({"t": runstate.NOT_STARTED_MSG, "detail": detail})
    client.close()


def _logger(run_dir):
    path = os.path.join(run_dir, AGENT_LOG)

    def log(line):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                now = time.time()  # (milliseconds: bench fail_fast times the abort by them)
                os.write(fd, ("%s.%03d %s\n" % (time.strftime("%H:%M:%S", time.localtime(now)),
                                                int(now * 1000) % 1000, line)).encode())
            finally:
                os.close(fd)
        except OSError:
            pass
    return log


# The control port is the ephemeral port preflight tested: between that test and this bind an
# outgoing connection of this host may hold it for a moment (its local port drawn from the same
# range). A port still taken after this long is a real conflict, named as such.
BIND_RETRY_S = 10.0


def bind_control(addr, port, secret, trusted=(), hosts=None):
    end = time.monotonic() + BIND_RETRY_S
    while True:
        try:
            return Server(addr, port, secret, trusted, hosts)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() >= end:
                raise
            time.sleep(0.25)


def unguard(p, command, log):
    """The host removes its own guard_ports table when its part of the run ends (a detached
    run, a controller that died): the table is root's, so as root or through `sudo -n`, best
    effort; what fails stays for stop.yml, which finds it by the GUARDED marker."""
    marker = os.path.join(p["run_dir"], GUARDED)
    if not os.path.exists(marker):
        return
    _out, why = command(guard.remove_argv(p["run_id"], os.geteuid()), timeout_s=10)
    if why is None:
        os.unlink(marker)
        log("guard removed: %s" % guard.table_name(p["run_id"]))
    else:
        log("guard not removed (stop.yml removes it): %s" % why)


class Part:
    """One host's part of a run once started: what serve() steps and finish() ends."""

    def __init__(self, **parts):
        self.agent, self.store, self.client = parts["agent"], parts["store"], parts["client"]
        self.watch, self.t, self.proc = parts["watch"], parts["t"], parts["proc"]
        self.argv, self.started = parts["argv"], parts["started"]


def run(p, command):
    """The whole job of torchrun_job: returns its result dict, or raises ValueError with the
    sentence to fail with. `command` runs short commands (py-spy) for it: command.bounded."""
    part = start(p, command)
    try:
        rc, reason = serve(part.agent, part.store, part.client, part.t)
    finally:
        part.watch.close()
        part.agent.deaths.close()
    return finish(p, part, rc, reason, command)


def start(p, command):
    """Everything before the loop: the run's directory, the master's store and channel or
    this host's connection, torchrun started. Raises ValueError as run() does."""
    secret = p["secret"].encode()  # the master's: the run's secret; another host's: its key
    run_dir = p["run_dir"]
    t = Timings(p)
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    # This host's part and the run's directory above it (named by the run id, so ours) are
    # private to the run's user: the ranks' logs may hold what a script printed.
    for path in (run_dir, os.path.dirname(run_dir)):
        os.chmod(path, 0o700)
    if p["guarded"]:  # the play guarded this host's ports for the run: this agent unguards
        write_json(os.path.join(run_dir, GUARDED), {"table": guard.table_name(p["run_id"])})
    try:
        for name, content in p["files"].items():
            if os.sep in name or name.startswith("."):
                raise ValueError("file name %r must be a plain name" % name)
            fd = os.open(os.path.join(run_dir, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                         0o600)
            with os.fdopen(fd, "w") as f:
                f.write(content)
        script = p["script"]
        if not os.path.isabs(script):
            script = os.path.join(run_dir, script)
        if not os.path.isfile(script):
            raise ValueError("script %s does not exist on %s; copy it there or fix `script`"
                             % (script, p["host"]))
        server = state = client = None
        clock = Clock()
        if p["node_rank"] == 0:
            state = runstate.RunState(
                p["run_id"], p["hosts"] or [p["host"]], p["nproc_per_node"], now=clock(),
                join_timeout_s=p["join_timeout_s"], lost_after_s=p["lost_after_s"],
                hang_timeout_s=p["hang_timeout_s"], job_timeout_s=p["job_timeout_s"],
                straggler_window_s=p["straggler_window_s"],
                straggler_threshold=p["straggler_threshold"],
                straggler_action=p["straggler_action"], recording=p["flight_recorder"] > 0,
                checkpoint_dir=p.get("checkpoint_dir") or "", actions=p.get("actions"))
            try:
                server = bind_control(p["master_addr"], p["control_port"], secret,
                                      p["host_addrs"], p["hosts"] or [p["host"]])
            except OSError as exc:
                raise ValueError("the master %s cannot listen on its control port %s:%d (%s); "
                                 "free it or set -e control_port=N" % (
                                     p["host"], p["master_addr"], p["control_port"],
                                     exc.strerror or exc)) from None
        else:
            client = Client(p["master_addr"], p["control_port"], secret, p["host"])
    except ValueError as exc:
        report_not_started(p, secret, str(exc))
        raise
    argv = torchrun_argv(p, script)
    # The kernel log from before torchrun starts: nothing of the run's is missed.
    watch = hwwatch.HostWatch(p["kernel_log"], p["rdma_sysfs"], command, env=dict(
        os.environ, **{k: str(v) for k, v in p["env"].items()}),  # the ranks' (start_torchrun)
        master_addr=p["master_addr"])  # its route: the run's NIC where socket_ifname is unset
    started = time.time()
    box = Box(p, script) if p.get("container_image") else None
    detail, create = None, None
    if box is not None and box.image is None:
        detail = "the archive %s (container_image) is not a file on %s" % (
            p["container_image"], p["host"])
    elif box is not None:
        create = container.create_argv(box.runtime, box.image, box.name)
    if create is not None:  # (enroot: from the file preflight's probe imported or found)
        _out, why = command(create, timeout_s=defaults.CONTAINER_CREATE_TIMEOUT_S)
        if why is not None:
            detail = "%s cannot make the run's container from %s on %s: %s" % (
                box.runtime, create[-1], p["host"], why)
    if detail is not None:
        watch.close()
        report_not_started(p, secret, detail)
        raise ValueError(detail)
    proc, argv = start_torchrun(p, argv, box)
    write_json(os.path.join(run_dir, PIDFILE), dict({
        "pid": proc.pid, "run_id": p["run_id"], "host": p["host"], "argv": argv,
        "started": started}, **({"container": {"runtime": box.runtime, "name": box.name}}
                                if box is not None else {})))
    store = None
    if server is not None:
        store = MasterStore(p, t, server, state, _logger(run_dir), clock)
        agent = HostAgent(p, proc, command, t,
                          lambda body: store.handle(p["host"], body) is not None, watch, box)
        store.agents.append(agent)
        state.beat(p["host"], clock(), pid=proc.pid)
    else:
        agent = HostAgent(p, proc, command, t, client.send, watch, box)
    return Part(agent=agent, store=store, client=client, watch=watch, t=t, proc=proc, argv=argv,
                started=started)


def finish(p, part, rc, reason, command):
    """After the loop: the exit written beside the run, the guard removed; run()'s result."""
    ended = time.time()
    write_json(os.path.join(p["run_dir"], EXITCODE),
               {"rc": rc, "reason": reason, "ended": ended})
    unguard(p, command, _logger(p["run_dir"]))
    if part.agent.box is not None:  # ended by itself (--rm) or stopped: nothing is left
        part.agent.box.remove(command, _logger(p["run_dir"]))
    return dict(changed=True, rc=rc, pid=part.proc.pid, reason=reason,
                duration_s=round(ended - part.started, 3), argv=part.argv)
