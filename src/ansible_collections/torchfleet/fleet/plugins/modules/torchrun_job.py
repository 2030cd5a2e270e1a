#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: torchrun_job
short_description: This host's agent for one torchfleet run; starts torchrun and keeps the run fail-fast
description:
  - Starts C(python -m torch.distributed.run) with the static rendezvous at
    O(master_addr):O(master_port), C(--node-rank) O(node_rank) (the host's position in the
    inventory, so rank order is inventory order), the run's id as rendezvous id (a fresh store
    prefix per run), O(local_addr) as C(--local-addr), per-rank log files under O(run_dir)/logs
    and the given environment, then stays with it until the run ends.
  - The agents coordinate through one control channel on the master, with no controller in
    the loop. The master's agent (O(node_rank) 0) listens on O(master_addr):O(control_port)
    and keeps the run's state; every other agent dials in, reports a heartbeat each second
    and its exit. The first failure anywhere (a rank exiting non-zero, torchrun vanishing, a
    host silent for O(lost_after_s), no rank progress for O(hang_timeout_s), O(job_timeout_s))
    is recorded once and every agent stops its own torchrun at once; on a hang each first
    writes its ranks' py-spy stacks. An agent that loses the master stops by itself.
  - Every message is signed with O(secret) (HMAC-SHA256, per connection nonce and sequence),
    so no other process can report, abort or fake progress for the run; a host other than the
    master holds only its own key, so it can report only as itself.
  - The command is built as an argument list; no value is ever interpolated into a shell.
  - torchrun's PID is written to O(run_dir)/torchrun.pid and its exit to O(run_dir)/exitcode.json;
    the master keeps the run's state in O(run_dir)/control.json, which M(torchfleet.fleet.torchrun_watch) reads.
  - Meant to run with C(async) longer than the job and C(poll=0).
  - Dead-man switch; on the master, when nothing has touched O(run_dir)/lease for O(lease_s)
    seconds (the controller was interrupted or lost), the run is stopped on every host. The
    lease counts from the controller's first look (M(torchfleet.fleet.torchrun_watch) makes the file), so a
    start spread over many fork batches is not taken for a lost controller; until that look
    the run is bounded by O(join_timeout_s) + O(lease_s) from its start.
  - torchrun dies with its agent (C(PR_SET_PDEATHSIG)), so a killed agent leaves nothing
    running; the master names that host C(host.lost) when its connection does not come back
    within 3 s.
  - Every byte that reaches the control port is bounded and verified before it is parsed; a
    connection that does not authenticate within 5 s goes, and the master counts what it
    refused (in its record and O(run_dir)/agent.log).
