"""The scale harness: one run of hundreds of hosts x 8 ranks on this one machine, to measure what
the master, its control channel and the controller's look cost as the fleet grows. Not the
product, and not the lab of network namespaces (lab/netns.py: real sshd and real torchrun on
every node).

What is real: the master is the torchrun_job module itself (its main() on its arguments' file,
as Ansible's async wrapper runs it: its MasterStore, its RunState judging, its control
channel's Server; only its abort's broadcast is timed, serve_master), and every other host
runs the real HostAgent (agent.start, agent.serve, agent.finish) with the real Client dialling
the master over TCP from the host's own address, real HMAC keys, the real hardware watch
following the host's own kernel log file, the real Flight Recorder positions read from each
rank's fr_position.json. The controller's look is watch.look, the function the
torchrun_watch action pipes to the master each poll.

What is simulated: torchrun and its ranks (lab/standin_torchrun.py: a launcher per host that
forks its ranks copy-on-write, which write logs and positions, die on SIGUSR1 and hang on the
fleet's control file); several hosts' agents share one process (HOSTS_PER_PROCESS), each in
a thread of its own, under SCHED_IDLE (serve_hosts), and a host's scan for its run's processes walks its
torchrun's tree (host_processes); every host is an address of 127.0.0.0/8 (127.<100+tag>.<i/250>.<i%250+1>,
its own source address on the loopback, no neighbour table, no other lab's addresses) and
lives in this machine's network namespace. No Ansible, no SSH: the controller's playbook is
not in these figures (preflight's are, from the netns lab).

    fleet = Fleet(Path("/tmp/x"), hosts=64)
    fleet.up()                      # every host's ranks reporting to the master
    fleet.kill_rank(17, 3)          # host 17's local rank 3 dies
    fleet.wait(lambda r: r["final"])
    fleet.down()
"""
from __future__ import annotations

import gc
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from ansible_collections.torchfleet.fleet.plugins.module_utils.run import agent, control, procs, runstate
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import (
    CONTROL, PIDFILE, read_json, write_json)
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.watch import look
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.command import bounded
from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.modules import torchrun_job
from lab import standin_torchrun

HOSTS_PER_PROCESS = 64
STATS_S = 1.0       # each hosts process writes its counters this often
FORKS = 64          # Ansible's forks in ansible.cfg: the launch role's join timeout counts by them
# The hosts processes and their stand-ins run under SCHED_IDLE: on a 2-core machine 512 hosts'
# agents and 4,096 ranks want more than it has, and the master's figures (its CPU, how soon it
# judges and tells) must be its own: a normal task preempts an idle one as soon as it wakes,
# where a thousand nice-10 ranks waking together would still outweigh the master. What the
# hosts do late is then the harness's delay, not the fleet's.
PREFIX = "tfscale"  # the hosts' names: tfscale000, ...


