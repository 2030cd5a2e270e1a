"""A host's agent for one run: starts torchrun, reports to the master, obeys the master.

One loop owns the fate of this host's torchrun (the shape of torch elastic's agent loop). Every
host runs it as the async torchrun_job task; the master's (node_rank 0) also serves the
control channel and owns the run's state (runstate.RunState), so the hosts stop each other
without the controller:

- torchrun exits non-zero or vanishes here -> reported at once -> the master records the first
  failure and sends abort to every host -> each agent stops its own torchrun (SIGTERM, then
  SIGKILL after abort_grace_s);
- a host silent for lost_after_s -> host.lost, the others are stopped;
- the master silent for lost_after_s (or never reached within join_timeout_s) -> this agent
  stops its torchrun by itself;
- no rank progress anywhere for hang_timeout_s -> abort with dump: every agent writes its
  ranks' py-spy stacks first;
- the controller stops renewing the master's lease (interrupted, lost) -> abort.

torchrun uses the static rendezvous (--node-rank = the host's position in the inventory), so
rank order is inventory order at any N; its store lives under the run id's prefix, so a stale
agent of an earlier run is never joined.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time

from ansible.module_utils.torchfleet import procs, runstate
from ansible.module_utils.torchfleet.control import Client, Server
from ansible.module_utils.torchfleet.procs import HOST_ENV, RUN_ID_ENV, run_processes, stop_run
from ansible.module_utils.torchfleet.rundir import (
    CONTROL, EXITCODE, LEASE, LOGS, PIDFILE, RESULTS, STACK_DUMP, TORCHRUN_LOG, rank_dirs,
    root_cause, tail, write_json)

LOOK_S = 0.1   # how often the loop looks at torchrun and the channel
BEAT_S = 1.0   # how often a host reports; lost_after_s is many beats


def torchrun_argv(p, script):
    """torchrun with the static rendezvous: the node rank is the host's place in the inventory."""
    return [
        p["python"], "-m", "torch.distributed.run",
        "--nnodes", str(p["nnodes"]),
        "--nproc-per-node", str(p["nproc_per_node"]),
        "--node-rank", str(p["node_rank"]),
        "--rdzv-backend", "static",
        "--rdzv-endpoint", "%s:%d" % (p["master_addr"], p["master_port"]),
        "--rdzv-id", p["run_id"],
        "--rdzv-conf", "timeout=%d" % p["join_timeout_s"],
        "--local-addr", p["local_addr"],
        "--max-restarts", str(p["max_restarts"]),
        "--log-dir", os.path.join(p["run_dir"], LOGS),
        "--redirects", "3",
        script, *p["script_args"],
    ]


def find_py_spy(python):
    beside = os.path.join(os.path.dirname(python or ""), "py-spy")
    return beside if os.access(beside, os.X_OK) else shutil.which("py-spy")


def worker_pids(run_id, torchrun_pid):
    """{local_rank: (pid, global rank)} of the live workers this host's torchrun started."""
    workers = {}
    for pid in run_processes(run_id, torchrun_pid, orphans=False):
        if pid == torchrun_pid:
            continue
        env = procs.environ(pid)
        if b"LOCAL_RANK" in env and env.get(b"TORCHELASTIC_RUN_ID") is not None:
            workers.setdefault(int(env[b"LOCAL_RANK"]), (pid, int(env.get(b"RANK", b"-1"))))
    return workers


def dump_stacks(run, py_spy, run_id, torchrun_pid, run_dir):
    """Each live rank's Python stack into its log directory (before anything is stopped);
    `run` is the module's command runner (command.bounded)."""
    dirs = rank_dirs(run_dir)
    for local_rank, (pid, rank) in sorted(worker_pids(run_id, torchrun_pid).items()):
        text = "# rank %s (local rank %s, pid %s)\n" % (rank, local_rank, pid)
        if not py_spy:
            text += "py-spy is not installed on this host; pip install py-spy to get stacks\n"
        else:
            out, err = run([py_spy, "dump", "--pid", str(pid)], timeout_s=60)
            text += out if out is not None else "py-spy failed: %s\n" % err
        if local_rank in dirs:
            with open(os.path.join(dirs[local_rank], STACK_DUMP), "w") as f:
                f.write(text)


