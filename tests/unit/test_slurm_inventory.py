"""The Slurm inventory plugin: reading scontrol's text, and the errors raised before it can
reach a cluster (no job id, no scontrol). Running jobs are tested on a real Slurm cluster in
tests/lab/test_slurm_lab.py."""
from __future__ import annotations

import os
import subprocess

import pytest

from ansible_collections.torchfleet.fleet.plugins.inventory import slurm as slurm_inventory
from torchfleet.paths import ansible_root
from torchfleet.runner import first_error
from torchfleet import ansible_cli

ROOT = ansible_root()
slurm = slurm_inventory

# Recorded from the lab's slurmctld 22.05 (`scontrol -o show job` of `salloc -N2 --gres=gpu:2`),
# cut to the fields around the ones read.
JOB_2205 = ("JobId=2 JobName=train UserId=root(0) JobState=RUNNING Reason=None ExitCode=0:0 "
            "Command=/srv/my job.sh WorkDir=/tmp/slt NodeList=node[2-3] BatchHost=node2 "
            "NumNodes=2 NumCPUs=2 NumTasks=2 TRES=cpu=2,node=2,billing=2 Features=(null) "
            "TresPerNode=gres:gpu:2")
NODES_2205 = ("NodeName=node2 Arch=x86_64 CoresPerSocket=1 Gres=gpu:2 NodeAddr=10.77.0.3 "
              "NodeHostName=node2 Version=22.05.8\n"
              "NodeName=node3 Arch=x86_64 CoresPerSocket=1 Gres=gpu:2 NodeAddr=10.77.0.4 "
              "NodeHostName=node3 Version=22.05.8\n")


def test_fields_of_a_recorded_job_line():
    job = slurm.fields(JOB_2205)
    assert (job["JobState"], job["NodeList"], job["NumNodes"]) == ("RUNNING", "node[2-3]", "2")
    assert job["TRES"] == "cpu=2,node=2,billing=2"


def test_node_addresses_of_recorded_node_lines():
    assert slurm.node_addresses(NODES_2205) == {"node2": "10.77.0.3", "node3": "10.77.0.4"}


@pytest.mark.parametrize("job, gpus", [
    ({"TresPerNode": "gres:gpu:2"}, 2),  # 22.05, --gres=gpu:2 or --gpus-per-node=2
    ({"TresPerNode": "gres/gpu:4"}, 4),  # 23.02 and later print gres/ instead of gres:
    ({"TresPerNode": "gres:gpu:a100:8"}, 8),  # a typed request
    ({"TresPerNode": "gres/gpu:h100=8"}, 8),
    ({"NumNodes": "2", "TRES": "cpu=16,mem=1G,node=2,billing=16,gres/gpu=16"}, 8),
    ({"NumNodes": "2", "TresPerJob": "gres:gpu:4"}, 2),  # --gpus=4 over 2 nodes
    ({"NumNodes": "3", "TresPerJob": "gres:gpu:4"}, None),  # no even split: left to the user
    ({"NumNodes": "2", "TRES": "cpu=2,node=2,billing=2"}, None),  # no GPUs asked for
    (slurm.fields(JOB_2205), 2),
])
def test_gpus_per_node(job, gpus):
    assert slurm.gpus_per_node(job) == gpus


def inventory(tmp_path, text, **env):
    source = tmp_path / "slurm.yml"
    source.write_text(text)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run([*ansible_cli.command("ansible-inventory"), "-i",
                           str(source), "--list"], cwd=ROOT, env=dict(environ, **env),
                          capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def test_no_job_names_slurm_job_id(tmp_path):
    rc, out = inventory(tmp_path, "plugin: torchfleet.fleet.slurm\n")
    assert rc != 0
    assert "SLURM_JOB_ID is not set and the file has no job_id" in first_error(out)


def test_missing_scontrol_and_a_bad_job_id_are_named(tmp_path):
    rc, out = inventory(tmp_path, "plugin: torchfleet.fleet.slurm\nscontrol: /nonexistent/scontrol\n",
                        SLURM_JOB_ID="1234")
    assert rc != 0
    assert first_error(out).startswith("/nonexistent/scontrol not found on this controller, "
                                       "needed to read Slurm job 1234")
    # Never handed to scontrol: an option-like id would be read as one.
    rc, out = inventory(tmp_path, "plugin: torchfleet.fleet.slurm\njob_id: '--help'\n")
    assert rc != 0 and "is not a job id" in first_error(out)