def address(tag, i):
    """Host i's address (i from 0: the master)."""
    return "127.%d.%d.%d" % (100 + tag, i // 250, i % 250 + 1)


def free_port(addr):
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


class _Module:
    """What command.bounded needs of an AnsibleModule, for agents outside one."""

    run_command_environ_update: dict = {}

    @staticmethod
    def get_bin_path(name, required=False):
        return shutil.which(name)


class Fleet:
    def __init__(self, root, hosts, nproc=8, tag=0, hang_timeout_s=60.0, lost_after_s=None,
                 flight_recorder=2000, look_s=None, step_s=1.0, lease_s=None, join_timeout_s=None):
        self.root, self.n, self.nproc, self.tag = Path(root), hosts, nproc, tag
        self.names = ["%s%03d" % (PREFIX, i) for i in range(hosts)]
        self.addrs = [address(tag, i) for i in range(hosts)]
        self.hang_timeout_s, self.lost_after_s = hang_timeout_s, lost_after_s
        self.lease_s = lease_s  # the master's lease (the module's default when None)
        # The master's join timeout; None: the launch role's rule (below). The harness starts
        # 4,096 stand-ins on 2 CPUs, which a bench may give longer than Ansible's batches take.
        self.join_timeout_s = join_timeout_s
        self.flight_recorder = flight_recorder
        # How often the hosts' agents look (agent.Timings.LOOK_S when None): slower at the
        # sizes where this machine cannot step every agent ten times a second. The master's
        # own look is the product's always.
        self.look_s = look_s
        self.step_s = step_s  # how long the stand-ins' training step (a collective) takes
        self.run_id = "scale%d-%s" % (hosts, secrets.token_hex(3))
        self.procs: list[subprocess.Popen] = []
        self.master = None
        self.t0 = 0.0
        self.control = self.root / "control.json"
        self.abort_times = self.root / "abort.json"  # the master's broadcast of its abort

    def run_dir(self, i):
        return self.root / "hosts" / self.names[i] / self.run_id / self.names[i]

    def params(self, i, secret, port):
        """Host i's torchrun_job arguments, as the launch role gives them."""
        p = {k: v.get("default") for k, v in torchrun_job.ARGUMENT_SPEC.items()}
        p.update(run_dir=str(self.run_dir(i)), run_id=self.run_id, host=self.names[i], node_rank=i,
                 hosts=self.names, host_addrs=self.addrs, python=str(self.root / "standin"),
                 script=str(self.root / "train.py"), script_args=[], files={},
                 nnodes=self.n, nproc_per_node=self.nproc, master_addr=self.addrs[0],
                 master_port=port + 1, control_port=port,
                 secret=secret if i == 0 else control.host_key(secret.encode(),
                                                               self.names[i]).decode(),
                 local_addr=self.addrs[i], hang_timeout_s=self.hang_timeout_s,
                 flight_recorder=self.flight_recorder, stack_dump="py-spy",
                 kernel_log=str(self.root / "kmsg" / self.names[i]),
                 env={standin_torchrun.CONTROL_ENV: str(self.control),
                      standin_torchrun.T0_ENV: repr(self.t0),
                      standin_torchrun.STEP_ENV: repr(self.step_s)})
        if self.lost_after_s is not None:
            p["lost_after_s"] = self.lost_after_s
        if self.lease_s is not None:
            p["lease_s"] = self.lease_s
        # The launch role's rule (its join timeout grows by fork batch, forks 64): the agents of
        # a big fleet start over a while, here as there.
        p["join_timeout_s"] = self.join_timeout_s or int(
            defaults.JOIN_BASE_S + defaults.JOIN_PER_BATCH_S * ((self.n - 1) // FORKS))
        return p

    def up(self, timeout_s=600, waves=False):
        """Start the master and every host; return once every rank reports to the master.
        waves: start each hosts process once the ones before it report every rank (the
        burst of 4,096 forks at once can starve an agent past its master's limits)."""
        (self.root / "kmsg").mkdir(parents=True, exist_ok=True)
        (self.root / "stats").mkdir(exist_ok=True)
        standin = self.root / "standin"
        standin.write_text("#!%s -IS\n" % sys.executable
                           + Path(standin_torchrun.__file__).read_text())
        standin.chmod(0o755)
        (self.root / "train.py").write_text("# the stand-in ranks do not read this\n")
        self.control.write_text("{}")
        for name in self.names:
            (self.root / "kmsg" / name).touch()
        self.t0 = time.time()
        secret, port = secrets.token_hex(16), free_port(self.addrs[0])
        args = self.root / "master.json"
        # (a None is left out, as the role omits an option: one given for an option with
        # choices, container_runtime, is refused; the module fills it in as None)
        args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {
            k: v for k, v in self.params(0, secret, port).items() if v is not None}}))
        self.master = subprocess.Popen(
            [sys.executable, "-m", "lab.scale", "master", str(args), str(self.abort_times)],
            cwd=Path(__file__).parent.parent, stdin=subprocess.DEVNULL,
            stdout=open(self.root / "master.out", "wb"), stderr=subprocess.STDOUT,
            start_new_session=True)
        self.procs.append(self.master)
        for start in range(1, self.n, HOSTS_PER_PROCESS):
            chunk = self.root / ("hosts-%04d.json" % start)
            chunk.write_text(json.dumps({
                "stats": str(self.root / "stats" / chunk.name), "look_s": self.look_s,
                "hosts": [self.params(i, secret, port)
                          for i in range(start, min(self.n, start + HOSTS_PER_PROCESS))]}))
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "lab.scale", "hosts", str(chunk)],
                cwd=Path(__file__).parent.parent,
                stdin=subprocess.DEVNULL, stdout=open(str(chunk) + ".out", "wb"),
                stderr=subprocess.STDOUT, start_new_session=True))
            if waves:
                upto = min(self.n, start + HOSTS_PER_PROCESS) - 1  # and the master's own
                self.wait(lambda r, want=upto * self.nproc: sum(
                    h.get("alive") or 0 for h in r["hosts"][1:]) >= want, timeout_s,
                    "the ranks of hosts 1-%d up" % upto)
        self.wait(lambda r: sum(h.get("alive") or 0 for h in r["hosts"])
                  == self.n * self.nproc, timeout_s, "every rank up")

    def record(self):
        return read_json(str(self.run_dir(0) / CONTROL))

    def wait(self, condition, timeout_s=300, what="the condition", poll_s=0.05, renew=True):
        """The master's record once condition(record) holds; the harness's look renews the
        master's lease as the controller's watch would (not with renew=False: a detached run,
        which no controller holds)."""
        end = time.monotonic() + timeout_s
        next_look = 0.0
        while time.monotonic() < end:
            if renew and time.monotonic() >= next_look:
                next_look = time.monotonic() + 2.0
                self.look()
            record = self.record()
            if record is not None and condition(record):
                return record
            if self.master is not None and self.master.poll() is not None:
                record = self.record()  # (the master may have ended since the read above)
                if record is not None and condition(record):
                    return record
                raise RuntimeError("the master ended (rc %s) before %s: %s" % (
                    self.master.returncode, what, json.dumps(
                        (record or {}).get("failure") or
                        (self.root / "master.out").read_text()[-6000:])[:6000]))
            time.sleep(poll_s)
        raise TimeoutError("%s within %.0f s; the master's record: %s" % (
            what, timeout_s, json.dumps(self.record())[-1500:]))

    def look(self, full=False, **extra):
        """The controller's look at the master (torchrun_watch): renews the lease unless
        extra says touch_lease=False; detach=True detaches the run."""
        return look(dict({"run_dir": str(self.run_dir(0)), "run_id": self.run_id,
                          "full": full}, **extra))

    def rank_pid(self, i, local_rank):
        path = next(self.run_dir(i).glob("logs/*/attempt_0/%d/fr_position.json" % local_rank))
        return json.loads(path.read_text())["pid"]

    def kill_rank(self, i, local_rank):
        """Host i's local rank dies (exit code 1); the time it was told."""
        pid = self.rank_pid(i, local_rank)
        at = time.time()
        os.kill(pid, signal.SIGUSR1)
        return at

    def hang(self, rank, ahead_steps=2):
        """Every rank stops at a collective ahead_steps from now, `rank` before it (it never
        joins); the time the hang begins."""
        seq = int((time.time() - self.t0) / self.step_s) + ahead_steps
        write_json(str(self.control), {"hang": {"rank": rank, "seq": seq}})
        return self.t0 + seq * self.step_s

    def launchers(self):
        """{host: pid} of every host's torchrun stand-in, from its agent's pid file."""
        out = {}
        for i, name in enumerate(self.names):
            pid = (read_json(str(self.run_dir(i) / PIDFILE)) or {}).get("pid")
            if pid is not None:
                out[name] = pid
        return out

    def stats(self):
        """The hosts processes' counters summed (bytes each way on the control channel, hosts
        still running) and every host's times ({host: {told, ended}}, wall clock)."""
        total: dict = {"sent": 0, "received": 0, "live": 0, "times": {}}
        for path in (self.root / "stats").glob("*.json"):
            s = read_json(str(path))
            if s is None:
                continue
            for k in ("sent", "received", "live"):
                total[k] += s.get(k, 0)
            total["times"].update(s.get("times", {}))
        return total

    def abort_broadcast(self):
        """(began, sent, CPU seconds, GC collections by generation) of the master's first
        broadcast (the abort), wall clock; None before one."""
        times = read_json(str(self.abort_times))
        if times is None:
            return None
        return times["began"], times["sent"], times["cpu_s"], times["gc"]

    def master_usage(self):
        """(CPU seconds, RSS bytes) of the master's process so far."""
        return process_usage(self.master.pid)

    def down(self):
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
        for proc in self.procs:
            proc.wait()
        # Stand-in launchers and ranks are in sessions of their own: found by the run id
        # their environment carries (the agent's own way, procs.run_processes).
        end = time.monotonic() + 30
        while time.monotonic() < end:
            left = procs.run_processes(self.run_id)
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.1)
        shutil.rmtree(self.root, ignore_errors=True)