def local_status(run_dir, pid):
    """What a beat reports: ranks alive, newest log write of any rank, local rank 0's last line."""
    newest, last = None, ""
    for local_rank, rdir in rank_dirs(run_dir).items():
        for name in ("stdout.log", "stderr.log"):
            try:
                mtime = os.stat(os.path.join(rdir, name)).st_mtime
            except OSError:
                continue
            newest = mtime if newest is None else max(newest, mtime)
        if local_rank == 0:
            last = tail(os.path.join(rdir, "stdout.log"), 1) or tail(os.path.join(rdir,
                                                                                  "stderr.log"), 1)
    return {"alive": len(procs.children(pid)), "progress_ts": newest,
            "last_line": last[-300:], "pid": pid}


class Agent:
    def __init__(self, p, proc, command, server=None, client=None, state=None):
        self.p, self.proc, self.command = p, proc, command
        self.server, self.client, self.state = server, client, state
        self.host = p["host"]
        self.started_m = time.monotonic()
        self.next_beat = 0.0
        self.stopping = None      # the abort this agent obeyed, if any
        self.reason = "exited"    # exited | aborted | master_lost | lease
        self.exit_sent = False
        self.exit_acked = False
        self.last_write = 0.0
        self.settle_until = None  # the master's bound on waiting for reports after the end
        self.py_spy = find_py_spy(p["python"])

    # -- reports ---------------------------------------------------------------------------

    def report(self, body):
        """Master: straight into the run's state. Others: over the channel."""
        if self.server is None:
            return self.client.send(body)
        self.handle(self.host, body)
        return True

    def handle(self, host, body):
        """The master's handling of one verified message; returns the reply."""
        now, kind, state = time.time(), body.get("t"), self.state
        failure = None
        if kind == "beat":
            state.beat(host, now, body.get("alive", 0), body.get("progress_ts"),
                       body.get("last_line", ""), body.get("pid"))
        elif kind == "exit":
            failure = state.exited(host, now, body.get("rc"), stopped=bool(body.get("stopped")),
                                   vanished=bool(body.get("vanished")),
                                   root_cause=body.get("root_cause"),
                                   last_line=body.get("last_line", ""))
        elif kind == "not_started":
            failure = state.not_started(host, now, str(body.get("detail", ""))[:1000])
        if failure is not None:
            self.abort_everyone()
        if state.failure is not None and host != self.host:
            return self.abort_message()
        return {"t": "ack", "phase": state.phase}

    def abort_message(self):
        return {"t": "abort", "failure": self.state.failure,
                "dump": self.state.phase == runstate.HANG}

    def abort_everyone(self):
        message = self.abort_message()
        self.server.broadcast(message)
        self.obey(message)

    # -- what this host does -----------------------------------------------------------------

    def obey(self, message):
        kind = message.get("t")
        if kind in ("ack", "abort") and self.exit_sent:
            self.exit_acked = True  # the master has heard how this host's torchrun ended
        # A torchrun that already ended is not stopped: its own exit stands.
        if kind != "abort" or self.stopping is not None or self.proc.poll() is not None:
            return
        self.stopping, self.reason = message, "aborted"
        if self.proc.poll() is None:
            if message.get("dump"):
                dump_stacks(self.command, self.py_spy, self.p["run_id"], self.proc.pid,
                            self.p["run_dir"])
            stop_run(self.p["run_id"], self.proc.pid, grace_s=self.p["abort_grace_s"],
                     host=self.host, all_at_once=True)

    def stop_alone(self, reason):
        """The master (or, on the master, the controller) is gone: stop without being told."""
        if self.stopping is None:
            self.stopping, self.reason = {"t": "abort", "failure": None}, reason
            if self.proc.poll() is None:
                stop_run(self.p["run_id"], self.proc.pid, grace_s=self.p["abort_grace_s"],
                         host=self.host, all_at_once=True)

    def exit_body(self, rc):
        text = tail(os.path.join(self.p["run_dir"], TORCHRUN_LOG), 200, 1 << 20)
        status = local_status(self.p["run_dir"], self.proc.pid)
        return {"t": "exit", "rc": rc, "stopped": self.stopping is not None,
                "root_cause": root_cause(text) if rc else None,
                "last_line": status["last_line"]}

    # -- the loop ---------------------------------------------------------------------------

    def run(self):
        p = self.p
        while True:
            now_m = time.monotonic()
            rc = self.proc.poll()
            if rc is None and now_m >= self.next_beat:
                self.next_beat = now_m + BEAT_S
                self.report(dict(local_status(p["run_dir"], self.proc.pid), t="beat"))
            if rc is not None and not self.exit_sent:
                self.exit_sent = self.report(self.exit_body(rc))
            if self.server is not None:
                self.server.step(LOOK_S, self.handle)
                if self.state.tick(time.time(), self.lease_age(), p["lease_s"]) is not None:
                    self.abort_everyone()
                self.write_state()
                if rc is not None and self.master_done(now_m):
                    return self.finish(rc)
            else:
                for message in self.client.step(LOOK_S):
                    self.obey(message)
                if not self.client.connected:
                    self.exit_sent = False  # said again once reconnected
                heard = self.client.last_heard
                silent = now_m - (heard if heard is not None else self.started_m)
                if silent > (p["lost_after_s"] if heard is not None else p["join_timeout_s"]):
                    self.stop_alone("master_lost")
                    if self.proc.poll() is not None:
                        return self.finish(self.proc.wait())
                if rc is not None and (self.exit_acked or self.stopping is not None
                                       and self.exit_sent):
                    return self.finish(rc)

    def lease_age(self):
        try:
            return time.time() - os.stat(os.path.join(self.p["run_dir"], LEASE)).st_mtime
        except OSError:
            return None

    def master_done(self, now_m):
        """The master's agent stays while any host may still report, within a bound."""
        state = self.state
        if state.phase == runstate.RUNNING:
            return False
        if state.all_done():
            return True
        if self.settle_until is None:
            dump_s = 70 if state.phase == runstate.HANG else 0
            self.settle_until = now_m + self.p["abort_grace_s"] + 5 + dump_s
        return now_m > self.settle_until

    def write_state(self, force=False):
        now_m = time.monotonic()
        if force or now_m - self.last_write >= BEAT_S:
            self.last_write = now_m
            write_json(os.path.join(self.p["run_dir"], CONTROL), self.state.record())

    def finish(self, rc):
        if self.server is not None:
            self.state.final = True
            self.write_state(force=True)
            self.server.close()
        else:
            self.client.close()
        return rc, self.reason


