"""The one home of every public variable's default and of every timing of the control plane.

Everything else reads these: the modules' argument specs (defaults.default(name)), the plays
(the lookup torchfleet.fleet.default: the variable when set, else its default here), the
Python API's signatures and the docs' variables table (torchfleet.variables). The roles'
meta/argument_specs.yml and the modules' DOCUMENTATION state the same defaults for Ansible to
show; tests/unit/test_defaults.py keeps them equal to these, and tests/unit/test_timings.py
states in words the rules that tie the timings together.

A default of None is computed where the variable is used (said in its description): nnodes,
join_timeout_s, control_port, the collective test's sizes and iterations.
"""
from __future__ import annotations

from collections import namedtuple

Option = namedtuple("Option", "name type default description choices elements")


def _option(name, type, default=None, description="", choices=None, elements=None):
    return Option(name, type, default, description, choices, elements)


# The public variables (DESIGN.md), in the order the docs list them.
OPTIONS = tuple(_option(*args, **kwargs) for args, kwargs in (
    (("nnodes", "int"), dict(description="Number of hosts of group C(nodes) to use, from the "
                             "first. All of them when unset.")),
    (("nproc_per_node", "str", "auto"), dict(description="Processes per node, or C(auto) (the "
                                             "host's GPUs, 1 without GPUs).")),
    (("spares", "raw", 0), dict(description="Extra hosts of group C(nodes) checked after the "
                                "first O(nnodes); the run keeps each of the first O(nnodes) that "
                                "is healthy and not quarantined, fills the other places with "
                                "the healthiest spares by the fleet's ledger (inventory order "
                                "among equals) and names every other.")),
    (("master_port", "int", 29500), dict(description="Rendezvous port on the master.")),
    (("master_addr", "str", ""), dict(description="Address the workers dial; decided on the "
                                      "master when unset.")),
    (("socket_ifname", "str", ""), dict(description="NIC exported as NCCL_SOCKET_IFNAME / "
                                        "GLOO_SOCKET_IFNAME; auto-detected when unset.")),
    (("backend", "str", "auto"), dict(choices=("auto", "nccl", "gloo"), description=(
        "Process group backend; C(auto) is nccl when every host has GPUs, else gloo."))),
    (("code_dir", "str", ""), dict(description="Directory whose files must be identical on "
                                   "every host; the ranks start there.")),
    (("data_paths", "list", []), dict(elements="str", description="Paths that must exist on "
                                      "every host.")),
    (("python", "str", ""), dict(description="Interpreter with torch on the hosts; the first "
                                 "python3 with torch when unset.")),
    (("script", "str", ""), dict(description="The training script train.yml starts; must exist "
                                 "on every host. The built-in workload when unset.")),
    (("script_args", "list", []), dict(elements="str", description="Arguments for the script, "
                                       "passed verbatim.")),
    (("workload", "str", "train"), dict(choices=("train", "collective"), description=(
        "Built-in workload run when C(script) is unset."))),
    (("env", "dict", {}), dict(description="Extra environment for every rank; wins over the "
                               "NCCL presets.")),
    (("run_id", "str", ""), dict(description="Name of the run directory; the time and a random "
                                 "suffix when unset.")),
    (("run_dir", "str", ""), dict(description="Controller directory for this run's outputs; "
                                  "runs_root/<run_id> when unset.")),
    (("runs_root", "str"), dict(description="Controller directory of run directories "
                                "(runs_root/<run_id>, runs_root/latest); runs/ when unset.")),
    (("remote_runs_root", "str", "~/.torchfleet/runs"), dict(description=(
        "Where each host keeps its run directories."))),
    (("keep_runs", "int", 20), dict(description="How many run directories the controller "
                                    "keeps.")),
    (("network", "str", "none"), dict(choices=("ib", "ethernet", "none", "auto"), description=(
        "NCCL preset; with ib the rdma.* checks run on every host, auto chooses ib when every "
        "host has an active RDMA port NCCL would use (else ethernet)."))),
    (("nccl_ib_hca", "str", ""), dict(description="NCCL_IB_HCA (mlx5_0,mlx5_1:1, ^mlx5_2, "
                                      "=mlx5_0); the HCAs rdma.down checks.")),
    (("nccl_ib_gid_index", "str", ""), dict(description="NCCL_IB_GID_INDEX; rdma.gid checks "
                                            "that it is RoCE v2 IPv4 on every port.")),
    (("nccl_nsocks_perthread", "int", 4), dict(description="NCCL_NSOCKS_PERTHREAD of the "
                                               "ethernet preset.")),
    (("nccl_socket_nthreads", "int", 2), dict(description="NCCL_SOCKET_NTHREADS of the "
                                              "ethernet preset.")),
    (("nccl_transport_check", "bool", False), dict(description=(
        "Run the ranks with NCCL's INFO lines for INIT,NET and report the transport each used "
        "(always for the collective test with NCCL)."))),
    (("nccl_expect_gdr", "bool", True), dict(description="With IB, nccl.transport warns when "
                                             "a rank ran without GPUDirect RDMA.")),
    (("rdma_sysfs", "str", "/sys/class/infiniband"), dict(description=(
        "Where a host's RDMA devices are listed (sysfs layout)."))),
    (("hang_timeout_s", "int", 300), dict(description=(
        "A run whose ranks all stay silent this long is a hang: stacks are dumped, then it is "
        "stopped."))),
    (("stack_dump", "str", "auto"), dict(choices=("auto", "py-spy", "faulthandler"), description=(
        "How a hang's stacks are taken: py-spy where it can attach, else the ranks' own "
        "faulthandler."))),
    (("flight_recorder", "int", 2000), dict(description=(
        "Entries of torch's Flight Recorder in every rank (TORCH_FR_BUFFER_SIZE, gloo and NCCL): "
        "a hang or a failure names the collective where the ranks diverge and the rank that "
        "never joined it. 0 turns recording off."))),
    (("kernel_log", "str", "/dev/kmsg"), dict(description=(
        "The kernel log each host's agent follows during a run (Xids, AER, mlx5, AMD GPU "
        "resets, the OOM killer): /dev/kmsg, else a file followed like tail -F (a container "
        "that sees the host's log elsewhere)."))),
    (("slurm_drain", "bool", False), dict(description=(
        "On a Slurm allocation, drain a host with a fatal hardware cause with scontrol (where "
        "the controller's user may)."))),
    (("straggler_window_s", "int", 30), dict(description=(
        "Stragglers are judged over the sampled collectives of this many seconds (from each "
        "rank's Flight Recorder); with straggler_action=restart, a host that stays one this "
        "long ends the attempt."))),
    (("straggler_threshold", "float", 0.05), dict(description=(
        "A rank or host is a straggler when the others wait for it, on average over the "
        "sampled collectives and beyond chance, at least this fraction of the interval between "
        "its group's collectives (their mean spacing)."))),
    (("straggler_action", "str", "warn"), dict(choices=("warn", "restart"), description=(
        "warn names a straggler in status, progress and the report; restart also ends the "
        "attempt (run.straggler) and starts the run again without its host (max_restarts, "
        "spares)."))),
    (("actions", "str", "enforce"), dict(choices=("enforce", "observe"), description=(
        "What torchfleet does on its own: enforce stops a run for a fatal hardware event, an "
        "OOM kill, a hang or a straggler, drains (slurm_drain), quarantines and restarts; "
        "observe judges and records the same (train.json's actions, done false: would have) "
        "and does none of it. A rank's own death still ends the run, as torchrun's "
        "fail-fast does."))),
    (("job_timeout_s", "int", 86400), dict(description="The longest a run may take.")),
    (("lease_s", "int", 120), dict(description=(
        "The controller's lease: a run the controller has not looked at for this long "
        "(interrupted, killed, or cut off from the hosts) is stopped by its master on every "
        "host; the controller's watch rides out a cut from the hosts this long."))),
    (("detach", "bool", False), dict(description=(
        "train.yml and collective.yml return once every rank of every host runs, printing the "
        "run id; the hosts then judge and end the run alone (no lease). attach.yml -e run_id= "
        "(torchfleet attach) follows it again, restarts it (max_restarts), gathers it and "
        "writes its verdict."))),
    (("lost_after_s", "int", 30), dict(description=(
        "A host whose agent is silent this long is host.lost; a host that cannot hear the "
        "master this long stops by itself."))),
    (("join_timeout_s", "int"), dict(description=(
        "How long the rendezvous waits for every node; 60 s, plus 10 s for each fork batch "
        "past the first, when unset."))),
    (("control_port", "int"), dict(description=(
        "Port of the run's control channel on the master; the ephemeral port preflight found "
        "free and reachable when unset."))),
    (("guard_ports", "bool", False), dict(description=(
        "nftables on the run's hosts: the master's ports and every host's ephemeral range "
        "(gloo's and NCCL's listeners) only from the run's hosts, for the run's lifetime "
        "(needs root or sudo)."))),
    (("max_restarts", "raw", 0), dict(description=(
        "Start a run that failed because of a host again, at most this many times (0-5), on "
        "the first nnodes healthy candidates."))),
    (("restart_on", "raw", "host"), dict(description=(
        "host restarts only a failure a host explains (lost, never started, or failing its "
        "re-check); any restarts every failure."))),
    (("torchrun_max_restarts", "int", 0), dict(description=(
        "torchrun's own --max-restarts (every local rank restarted on the same host)."))),
    (("collective_timeout_s", "int", 60), dict(description=(
        "init_process_group and collective timeout in the built-in workloads."))),
    (("collective_sizes", "str", ""), dict(description=(
        "Message sizes of the collective test (1K,64K,1M with gloo, 1M,16M,128M with nccl "
        "when unset)."))),
    (("collective_iters", "int"), dict(description=(
        "Timed iterations per size (20 with gloo, 50 with nccl when unset)."))),
    (("collective_isolate", "bool", False), dict(description=(
        "After the sweep, pair rounds between hosts that name a slow host (node.slow) or link "
        "(link.slow)."))),
    (("collective_isolate_schedule", "str", "ring"), dict(choices=("ring", "full"), description=(
        "Which pairs the rounds measure: ring (each host with two others) or full (every "
        "pair)."))),
    (("collective_pair_size", "str", ""), dict(description=(
        "Message of each pair's busbw (4M with gloo, 1G with nccl when unset)."))),
    (("collective_pair_iters", "int"), dict(description=(
        "Timed exchanges of each pair (10 when unset)."))),
    (("collective_pair_passes", "int", 3), dict(description=(
        "The most passes of the pair rounds: the first measures every pair of the schedule, "
        "each later one only what is in doubt (a slow pair again, a host slow with every "
        "partner against a host shown good); none follows a clean first pass. A pair is "
        "slow only when it is slow in every pass it ran."))),
    (("collective_isolate_threshold", "float", 0.5), dict(description=(
        "With collective_isolate, a pair is slow below this fraction of the median of each "
        "host's best pair."))),
    (("collective_isolate_floor_gbs", "float", 0.0), dict(description=(
        "With collective_isolate, an absolute busbw floor in GB/s (0 for none)."))),
    (("train_steps", "int", 300), dict(description="Steps of the built-in training workload.")),
    (("train_checkpoint_dir", "str", ""), dict(description=(
        "Where the built-in training workload saves a checkpoint every 50 steps and resumes "
        "from when started again (storage every host sees; rank 0 writes). No checkpoint when "
        "unset."))),
    (("checkpoint_dir", "str", ""), dict(description=(
        "Where the run's script writes its checkpoints (a path on the hosts, usually shared "
        "storage; the master's host watches it, read-only): each torch.save file and "
        "torch.distributed.checkpoint directory is recorded when it completes, with when its "
        "writing began and ended and its step, for goodput's lost work and checkpoint stalls. "
        "train_checkpoint_dir with the built-in workload when unset; lost work is unknown "
        "without either."))),
    (("health", "str", "basic"), dict(choices=("off", "basic", "full"), description=(
        "Node health checks in preflight: C(basic) reads every GPU's state (ECC, remapped "
        "rows, Xids, PCIe, NVLink, clocks, processes, fabric) and the host's (memlock, disk, "
        "clock); C(full) also measures every GPU's matmul and memory copy (the CPU's without "
        "GPUs) and names any slower than its peers; C(off) skips both."))),
    (("health_slow_pct", "float", 10.0), dict(description=(
        "With health=full, a device this many percent below the fleet's median of its model "
        "fails gpu.perf / cpu.perf (3 devices of a model or more)."))),
    (("health_floors", "dict", {}), dict(description=(
        "With health=full, absolute floors per GPU model (a part of its name): "
        "C({\"H100\": {\"tflops\": 600, \"gbps\": 2000}}) (bf16 TFLOPS, copy GB/s)."))),
    (("health_ecc_corrected_max", "int", 10000), dict(description=(
        "Corrected (volatile) ECC errors of one GPU above which gpu.ecc warns."))),
    (("health_xid_window_s", "int", 7200), dict(description=(
        "gpu.xid reads the kernel log's Xids of the last this many seconds (since boot if "
        "shorter)."))),
    (("health_disk_min_gb", "float", 10.0), dict(description=(
        "Free GiB host.disk asks for where the run writes (remote_runs_root, "
        "train_checkpoint_dir)."))),
    (("health_clock_max_s", "float", 2.0), dict(description=(
        "A host whose clock is further than this from the fleet's (measured by the port test, "
        "no NTP server needed) fails host.clock: leases and ages compare clocks."))),
    # Containers (run/container.py, docs/containers.md).
    (("container_image", "str", ""), dict(description=(
        "Run torchrun inside this image on every host (a registry reference, enroot's as "
        "pyxis takes it: nvcr.io#nvidia/pytorch:24.05-py3, or a local archive: an absolute "
        "path to a tar of podman save or docker save for podman and docker, a .sif for "
        "apptainer, a .sqsh for enroot); the Python side's checks read the image. The host's "
        "own Python when unset."))),
    (("container_runtime", "str", "auto"), dict(
        choices=("auto", "podman", "docker", "apptainer", "enroot"), description=(
            "What starts container_image; C(auto) takes the first of podman, docker, "
            "apptainer and enroot installed that can start the image (a .sif apptainer's, a "
            ".sqsh enroot's); every host must come to the same one (container.runtime)."))),
    (("container_mounts", "list", []), dict(elements="str", description=(
        "Paths mounted into the container besides code_dir, data_paths, checkpoint_dir, the "
        "script's directory and the run's directory (those always are, at the same paths): "
        "a path (the same path inside) or C(/host/path:/container/path)."))),
    (("container_options", "list", []), dict(elements="str", description=(
        "Arguments appended as given, one per item, to the runtime's run command of the "
        "run's container and of preflight's probe in the image (a C(--ulimit) of yours "
        "replaces torchfleet's C(--ulimit memlock=-1))."))),
    # The fleet's ledger (reports/ledger.py, docs/ledger.md).
    (("fleet_db", "str", "fleet.db"), dict(description=(
        "The fleet's ledger: what happened to each host in every preflight and run, kept "
        "across runs (a SQLite file, relative to runs_root when relative: the run "
        "directory's parent when run_dir names one, so a run_dir of its own per job wants "
        "an absolute path here), or a postgresql:// URL shared by several controllers. "
        "C('') turns it off."))),
    (("ledger_half_life_h", "float", 168.0), dict(description=(
        "A host's score halves every this many hours: an incident of last week counts half "
        "of one today."))),
    (("quarantine_score", "float", 2.5), dict(description=(
        "A host whose score reaches this is quarantined (3 failures it caused within a day "
        "do, 2 do not; a fatal hardware event counts 1.5)."))),
    (("ledger_keep_days", "int", 90), dict(description=(
        "The ledger keeps each incident, fleet event, action and run this many days, then "
        "deletes it at the next write (a host's quarantine and count of runs stay); 0 keeps "
        "everything."))),
    (("quarantine_h", "float", 24.0), dict(description=(
        "How long a quarantine lasts, unless released first (torchfleet hosts release "
        "HOST)."))),
    (("quarantine_max_fraction", "float", 0.1), dict(description=(
        "The circuit breaker: torchfleet quarantines (and, with slurm_drain, drains) on its "
        "own at most this share of a group's hosts within quarantine_h (at least one); past "
        "it, none of them, and the report says fleet-wide cause suspected (fleet.breaker). 1 "
        "turns it off."))),
    (("quarantine", "str", "warn"), dict(choices=("warn", "strict"), description=(
        "A quarantined host is left out like an unhealthy one while spares allow; when none "
        "do, warn runs with it and says so (host.quarantined), strict refuses."))),
    (("ledger_textfile", "str", ""), dict(description=(
        "A Prometheus node-exporter textfile the ledger writes at each preflight's and run's "
        "end: each host's score, incidents and quarantine."))),
))
BY_NAME = {o.name: o for o in OPTIONS}