def process_usage(pid):
    """(CPU seconds, RSS bytes) of a process."""
    fields = procs.stat_fields(pid)
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    return cpu, rss


def host_processes(run_id, root_pid=None, host=None, orphans=True):
    """procs.run_processes as a host of the fleet sees it: its torchrun and what descends from
    it. On a real host the agent scans that host's /proc; here /proc holds every host's
    processes, and 64 hosts in one process scanning thousands each would make a stop cost
    what the harness adds, not what the fleet does."""
    del host, orphans
    if root_pid is None or not procs.is_run_torchrun(root_pid, run_id):
        return []
    found, todo = set(), [root_pid]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(procs.children(pid))
    return sorted(pid for pid in found if procs.alive(pid))


def serve_hosts(spec_path):
    """One hosts process: each of its hosts' agents started, then served in a thread of its
    own by agent.serve, as its own process would on its own host (a host's stop waits on its
    torchrun: in turn, 64 hosts' stops would add up). Writes its counters every STATS_S, and
    each host's times: told to stop (the master's ABORT arrived), its torchrun seen ended."""
    spec = json.loads(Path(spec_path).read_text())
    # Under SCHED_IDLE (see above: the master's figures its own); the stand-ins inherit it.
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    counts = {"sent": 0, "received": 0}
    times: dict = {}
    seal, read_lines = control.seal, control._Peer.read_lines

    def counted_seal(*args):
        line = seal(*args)
        counts["sent"] += len(line)
        return line

    def counted_read(self, max_line):
        lines = read_lines(self, max_line)
        if isinstance(lines, list):
            counts["received"] += sum(len(x) + 1 for x in lines)
        return lines
    control.seal, control._Peer.read_lines = counted_seal, counted_read
    procs.run_processes = host_processes
    command = bounded(_Module())
    wall_minus_mono = time.time() - time.monotonic()

    def serve(p, part):
        obey = part.agent.obey

        def timed_obey(message):
            if message.get("t") == runstate.ABORT:
                times.setdefault(p["host"], {}).setdefault("told", time.time())
            obey(message)
        part.agent.obey = timed_obey
        try:
            rc, reason = agent.serve(part.agent, None, part.client, part.t)
        finally:
            part.watch.close()
        agent.finish(p, part, rc, reason, command)
        times.setdefault(p["host"], {})["ended"] = (part.agent.ended_m or time.monotonic()) \
            + wall_minus_mono

    threads = []
    for p in spec["hosts"]:
        part = agent.start(p, command)
        part.client.source = p["local_addr"]
        if spec["look_s"]:
            part.t.LOOK_S = spec["look_s"]
        threads.append(threading.Thread(target=serve, args=(p, part), daemon=True))
        threads[-1].start()
    while True:
        live = sum(t.is_alive() for t in threads)
        write_json(spec["stats"], dict(counts, live=live, times=times))
        if not live:
            return
        time.sleep(STATS_S)


def serve_master(args_path, times_path):
    """The master: the torchrun_job module's main() on its arguments' file, its first
    broadcast (the abort) timed: when it began, when every host's message was handed to the
    kernel (or queued behind a full socket)."""
    broadcast = control.Server.broadcast

    def timed(self, body):
        began, cpu, gcs = time.time(), time.thread_time(), [g["collections"] for g in
                                                             gc.get_stats()]
        broadcast(self, body)
        if not os.path.exists(times_path):
            write_json(times_path, {
                "began": began, "sent": time.time(), "cpu_s": time.thread_time() - cpu,
                "gc": [g["collections"] - n for g, n in zip(gc.get_stats(), gcs, strict=True)]})
    control.Server.broadcast = timed
    sys.argv = [torchrun_job.__file__, args_path]
    torchrun_job.main()


if __name__ == "__main__":
    if sys.argv[1] == "master":
        serve_master(sys.argv[2], sys.argv[3])
    else:
        serve_hosts(sys.argv[2])