def start_torchrun(p, argv):
    env = dict(os.environ)
    env.update({k: str(v) for k, v in p["env"].items()})
    env.update({RUN_ID_ENV: p["run_id"], HOST_ENV: p["host"],
                "TORCHFLEET_OUT_DIR": os.path.join(p["run_dir"], RESULTS),
                "PYTHONUNBUFFERED": "1"})
    open(os.path.join(p["run_dir"], LEASE), "a").close()
    with open(os.path.join(p["run_dir"], TORCHRUN_LOG), "ab") as log:
        # Own session: Ansible's async timeout kills the wrapper's process group, not the run;
        # the run is stopped by its agent, or by its recorded PID (torchrun_stop).
        return subprocess.Popen(argv, cwd=p["chdir"] or p["run_dir"], env=env,
                                stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def report_not_started(p, secret, detail):
    """An agent that cannot start torchrun tells the master at once (bounded wait), so the run
    fails in seconds naming this host instead of after join_timeout_s."""
    if p["node_rank"] == 0:
        return
    client = Client(p["master_addr"], p["control_port"], secret, p["host"], 1.0)
    deadline = time.monotonic() + min(10.0, p["join_timeout_s"])
    sent = False
    while time.monotonic() < deadline:
        for message in client.step(LOOK_S):
            if sent and message.get("t") in ("ack", "abort"):
                client.close()
                return
        if client.connected and not sent:
            sent = client.send({"t": "not_started", "detail": detail})
    client.close()


def run(p, command):
    """The whole job of torchrun_job: returns its result dict, or raises ValueError with the
    sentence to fail with. `command` runs short commands (py-spy) for it: command.bounded."""
    secret = p["secret"].encode()
    run_dir = p["run_dir"]
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    os.chmod(run_dir, 0o700)
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
        if p["node_rank"] == 0:
            state = runstate.RunState(
                p["run_id"], p["hosts"] or [p["host"]], p["nproc_per_node"],
                join_timeout_s=p["join_timeout_s"], lost_after_s=p["lost_after_s"],
                hang_timeout_s=p["hang_timeout_s"], job_timeout_s=p["job_timeout_s"])
            try:
                server = Server(p["master_addr"], p["control_port"], secret)
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
    started = time.time()
    proc = start_torchrun(p, argv)
    write_json(os.path.join(run_dir, PIDFILE), {"pid": proc.pid, "run_id": p["run_id"],
                                                "host": p["host"], "argv": argv,
                                                "started": started})
    agent = Agent(p, proc, command, server=server, client=client, state=state)
    if state is not None:
        state.beat(p["host"], time.time(), pid=proc.pid)
    rc, reason = agent.run()
    ended = time.time()
    write_json(os.path.join(run_dir, EXITCODE), {"rc": rc, "reason": reason, "ended": ended})
    return dict(changed=True, rc=rc, pid=proc.pid, reason=reason,
                duration_s=round(ended - started, 3), argv=argv)