version_added: "0.1.0"
author: torchfleet developers (@torchfleet)
options:
  run_dir:
    description: This host's directory for the run; created with mode 0700.
    type: path
    required: true
  run_id:
    description: The run's id; TORCHFLEET_RUN_ID of every process, and with O(attempt) the
      rendezvous id.
    type: str
    required: true
  attempt:
    description:
      - The attempt of the run (0 first, then one per restart). Each attempt has its own
        rendezvous id (the run id, then C(<run id>-attempt<N>)), so a torchrun left from an
        earlier attempt (a host cut off that comes back) never joins a later one's store.
    type: int
    default: 0
  host:
    description: This host's inventory name; TORCHFLEET_HOST of every process, and its name on the
      control channel.
    type: str
    required: true
  node_rank:
    description: This host's position among the run's hosts (0 is the master).
    type: int
    required: true
  hosts:
    description: On the master, every host of the run in rank order (who must report).
    type: list
    elements: str
    default: []
  host_addrs:
    description: On the master, the addresses the run's hosts dial from; their pending
      handshakes are never dropped to make room for other addresses' connections.
    type: list
    elements: str
    default: []
  python:
    description: Interpreter with torch.
    type: str
    required: true
  script:
    description: The training script; relative paths are taken from O(run_dir) (for shipped O(files)).
    type: str
    required: true
  script_args:
    description: Arguments for the script, passed verbatim.
    type: list
    elements: str
    default: []
  files:
    description: Files to write into O(run_dir) first (name to content), such as a built-in workload.
    type: dict
    default: {}
  chdir:
    description: Working directory of torchrun; O(run_dir) when unset.
    type: path
  nnodes:
    description: Number of nodes.
    type: int
    required: true
  nproc_per_node:
    description: Processes on this node.
    type: int
    required: true
  master_addr:
    description: The master's address on the chosen NIC (rendezvous and control channel).
    type: str
    required: true
  master_port:
    description: Rendezvous port.
    type: int
    required: true
  control_port:
    description: Port of the control channel on the master.
    type: int
    required: true
  secret:
    description:
      - On the master (O(node_rank) 0), the run's secret, made per run on the controller; on
        every other host, that host's key (the secret through the P(torchfleet.fleet.host_key#filter)
        filter). Signs every control message.
    type: str
    required: true
  local_addr:
    description: This host's address on the chosen NIC, never a name that may resolve to loopback.
    type: str
    required: true
  join_timeout_s:
    description: How long the rendezvous waits for every node, and how long an agent may take to
      reach the master.
    type: int
    default: 60
  lost_after_s:
    description: A host (or, seen from a host, the master) silent this long is lost.
    type: float
    default: 30
  hang_timeout_s:
    description: No rank of the run made progress (wrote to its logs) this long is a hang.
    type: float
    default: 300
  job_timeout_s:
    description: The longest the run may take.
    type: float
    default: 86400
  abort_grace_s:
    description: After an abort, SIGTERM (to every rank at once; torchrun itself is SIGKILLed
      then) to SIGKILL. The run has failed by then; a rank that saves a checkpoint on SIGTERM
      needs a longer grace.
    type: float
    default: 0.5
  max_restarts:
    description: torchrun C(--max-restarts).
    type: int
    default: 0
  env:
    description: Environment for torchrun and every rank (NCCL_SOCKET_IFNAME, the user's env, ...).
    type: dict
    default: {}
  lease_s:
    description: On the master, stop the run when O(run_dir)/lease is older than this. 0 turns
      the switch off, and so does O(run_dir)/detached once a look with C(detach) made it
      (M(torchfleet.fleet.torchrun_watch)) - a detached run is judged by the master alone.
    type: float
    default: 120
  guarded:
    description: The play guarded this host's ports for the run (M(torchfleet.fleet.port_guard)).
      The agent marks it in O(run_dir)/guarded and removes the run's table itself when its part
      of the run ends (as root, else with C(sudo -n)); a table it could not remove stays marked
      for M(torchfleet.fleet.torchrun_stop) to report.
    type: bool
    default: false
  stack_dump:
    description: How a hang's stacks are taken. C(auto) uses py-spy where it can attach to the
      ranks (root, C(kernel.yama.ptrace_scope) 0, or py-spy with CAP_SYS_PTRACE), else each
      rank's own faulthandler (every process of the run starts with a sitecustomize that
      registers it on SIGUSR1; Python frames only).
    type: str
    choices: [auto, py-spy, faulthandler]
    default: auto
  flight_recorder:
    description: Entries of torch's Flight Recorder in every rank (C(TORCH_FR_BUFFER_SIZE)).
      Above 0, each rank's sitecustomize also starts a thread that writes where the rank is in
      its collectives beside its logs each second (the heartbeat carries it to the master,
      whose record names the rank a hang waits for), and its whole recording when asked. 0
      turns both off.
    type: int
    default: 2000
  kernel_log:
    description: The kernel log the agent follows from the run's start for hardware events
      (NVIDIA Xids, PCIe AER, mlx5, AMD GPU resets and RAS errors, the OOM killer ending a
      rank). C(/dev/kmsg), falling back to C(journalctl -k -f) where it cannot be read, or a
      file followed like C(tail -F) holding kmsg records or plain lines.
    type: str
    default: /dev/kmsg
  straggler_window_s:
    description: On the master, stragglers are judged over the sampled collectives of this
      many seconds; with O(straggler_action=restart) a host that stays one this long ends
      the attempt.
    type: int
    default: 30
  straggler_threshold:
    description: A rank last to arrive at half the sampled collectives or more is a
      straggler when the others wait for it at least this fraction of the mean interval
      between collectives.
    type: float
    default: 0.05
  straggler_action:
    description: C(warn) names stragglers in the record; C(restart) also fails the attempt
      (C(run.straggler)) once a host stays one for O(straggler_window_s).
    type: str
    choices: [warn, restart]
    default: warn
  actions:
    description: C(enforce) stops the run for a fatal hardware event, an OOM kill, a hang or a
      straggler (C(straggler_action=restart)); C(observe) judges and records each (the
      record's C(actions), done false) and stops nothing. A rank's own death ends the run
      either way.
    type: str
    choices: [enforce, observe]
    default: enforce
  container_image:
    description: Start torchrun inside this image (docs/containers.md); on the host when unset.
    type: str
    default: ""
  container_runtime:
    description: What starts O(container_image) on this host (preflight resolved C(auto)).
    type: str
    choices: [podman, docker, apptainer, enroot]
  container_mounts:
    description: More paths mounted into the container (a path, or host:container); the run's
      directory, O(chdir), the script's directory, O(checkpoint_dir) and O(data_paths) always are.
    type: list
    elements: str
    default: []
  container_options:
    description: Arguments appended to the runtime's run command as given.
    type: list
    elements: str
    default: []
  container_gpus:
    description: Give the container the host's GPUs (C(--gpus all), CDI, C(--nv), enroot's hook).
    type: bool
    default: false
  data_paths:
    description: Mounted into the container at the same paths.
    type: list
    elements: str
    default: []
  network:
    description: With C(ib) the container gets /dev/infiniband.
    type: str
    choices: [ib, ethernet, none, auto]
    default: none
  rdma_sysfs:
    description: Where the host's RDMA devices are listed (sysfs layout); each port's state
      and link counters are watched during the run.
    type: str
    default: /sys/class/infiniband
  checkpoint_dir:
    description: Where the run's script writes its checkpoints (relative to the ranks' working
      directory, O(chdir) or O(run_dir)). The master's agent watches it, read-only, in a
      thread of its own, and its record keeps each checkpoint when it completes (a
      C(torch.save) file once it held still and, for a zip, once its end record is there; a
      C(torch.distributed.checkpoint) directory once its C(.metadata) is written; an HF,
      DeepSpeed or Megatron checkpoint directory once its framework's commit marker is, another
      directory once its tree held still for 30 s), with when
      its writing began and ended on the master's clock, its step from its name and whether
      it stalled the ranks; a directory missing, unreadable or huge is one warning in the
      record. Unset, nothing is watched.
    type: str
    default: ""
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: none
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Start torchrun on every host (the first is the master)
  torchrun_job:
    run_dir: ~/.torchfleet/runs/20261122-0301-ab12/{{ inventory_hostname }}
    run_id: 20261122-0301-ab12
    host: "{{ inventory_hostname }}"
    node_rank: "{{ ansible_play_hosts_all.index(inventory_hostname) }}"
    hosts: "{{ ansible_play_hosts_all }}"
    python: /opt/venv/bin/python
    script: /srv/code/train.py
    script_args: [--epochs, "3"]
    nnodes: 2
    nproc_per_node: 8
    master_addr: 10.0.0.1
    master_port: 29500
    control_port: 51234
    # The master gets the run's secret, every other host only its own key.
    secret: "{{ run_secret if inventory_hostname == ansible_play_hosts_all[0] else run_secret | torchfleet.fleet.host_key(inventory_hostname) }}"
    local_addr: "{{ ansible_host }}"
    env:
      NCCL_SOCKET_IFNAME: eth0
  async: 86400
  poll: 0
  register: job