def default(name):
    """The default of public variable `name` (KeyError for a name that is not one)."""
    return BY_NAME[name].default


def stated(option):
    """The default as argument_specs, DOCUMENTATION and the docs' table state it: none for an
    empty one ('', [], {} or None), which means the variable is simply not given."""
    return None if option.default in (None, "", [], {}) else option.default


def spec(*names, **overrides):
    """An AnsibleModule argument spec of these public variables, with their defaults; each
    override (name=dict(...)) replaces what the module's own parameter needs instead."""
    out = {}
    for name in names:
        o = BY_NAME[name]
        entry = {"type": o.type}
        if o.default is not None:
            entry["default"] = o.default
        if o.choices:
            entry["choices"] = list(o.choices)
        if o.elements:
            entry["elements"] = o.elements
        out[name] = entry
    for name, entry in overrides.items():
        out[name] = entry
    return out


# ---- Timings (seconds). Each is written here once; tests/unit/test_timings.py states the rules
# that tie them together (and to lost_after_s, hang_timeout_s and ansible.cfg's SSH settings).
LOOK_S = 0.1            # how often an agent's loop looks at torchrun and the channel
BEAT_S = 1.0            # how often a host reports to the master; lost_after_s is many beats
TEARDOWN_S = 2.0        # an aborted torchrun already ending after a rank's death: time to end
RANK_EXIT_S = 5.0       # an abort finds a live rank that noted a failing code: the longest its
#                         interpreter's exit is awaited (its own failure told when it ended)
ABORT_GRACE_S = 0.5     # after the first failure, before an agent stops its own torchrun
SETTLE_SLACK_S = 5.0    # the master waits this much past the stops for the last reports
CLOSED_LOST_S = 3.0     # an agent's connection closed without its exit, not back within: lost
# A rank's death this soon before its host's hardware event is its consequence, beyond the
# event's own dating uncertainty (its age_err_s: runstate.slack).
HW_SLACK_S = 2.0
# actions=observe: a hardware cause observed (the run went on) explains the run's own failure
# at most this long after it: torch's NCCL watchdog (10 min by default) ends a rank the fault
# left hung in the driver; a failure later than that is not the event's.
OBSERVED_CAUSE_S = 600.0
PYSPY_TIMEOUT_S = 60.0  # one py-spy dump of a rank's stack (a host's ranks are dumped at once)
FR_DUMP_S = 5.0         # after the stacks, each rank's Flight Recorder dump may take this long
DUMP_S = PYSPY_TIMEOUT_S + FR_DUMP_S + 10.0  # the master waits this long for a hang's stacks
COMMAND_TIMEOUT_S = 20.0  # any other short command a module runs (ip, nvidia-smi, git, python)
POLL_S = 5.0            # the longest wait of one look of the controller at the master
PROGRESS_EVERY_S = 10.0  # the controller prints progress at least this often
GOODPUT_SAY_S = 60.0    # and goodput so far this often (a look with the whole record), and at the end
STOP_GRACE_S = 10.0     # SIGTERM to SIGKILL of a stopped run's process group
GATHER_CONNECT_TIMEOUT_S = 3.0  # SSH connect to a host judged lost, gathered after the run
STOP_REPORT_WAIT_S = 300.0  # stop ID of a detached run: the wait for its follower's report
ASYNC_SLACK_S = 600.0   # Ansible's async job outlives job_timeout_s by this much
JOIN_BASE_S = 60.0      # join_timeout_s when unset: this, plus JOIN_PER_BATCH_S for each fork
JOIN_PER_BATCH_S = 10.0  # batch past the first (the agents start batch after batch)
CONNECT_TIMEOUT_S = 3.0  # preflight's TCP connection to the master's ports
LISTEN_SLACK_S = 1.5    # preflight's listener waits this much past the last expected connection
LISTENER_IDLE_S = 60.0  # a port-test listener nobody reaches ends after this
PERF_START_S = 5.0     # health=full: the measurements start this long after the task does,
PERF_PER_HOST_S = 0.75  # plus this per host of a fork batch (SSH, module transfer and torch's
#                         import, one host after another on a small controller)
PERF_LATE_S = 0.5       # a CPU measurement that started later than this is not compared
PERF_TIMEOUT_S = 120.0  # health=full: the longest one device's measurement may take
STRAGGLE_SAMPLE_S = 5.0  # a rank samples its recorder for stragglers every this or twice this
STRAGGLE_BUDGET = 0.002  # (at wall-clock multiples, every rank at once), twice when its dumps
#                         would take more than this share of its CPU time (they hold the GIL:
#                         the training thread loses about 2.5 times as much; bench straggler);
#                         never rarer, or one collective's rows of every rank never meet in a
#                         window (issue 57): a 50 ms dump every 10 s is 0.5 % of a core
STRAGGLE_EVAL_S = 5.0   # the master judges stragglers this often
STRAGGLER_SAY_S = 60.0  # the controller's progress names a straggler at most this often
PING_S = 5.0            # the master measures each host's clock offset this often (a round trip)
# The checkpoint watch (ckptwatch.py, the master's agent, checkpoint_dir): how often it looks;
# how long a file's size and mtime must hold still to be complete; how long a file may keep
# growing before one warning says so; how long a look may take before one warning names the
# directory (a hung mount: the watch runs in its own thread, the run goes on).
CHECKPOINT_LOOK_S = 1.0
CHECKPOINT_STILL_S = 2.0
# A checkpoint directory of no known layout (no commit marker: HF's trainer_state.json,
# DeepSpeed's latest, Megatron's tracker, DCP's .metadata) is complete once its whole tree held
# still this long: frameworks write a model, then gather the optimizer's state for minutes.
CHECKPOINT_DIR_STILL_S = 30.0
CHECKPOINT_GROWING_WARN_S = 600.0
CHECKPOINT_HUNG_WARN_S = 60.0
CHECKPOINT_MISSING_WARN_S = 120.0  # a checkpoint_dir still missing this long is said (the script
#                                    may make it at its first save), else at the run's end
CHECKPOINT_FINAL_WAIT_S = 3.0   # the master's end awaits the watch's final look this long, plus
CHECKPOINT_FINAL_WAIT_MAX_S = 120.0  # two of its slowest looks (a long scan), at most this long
CHECKPOINT_SCAN_BUDGET = 0.001  # a full scan no sooner than its own CPU cost / this after the last
CHECKPOINTS_KEPT = 256          # the record keeps the newest this many checkpoints
# A save is a checkpoint stall unless some rank's completed collectives advanced inside
# (began + this, ended - CHECKPOINT_STALL_TAIL_S): the ranks' watchers write their position
# each second, so a collective completed just before the save can be seen this long into it.
CHECKPOINT_STALL_LEAD_S = 1.5
CHECKPOINT_STALL_TAIL_S = 0.5
ADVANCE_GAP_S = 0.5             # the master keeps one moment of collectives advancing per this
# Goodput (reports/goodput.py): a checkpoint counts as kept only when it ended at least this
# long before the failure: a save still being written when a rank died stops growing then too,
# and is not a checkpoint to resume from.
CHECKPOINT_KEPT_MARGIN_S = 1.0
# Checkpoints whose windows overlap or end within this of each other are one save (per-rank
# shard files written side by side): the record and goodput group them alike.
CHECKPOINT_SAME_SAVE_S = 1.0
# Goodput's wall time ends at the report (the command's last play): the gather after every rank
# stopped is teardown, up to this long (a detached run attached to days later did not spend
# those days being torn down).
GOODPUT_GATHER_MAX_S = 900.0
# The fleet's ledger (reports/ledger.py): its file's name in the runs root (fleet_db), and how
# long a write waits for another controller's (SQLite's busy timeout, PostgreSQL's lock and
# connect timeouts) before the ledger is skipped with a warning.
FLEET_DB = "fleet.db"
LEDGER_TIMEOUT_S = 10.0
# The longest one host's pull of container_image may take (each host pulls in its own preflight
# probe, as many hosts at once as Ansible has forks): an NGC PyTorch image is about 10 GB.
# Preflight's progress line says it.
CONTAINER_PULL_TIMEOUT_S = 1800.0
# While the probes pull, the stdout callback says this often how many hosts' probes returned
# and which it still waits on (plugins/callback/torchfleet.py).
CONTAINER_PULL_SAY_S = 30.0
# The longest `enroot create` may take (it unpacks the image's squashfs: an NGC image's
# several GB), for the run's container and preflight's probe container alike.
CONTAINER_CREATE_TIMEOUT_S = COMMAND_TIMEOUT_S * 15


def master_settle_s(abort_grace_s=ABORT_GRACE_S, hang=False):
    """How long the master keeps its store open after the run's fate is decided: the agents
    stop their torchrun and report, and on a hang every rank's stacks are dumped first."""
    return abort_grace_s + TEARDOWN_S + SETTLE_SLACK_S + (DUMP_S if hang else 0.0)


# The controller waits this long past the decision for the master's record to turn final;
# covers master_settle_s of a hang, with room for the master's own slowness; plus lost_after_s
# (watch_settle_s), which the master may wait for a silent host to be judged lost.
WATCH_SETTLE_S = 120.0


def watch_settle_s(lost_after_s):
    return WATCH_SETTLE_S + float(lost_after_s)


TIMINGS = {name.lower(): value for name, value in dict(globals()).items()
           if name.endswith("_S") and isinstance(value, float)}
