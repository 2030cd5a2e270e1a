# -*- coding: utf-8 -*-
"""Inventory plugin: the nodes of a running Slurm job, in allocation order, as group `nodes`."""
from __future__ import annotations

DOCUMENTATION = r"""
name: slurm
short_description: The nodes of a running Slurm job as the group C(nodes), in allocation order
description:
  - Reads one running Slurm job with C(scontrol) and puts its nodes in the group C(nodes), in
    the order of C(scontrol show hostnames) of the job's NodeList (Slurm's own node order, the
    order of C(SLURM_JOB_NODELIST)), so the first node is the master, node_rank 0.
  - Each host is the Slurm node name, with C(ansible_host) set to the node's NodeAddr.
  - When the job asked for GPUs (C(--gres=gpu:N), C(--gpus-per-node), C(--gpus)), the group gets
    C(nproc_per_node) = the GPUs the job holds per node; the user's group_vars and C(-e) still
    win over it.
  - Connection settings (user, key, jump host) come from the user's group_vars or C(-e), as
    with any inventory.
  - The file name must end in C(slurm.yml) or C(slurm.yaml).
options:
  plugin:
    description: This plugin's name.
    required: true
    type: str
    choices: [torchfleet.fleet.slurm]
  job_id:
    description:
      - The Slurm job whose nodes are the inventory. Set in the source file, it wins over the
        environment; otherwise the job the controller runs in (C(salloc), C(sbatch)).
    type: str
    env:
      - name: SLURM_JOB_ID
  scontrol:
    description: The C(scontrol) command (a name on PATH or a path).
    type: str
    default: scontrol
  ssh_retries:
    description:
      - C(ansible_ssh_retries) for the nodes. With C(pam_slurm_adopt) a node refuses SSH until
        the job has reached it; a refused connection is retried this many times (1, 3, 7 s
        apart) before the host is named unreachable.
    type: int
    default: 3
"""

EXAMPLES = r"""
# inventory/slurm.yml; inside `salloc -N 8` or an sbatch script:
#   ansible-playbook -i inventory/slurm.yml preflight.yml
plugin: torchfleet.fleet.slurm
# A job by its id, from a login node (SLURM_JOB_ID otherwise):
job_id: "123456"
"""

import re
import subprocess

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin

GROUP = "nodes"
JOB_ID = re.compile(r"^[0-9]+(?:[_+][0-9]+)?$")  # 123, an array task 123_4, a het job 123+0
FIELD = re.compile(r"(?:^|\s)([A-Za-z/:]+)=(\S*)")
GPUS = re.compile(r"gres[:/]gpu(?::[^:,=]+)?[:=]([0-9]+)")
TIMEOUT_S = 60


def fields(line: str) -> dict[str, str]:
    """The Key=Value fields of one `scontrol -o` line (the first of a repeated key wins)."""
    out: dict[str, str] = {}
    for key, value in FIELD.findall(line):
        out.setdefault(key, value)
    return out


def gpus_per_node(job: dict[str, str]) -> int | None:
    """The GPUs the job holds on each node, or None when it asked for none (or the total does
    not divide evenly among its nodes, where no single number is right)."""
    per_node = GPUS.search(job.get("TresPerNode", ""))
    if per_node:
        return int(per_node.group(1))
    nodes = int(job.get("NumNodes", "0") or 0)
    for key in ("TRES", "TresPerJob"):
        total = GPUS.search(job.get(key, "").replace("gres/gpu=", "gres/gpu:"))
        if total and nodes and int(total.group(1)) % nodes == 0:
            return int(total.group(1)) // nodes
    return None


def node_addresses(text: str) -> dict[str, str]:
    """NodeName -> NodeAddr from `scontrol -o show node` lines."""
    out = {}
    for line in text.splitlines():
        node = fields(line)
        if node.get("NodeName"):
            out[node["NodeName"]] = node.get("NodeAddr", "")
    return out


class InventoryModule(BaseInventoryPlugin):
    NAME = "torchfleet.fleet.slurm"

    def verify_file(self, path):
        return super().verify_file(path) and path.endswith(("slurm.yml", "slurm.yaml"))

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        job_id = (self.get_option("job_id") or "").strip()
        if not job_id:
            raise AnsibleParserError(
                "no Slurm job for %s: SLURM_JOB_ID is not set and the file has no job_id; run "
                "inside the job (salloc / sbatch) or set job_id: to a running job's id" % path)
        if not JOB_ID.match(job_id):
            raise AnsibleParserError(
                "Slurm job id %r (SLURM_JOB_ID or job_id: in %s) is not a job id; use the "
                "number squeue shows" % (job_id, path))
        job = fields(self._scontrol(job_id, "-o", "show", "job", job_id))
        state = job.get("JobState", "UNKNOWN")
        if state != "RUNNING":
            raise AnsibleParserError(
                "Slurm job %s is %s, not RUNNING: it holds no nodes to run on; %s"
                % (job_id, state, "wait until squeue shows it running" if state in (
                    "PENDING", "CONFIGURING") else "start a new allocation (salloc / sbatch)"))
        nodelist = job.get("NodeList", "")
        hosts = self._scontrol(job_id, "show", "hostnames", nodelist).split()
        addresses = node_addresses(self._scontrol(job_id, "-o", "show", "node", nodelist))
        self.inventory.add_group(GROUP)
        for host in hosts:
            address = addresses.get(host, "")
            if not address or address == "(null)":
                raise AnsibleParserError(
                    "node %s of Slurm job %s has no NodeAddr in `scontrol show node %s`; "
                    "set NodeAddr in slurm.conf or ansible_host for it in host_vars"
                    % (host, job_id, host))
            self.inventory.add_host(host, group=GROUP)
            self.inventory.set_variable(host, "ansible_host", address)
            self.inventory.set_variable(host, "slurm_node", host)  # what slurm_drain drains
        self.inventory.set_variable(GROUP, "slurm_job_id", job_id)
        self.inventory.set_variable(GROUP, "slurm_scontrol", self.get_option("scontrol"))
        self.inventory.set_variable(GROUP, "ansible_ssh_retries", self.get_option("ssh_retries"))
        gpus = gpus_per_node(job)
        if gpus:
            self.inventory.set_variable(GROUP, "nproc_per_node", gpus)

    def _scontrol(self, job_id, *args):
        command = self.get_option("scontrol")
        try:
            proc = subprocess.run([command, *args], capture_output=True, text=True,
                                  timeout=TIMEOUT_S, check=False)
        except FileNotFoundError:
            raise AnsibleParserError(
                "%s not found on this controller, needed to read Slurm job %s; run from a node "
                "with Slurm's client commands, or set scontrol: to its path" % (command, job_id)
            ) from None
        except subprocess.TimeoutExpired:
            raise AnsibleParserError(
                "`%s %s` did not answer in %d s (Slurm job %s); check that slurmctld is up "
                "(scontrol ping)" % (command, " ".join(args), TIMEOUT_S, job_id)) from None
        if proc.returncode != 0:
            said = ((proc.stderr or proc.stdout).strip().splitlines() or ["no output"])[-1]
            if "Invalid job id" in said:
                raise AnsibleParserError(
                    "Slurm job %s is not known to slurmctld (it never ran, or ended longer ago "
                    "than MinJobAge); start a new allocation (salloc / sbatch)" % job_id)
            raise AnsibleParserError("`%s %s` failed for Slurm job %s: %s"
                                     % (command, " ".join(args), job_id, said))
        return proc.stdout