"""

RETURN = r"""
rc:
  description: torchrun's exit code (negative for a signal).
  returned: always
  type: int
pid:
  description: torchrun's PID.
  returned: always
  type: int
reason:
  description: Why it ended; exited (by itself), aborted (the run failed elsewhere and the master
    said so), master_lost (this agent lost the master and stopped by itself).
  returned: always
  type: str
duration_s:
  description: Seconds torchrun ran.
  returned: always
  type: float
argv:
  description: The command that ran.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.agent import run
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.command import bounded
from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults

ARGUMENT_SPEC = dict(
    run_dir=dict(type="path", required=True),
    run_id=dict(type="str", required=True),
    attempt=dict(type="int", default=0),
    host=dict(type="str", required=True),
    node_rank=dict(type="int", required=True),
    hosts=dict(type="list", elements="str", default=[]),
    host_addrs=dict(type="list", elements="str", default=[]),
    python=dict(type="str", required=True),
    script=dict(type="str", required=True),
    script_args=dict(type="list", elements="str", default=defaults.default("script_args")),
    files=dict(type="dict", default={}),
    chdir=dict(type="path"),
    nnodes=dict(type="int", required=True),
    nproc_per_node=dict(type="int", required=True),
    master_addr=dict(type="str", required=True),
    master_port=dict(type="int", required=True),
    control_port=dict(type="int", required=True),
    secret=dict(type="str", required=True, no_log=True),
    local_addr=dict(type="str", required=True),
    join_timeout_s=dict(type="int", default=int(defaults.JOIN_BASE_S)),
    lost_after_s=dict(type="float", default=defaults.default("lost_after_s")),
    hang_timeout_s=dict(type="float", default=defaults.default("hang_timeout_s")),
    job_timeout_s=dict(type="float", default=defaults.default("job_timeout_s")),
    abort_grace_s=dict(type="float", default=defaults.ABORT_GRACE_S),
    max_restarts=dict(type="int", default=defaults.default("torchrun_max_restarts")),
    env=dict(type="dict", default=defaults.default("env")),
    lease_s=dict(type="float", default=defaults.default("lease_s")),
    guarded=dict(type="bool", default=False),
    stack_dump=dict(type="str", choices=["auto", "py-spy", "faulthandler"], default=defaults.default("stack_dump")),
    flight_recorder=dict(type="int", default=defaults.default("flight_recorder")),
    kernel_log=dict(type="str", default=defaults.default("kernel_log")),
    rdma_sysfs=dict(type="str", default=defaults.default("rdma_sysfs")),
    straggler_window_s=dict(type="int", default=defaults.default("straggler_window_s")),
    straggler_threshold=dict(type="float", default=defaults.default("straggler_threshold")),
    straggler_action=dict(type="str", default=defaults.default("straggler_action"),
                          choices=["warn", "restart"]),
    checkpoint_dir=dict(type="str", default=defaults.default("checkpoint_dir")),
    actions=dict(type="str", default=defaults.default("actions"),
                 choices=["enforce", "observe"]),
    container_image=dict(type="str", default=defaults.default("container_image")),
    container_runtime=dict(type="str", choices=["podman", "docker", "apptainer", "enroot"]),
    container_mounts=dict(type="list", elements="str",
                          default=defaults.default("container_mounts")),
    container_options=dict(type="list", elements="str",
                           default=defaults.default("container_options")),
    container_gpus=dict(type="bool", default=False),
    data_paths=dict(type="list", elements="str", default=defaults.default("data_paths")),
    network=dict(type="str", default=defaults.default("network"),
                 choices=["ib", "ethernet", "none", "auto"]),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=False)
    try:
        result = run(module.params, bounded(module, 60))
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
