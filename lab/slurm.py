"""A real Slurm cluster on a lab: munged and slurmctld on this machine, one slurmd in each lab
node (its network, hostname and mounts), Debian's slurm-wlm 22.05 and munge.

Nothing of the machine's own Slurm or munge is used or touched: the cluster's files live in
<lab>/slurm (its slurm.conf is reached through SLURM_CONF), munged listens on a socket there
with its own key, slurmctld runs under the hostname tflab<N>-ctl on port 6920+N of the lab's
bridge address. `lab down` ends munged and slurmctld by their pid files in <lab>/daemons and
the slurmds with the nodes' namespaces.

Each node offers 2 GPUs as GRES so that jobs can ask for them (--gres=gpu:2) and Slurm
accounts for them for real; the device files behind them are stand-ins (this machine has no
GPU), which nothing but Slurm's bookkeeping reads.

    python -m lab up --nodes 3 --slurm
    SLURM_CONF=/tmp/torchfleet-lab/slurm/slurm.conf sinfo
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

from ansible_collections.torchfleet.fleet.plugins.inventory import slurm as slurm_inventory

from lab.netns import DAEMONS, Lab, LabError, lab_prefix, sh

GPUS_PER_NODE = 2
CTLD_PORT = 6920  # + the lab's tag, so labs (and a machine's own Slurm on 6817) never meet
# slurmd 22.05 will not start without its cgroup plugin, which reads these v1 hierarchies;
# `ip netns exec` gave the node a fresh /sys with none mounted (nothing is confined by them:
# proctrack/pgid and task/none).
CGROUPS = ("freezer", "cpuset", "memory", "devices", "name=systemd")
TOOLS = ("munged", "slurmctld", "slurmd", "scontrol", "sbatch", "salloc")

CONF = """\
ClusterName={cluster}
SlurmctldHost={ctl}({gateway})
SlurmctldPort={port}
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool/%n
SlurmctldPidFile={daemons}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/linear
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=600
MailProg=/bin/true
MpiDefault=none
GresTypes=gpu
NodeName=DEFAULT CPUs=1 RealMemory=100 Gres=gpu:{gpus} State=UNKNOWN
{nodes}
PartitionName=lab Nodes=ALL Default=YES MaxTime=60 State=UP
"""


class SlurmLab:
    """The Slurm cluster of `lab`; `start` brings it up, the lab's `down` removes it."""

    def __init__(self, lab: Lab):
        self.lab = lab
        self.dir = lab.root / "slurm"
        self.conf = self.dir / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with SLURM_CONF pointing at the lab's cluster."""
        return dict(os.environ, SLURM_CONF=str(self.conf))

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(list(argv), capture_output=True, text=True, env=self.env,
                              timeout=60)
        if check and proc.returncode != 0:
            raise LabError("%s failed: %s" % (" ".join(argv), (proc.stderr or proc.stdout).strip()))
        return proc

    # ---- up --------------------------------------------------------------------------------
    def start(self, timeout_s: float = 60) -> "SlurmLab":
        missing = [t for t in TOOLS if not shutil.which(t)]
        if missing:
            raise LabError("the Slurm lab needs %s: apt-get install slurm-wlm munge"
                           % ", ".join(missing))
        for sub in ("state", "spool", "dev"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        (self.lab.root / DAEMONS).mkdir(exist_ok=True)
        self._write_conf()
        self._start_munged()
        # Own hostname: slurmctld starts only where the hostname is its SlurmctldHost.
        sh("unshare", "--uts", "sh", "-c", 'hostname "$1" && exec slurmctld -i -f "$2"', "sh",
           self.controller, str(self.conf))
        for node in self.lab.nodes:
            self._start_slurmd(node)
        self.wait_idle(timeout_s)
        return self

    @property
    def controller(self) -> str:
        return lab_prefix(self.lab.tag) + "ctl"

    def _write_conf(self) -> None:
        dev = self.dir / "dev"
        for i in range(GPUS_PER_NODE):
            gpu = dev / ("gpu%d" % i)
            if not gpu.exists():  # a stand-in device node: /dev/null's numbers
                os.mknod(gpu, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        self.conf.write_text(CONF.format(
            cluster=lab_prefix(self.lab.tag).rstrip("-"), ctl=self.controller,
            gateway=self.lab.gateway, port=CTLD_PORT + self.lab.tag, socket=self.socket,
            dir=self.dir, daemons=self.lab.root / DAEMONS, gpus=GPUS_PER_NODE,
            nodes="\n".join("NodeName=%s NodeAddr=%s" % (n.name, n.address)
                            for n in self.lab.nodes)))
        (self.dir / "gres.conf").write_text("AutoDetect=off\nName=gpu File=%s/gpu[0-%d]\n"
                                            % (dev, GPUS_PER_NODE - 1))

    @property
    def socket(self) -> Path:
        return self.dir / "munge.socket"

    def _start_munged(self) -> None:
        key = self.dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        # --force: munged refuses root and a socket directory others could reach otherwise.
        sh("munged", "--force", "--socket=%s" % self.socket, "--key-file=%s" % key,
           "--pid-file=%s" % (self.lab.root / DAEMONS / "munged.pid"),
           "--log-file=%s" % (self.dir / "munged.log"), "--seed-file=%s" % (self.dir / "seed"))

    def _start_slurmd(self, node) -> None:
        sshd = self.lab.sshd_pid(node)
        if not sshd:
            raise LabError("node %s has no sshd to take its namespaces from" % node.name)
        mounts = " && ".join(
            'mkdir -p /sys/fs/cgroup/%s && mount -t cgroup -o %s tflab-cgroup /sys/fs/cgroup/%s'
            % (c.split("=")[-1], c, c.split("=")[-1]) for c in CGROUPS)
        # The node's network, hostname and mounts (its local directory) are sshd's; a private
        # copy of the mounts gets the cgroup hierarchies. No variable reaches the shell's text.
        subprocess.run(
            ["nsenter", "-t", str(sshd), "-n", "-m", "-u", "--", "unshare", "--mount",
             "--propagation", "private", "sh", "-c",
             "mount -t tmpfs tflab-cgroup /sys/fs/cgroup && %s && exec slurmd -f \"$1\"" % mounts,
             "sh", str(self.conf)], check=True, env=self.env)

    def wait_idle(self, timeout_s: float = 60) -> None:
        """Until every node has registered and is idle (a node slurmctld marked down while
        its slurmd was starting is resumed)."""
        end = time.monotonic() + timeout_s
        states: dict[str, str] = {}
        while time.monotonic() < end:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout
            states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
            if states and all(s == "idle" for s in states.values()):
                return
            for name, state in states.items():
                if state.startswith(("down", "drain", "inval")):
                    self.run("scontrol", "update", "nodename=" + name, "state=resume",
                             check=False)
            time.sleep(0.2)
        raise LabError("Slurm nodes not idle within %.0f s: %s (logs in %s)"
                       % (timeout_s, states, self.dir))

    # ---- jobs ------------------------------------------------------------------------------
    def allocate(self, *args: str) -> str:
        """A job that holds nodes and runs nothing (salloc --no-shell); returns its id."""
        out = self.run("salloc", "--no-shell", *args).stderr
        for word in out.split():
            if word.isdigit():
                return word
        raise LabError("salloc printed no job id: %s" % out)

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` of one job as Key -> Value, read as the inventory plugin reads it."""
        return slurm_inventory.fields(self.run("scontrol", "-o", "show", "job", job_id).stdout)

    def wait_job_end(self, job_id: str, timeout_s: float) -> dict[str, str]:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            job = self.job(job_id)
            if job.get("JobState") not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
                return job
            time.sleep(0.5)
        raise LabError("Slurm job %s still %s after %.0f s"
                       % (job_id, self.job(job_id).get("JobState"), timeout_s))
