"""Every check id torchfleet reports, one unit each: the id(s), what it catches and the fix it
names. docs/checks.md's tables are rendered from this list (`torchfleet checks --markdown`,
tested equal), and check() refuses an id that is not here, so an undocumented id cannot reach
a report. How each check decides lives with its rule (preflight.py, summary.py, isolate.py,
the preflight role's input checks); adding a check is one Unit here, its rule and its test.
"""
from __future__ import annotations

from collections import namedtuple

# Where a check is decided: preflight (preflight.json and every run's preflight), input (the
# controller's look at the variables, before any host is touched), run (train.json /
# collective.json), api (the Python API and CLI only, when no report was written).
PREFLIGHT, INPUT, RUN, API = "preflight", "input", "run", "api"

Unit = namedtuple("Unit", "ids phase catches fix")

REGISTRY = (
    Unit(('host.unreachable',), PREFLIGHT,
         'SSH/connection failure, per host; the other hosts are still fully checked',
         'make `ssh <host>` work (host up, ansible_host, ansible_user, key) or remove it '
         'from `nodes`'),
    Unit(('host.duplicate',), PREFLIGHT,
         'two inventory names for one machine (same hostname and addresses): two agents '
         'would start there',
         'remove the duplicate or fix its address'),
    Unit(('host.probe',), PREFLIGHT,
         "the host's probe could not run (no Python for Ansible, no way to list its network "
         'interfaces); names what failed',
         'the fix its error names: install python3 or set `ansible_python_interpreter`; '
         'install iproute2 where netlink is refused too'),
    Unit(('python.torch',), PREFLIGHT,
         'no interpreter with torch (or no usable Python) on the host',
         'install torch for that interpreter or set `python`'),
    Unit(('version.python', 'version.torch', 'version.cuda', 'version.hip', 'version.nccl',
          'version.driver', 'version.rocm'), PREFLIGHT,
         "a host whose value differs from the one most hosts share (ties: the master's); "
         'names the outlier, both values and the hosts that agree',
         'install that version on the outlier'),
    Unit(('gpu.count',), PREFLIGHT,
         'fewer GPUs than `nproc_per_node` (skipped with gloo); NVIDIA GPUs from nvidia-smi, AMD '
         'GPUs from amd-smi, rocm-smi or the kernel\'s KFD topology',
         'lower `nproc_per_node` or fix the GPUs/driver'),
    Unit(('nic.missing',), PREFLIGHT,
         "`socket_ifname` absent on a host (lists the host's NICs)",
         'an interface every host has, or leave it unset to auto-detect'),
    Unit(('nic.address',), PREFLIGHT,
         'the NIC has no IPv4 address',
         'give it one or pick another NIC'),
    Unit(('nic.route',), PREFLIGHT,
         'traffic to the master leaves by another NIC, there is no route, or master_addr '
         "is not on the master's NIC",
         'route via the NIC or set `socket_ifname` to the one that routes'),
    Unit(('port.in_use',), PREFLIGHT,
         '`master_port` already bound on the master; names the PID and command',
         '`stop.yml` for an earlier run, kill it, or another `master_port`'),
    Unit(('port.blocked',), PREFLIGHT,
         'a host cannot open TCP to `master_addr:master_port`: a timeout is a firewall that '
         'drops; refused is nothing listening there, or a firewall that rejects; a host that '
         'first dialled after the test\'s listener had ended is a warning, "not tested"',
         "allow TCP `master_port` on the master's firewall; when refused, run preflight again "
         'and check that `master_addr` is the master\'s'),
    Unit(('port.ephemeral',), PREFLIGHT,
         'a host cannot reach a free high ephemeral port on the master (c10d hands workers '
         'a random port; NCCL/gloo listen on random ports)',
         "allow the master's ephemeral range"),
    Unit(('env.nccl',), PREFLIGHT,
         'NCCL_* / GLOO_* / TORCH_* variables that differ across hosts (a warning)',
         'set them the same everywhere, or once with `-e env=…`'),
    Unit(('hostname.loopback',), PREFLIGHT,
         "the host's name resolves to a loopback address (Debian's 127.0.1.1) on a "
         'non-loopback run',
         'map the name to its real address in /etc/hosts or DNS'),
    Unit(('code.sync',), PREFLIGHT,
         '`code_dir` differs: git commit, or file contents (names changed, extra and '
         'missing files), or is missing',
         'sync it from the reference host'),
    Unit(('data.missing',), PREFLIGHT,
         'a path of `data_paths` is missing on a host',
         'copy or mount it'),
    Unit(('shm.size',), PREFLIGHT,
         '`/dev/shm` smaller than 1 GiB (error with nccl, warning with gloo)',
         'remount larger / `--shm-size`'),
    Unit(('rdma.none',), PREFLIGHT,
         '`network: ib` on a host with no RDMA device in /sys/class/infiniband',
         'install the HCA driver and rdma-core, or `network: ethernet` / `auto`'),
    Unit(('rdma.down',), PREFLIGHT,
         'with `network: ib` (or `auto` choosing it): an HCA named in `nccl_ib_hca` missing, or '
         'a port NCCL would use not ACTIVE / LinkUp (with no `nccl_ib_hca`: no active port at '
         'all); sysfs that cannot be read is a warning that the host is unknown, never a pass',
         'bring the link up (cable, switch port, subnet manager) or fix `nccl_ib_hca`'),
    Unit(('rdma.rate',), PREFLIGHT,
         "a host whose active links are slower than most hosts' (fewer ports, or a port "
         'trained at a lower rate); a warning, as the run goes at the slowest link\'s speed',
         'check the cables, transceivers and switch ports of that host'),
    Unit(('rdma.gid',), PREFLIGHT,
         '`nccl_ib_gid_index` that is not a RoCE v2 IPv4 GID on a RoCE port NCCL would use',
         'the index it names (RoCE v2 with an IPv4 address on that port)'),
    Unit(('world.size',), PREFLIGHT,
         '`nnodes` < 1 or larger than group `nodes` (reported before any host is touched); '
         'GPU counts that differ with `nproc_per_node=auto`',
         'fix `nnodes` / `nproc_per_node`'),
    Unit(('host.skipped',), PREFLIGHT,
         'with `spares=K`, a candidate host the run does not use: a warning naming the checks '
         'it failed (they are warnings too, as the run is whole without it), or a healthy '
         'spare left over; fewer healthy candidates than `nnodes` is an error on the '
         'controller naming every failing host',
         'fix the named host before it is needed; add spares or fix hosts when too few are '
         'healthy'),
    Unit(('host.quarantined',), PREFLIGHT,
         "the fleet's ledger holds the host in quarantine (its score passed "
         '`quarantine_score`; until `quarantine_h` has passed or it is released): names the '
         'reason, its history and until when; with `spares` it is left out like an unhealthy '
         'host while the others suffice (a warning); used anyway when they do not, a warning, '
         'an error with `quarantine=strict`',
         'mend the host, then `torchfleet hosts release <host>`; add spares; '
         '`quarantine=warn` uses it anyway'),
    Unit(('fleet.breaker',), PREFLIGHT,
         "the circuit breaker: more of the group's hosts than `quarantine_max_fraction` "
         '(at least one) would be quarantined, or drained (this run\'s drains with those '
         'torchfleet did before, by the ledger\'s audit), within `quarantine_h`: '
         'none of them is, and the verdict says fleet-wide cause suspected with the hosts (a '
         'fleet event in the ledger); a warning',
         'look for what the hosts share (a switch, a rack\'s power, the input, a driver '
         'roll-out); a host that is itself at fault: `torchfleet hosts quarantine HOST --hours N`'),
    Unit(('fleet.ledger',), PREFLIGHT,
         "the fleet's ledger (`fleet_db`) cannot be read or written at preflight's or the "
         "run's end: missing, locked past its timeout, unreachable, corrupt, of a newer "
         'schema, a SQLite file on a network filesystem, or SQLAlchemy is not installed; a '
         'warning, said once: the run goes on and its own report is written (an error of '
         'preflight with `quarantine=strict` when the hosts\' health could not be read: no '
         'quarantine could be enforced; a write that failed after it stays a warning); also a '
         "controller's clock far from the PostgreSQL server's, and the default `fleet.db` "
         "on a network filesystem kept in the controller's own "
         '`~/.local/state/torchfleet/fleet.db` instead',
         'the fix it names: move the corrupt file aside, a local path or PostgreSQL for a '
         'shared runs root, install SQLAlchemy, upgrade torchfleet, NTP on the controller, '
         "or `fleet_db=''` to run without it"),
    Unit(('input.spares',), INPUT,
         '`spares` that is not a whole number >= 0, or `nnodes + spares` larger than group '
         '`nodes`; reported before any host is touched',
         'the value to set'),
    Unit(('input.max_restarts', 'input.restart_on'), INPUT,
         '`max_restarts` that is not a whole number from 0 to 5, or `restart_on` neither '
         '`host` nor `any`; reported before any host is touched',
         'the value to set'),
    Unit(('input.master_port', 'input.nproc_per_node', 'input.data_paths'), INPUT,
         'a value that makes no sense anywhere (port outside 1–65535, nproc not a positive '
         'number, data_paths not a list or holding a relative path); reported before any '
         'host is touched',
         'the value to set'),
    Unit(('port.privileged',), PREFLIGHT,
         "`master_port` below 1024 while the run's user on the master is not root",
         'a port above 1023'),
    Unit(('run_id.used',), PREFLIGHT,
         "`-e run_id=X` names a run whose directory is already on a host (an earlier run's "
         "state would be read as this one's)",
         'leave run_id unset, choose another, or remove that directory'),
    Unit(('script.missing',), PREFLIGHT,
         '`-e script=…` does not exist on a host; train.yml then starts nothing anywhere',
         'copy it there or fix the path'),
    Unit(('hang.stacks',), PREFLIGHT,
         "py-spy cannot attach to the ranks on a host (not installed; the run's user not "
         'root under `kernel.yama.ptrace_scope` 1 or 2 without CAP_SYS_PTRACE on py-spy; '
         'ptrace_scope 3): a warning, as a hang\'s stacks then come from each rank\'s own '
         'faulthandler (SIGUSR1, Python frames only)',
         'pip install py-spy; `sudo setcap cap_sys_ptrace+ep <py-spy>`, or '
         '`sysctl kernel.yama.ptrace_scope=0`, or run as root'),
    Unit(('gpu.smi',), PREFLIGHT,
         'health: nvidia-smi fails or hangs (bounded), with what its exit status means (9 '
         'driver not loaded, 12 NVML missing, 14 InfoROM corrupted, 15 a GPU fell off the bus)',
         'reload the driver or reset/replace the GPU; drain the host until nvidia-smi answers'),
    Unit(('gpu.ecc',), PREFLIGHT,
         'health: a GPU with uncorrected (volatile) or deferred ECC errors; corrected ones over '
         '`health_ecc_corrected_max` warn (nvidia-smi -q, amd-smi metric)',
         'drain the host and reset the GPU; replace it if they return'),
    Unit(('gpu.remap', 'gpu.retired_pages'), PREFLIGHT,
         'health: row remapping pending or failed (A100 and later); pages pending retirement '
         '(older NVIDIA GPUs, AMD bad pages)',
         'reset the GPU (or reboot) so the remap or retirement takes effect; replace it when '
         'remapping failed'),
    Unit(('gpu.xid',), PREFLIGHT,
         'health: Xid events in the kernel log of the last `health_xid_window_s` (2 h): the '
         'codes the Xid table below calls fatal fail, the others and unknown ones warn (an '
         'unknown one whose line says the GPU must be reset fails); a kernel log the user may '
         'not read warns',
         "drain the host and reset or replace the GPU NVIDIA's Xid catalog names"),
    Unit(('gpu.pcie', 'gpu.nvlink', 'gpu.xgmi'), PREFLIGHT,
         'health: a GPU whose PCIe link is narrower than its maximum ("GPU 3 at PCIe x8, '
         'capable of x16"); an inactive NVLink; AMD XGMI errors',
         'reseat the GPU or riser, reset the GPU; a link that stays down is hardware'),
    Unit(('gpu.throttle', 'gpu.persistence'), PREFLIGHT,
         'health warnings: active clock-event reasons other than idle and the software power '
         'cap, by name; persistence mode off',
         'cooling and power (HW/thermal slowdown); `nvidia-smi -pm 1`'),
    Unit(('gpu.busy',), PREFLIGHT,
         'health: a process that is not the run holds a GPU (compute context), named with '
         'pid, user and MiB',
         'stop it (stop.yml for an earlier run) or use other hosts'),
    Unit(('gpu.fabric', 'gpu.peermem'), PREFLIGHT,
         'health: on NVSwitch systems a fabric state other than Completed / Success, or '
         'nvidia-fabricmanager not active (CUDA error 802); with RDMA devices and NVIDIA GPUs, '
         'nvidia_peermem not loaded (a warning: no GPUDirect RDMA)',
         'systemctl enable --now nvidia-fabricmanager; modprobe nvidia_peermem'),
    Unit(('host.memlock', 'host.disk', 'host.clock'), PREFLIGHT,
         'health: `ulimit -l` not unlimited on a host with RDMA devices (not with the ethernet '
         'preset); less than '
         '`health_disk_min_gb` free where the run writes (remote_runs_root, '
         'train_checkpoint_dir); a clock further than `health_clock_max_s` from the fleet\'s '
         '(measured by the port test against the master\'s clock)',
         'memlock unlimited (limits.conf, docker --ulimit memlock=-1); free space; sync the '
         'clock (chrony, systemd-timesyncd)'),
    Unit(('gpu.perf', 'cpu.perf'), PREFLIGHT,
         'with `health=full`: a GPU (or, without GPUs, a CPU thread) whose matmul or memory '
         'copy is more than `health_slow_pct` below the median of its model across the fleet, '
         'or below a floor of `health_floors`; a measurement that failed',
         "cooling, power cap and clocks of that host, or what else runs there; drain it"),
    Unit(('input.bundle',), API,
         '`torchfleet health --from DIR`: a saved file that is not (all of) its command\'s '
         'output (a saved error message, a grep of part of it); a foreign one is not judged, '
         'a partial one is judged for what it holds',
         'save the whole output of the command the file is named for, on the host (as the '
         'usage lists)'),
    Unit(('input.container',), INPUT,
         'a container setting that cannot work on any host: `container_runtime` not one of '
         'auto, podman, docker, apptainer, enroot; a `container_image` that is no image '
         'reference (enroot: a .sif, a scheme but docker:// or dockerd://); a `container_mounts` entry that is not an '
         'absolute path or host:container pair; `container_options` not a list of strings',
         'the fix it names, or leave `container_image` unset'),
    Unit(('container.runtime',), PREFLIGHT,
         'with `container_image`: the runtime is not on the host, its daemon does not answer '
         "(docker info), or the run's user may not use it (names the runtime's own error); "
         '`auto` finding none of podman, docker, apptainer, enroot, or taking another runtime '
         'on this host than on the others (one run runs one runtime)',
         "install the runtime on that host, start its daemon, add the run's user to its group, "
         'or set `container_runtime`'),
    Unit(('container.pull',), PREFLIGHT,
         'the image is not on the host and cannot be pulled within the pull timeout (names '
         "the host and the registry's error); each host pulls in its own probe, as many hosts "
         'at once as Ansible has forks, with a progress line every 30 s (docs/containers.md)',
         'make the registry reachable and logged in on that host (`podman login`; enroot: '
         '~/.config/enroot/.credentials), or load the image there (`podman load` / `docker '
         'load`; enroot: its .sqsh file)'),
    Unit(('container.gpu',), PREFLIGHT,
         'with the nccl backend: the runtime cannot give the container the host\'s NVIDIA GPUs '
         '(podman: no CDI spec of kind nvidia.com/gpu in /etc/cdi or /var/run/cdi; docker: no '
         'NVIDIA Container Toolkit hook; enroot: no nvidia-container-cli or GPU hook)',
         'the fix it names: `nvidia-ctk cdi generate`, the NVIDIA Container Toolkit for '
         'docker, libnvidia-container and enroot\'s hooks'),
    Unit(('container.driver',), PREFLIGHT,
         "on a host with NVIDIA GPUs: its driver is older than the image's CUDA needs "
         "(NVIDIA's minimum driver per CUDA release, kept as data with its source in "
         'host/cuda_driver.py): below the CUDA major\'s minimum (11.x 450.80.02, 12.x '
         '525.60.13, 13.x 580) an error, a warning where the image carries the '
         'forward-compatibility libraries (cuda-compat: data-center GPUs only); below the '
         "release's own driver a warning (minor version compatibility: PTX JIT may fail)",
         "upgrade the host's NVIDIA driver to the version named, or use an image built for "
         'an older CUDA'),
    Unit(('container.digest',), PREFLIGHT,
         "the image's id differs across hosts (a tag that moved between pulls, an image built "
         "locally): names the outlier, both ids and the hosts that agree; the image's "
         '`code.sync`',
         'pull the same image on the outlier (by digest: image@sha256:...), or remove its copy'),
    Unit(('input.health',), INPUT,
         '`health` other than off / basic / full, or a `health_*` threshold that is not a '
         'number (floors not a mapping of model to numbers); reported before any host is '
         'touched',
         'the value to set'),
    Unit(('run.exit',), RUN,
         'per host, how its torchrun ended: succeeded, failed (its rank exited non-zero by '
         'itself, or its start failed: Ansible\'s reason), hung, lost, timeout, aborted '
         '(stopped, or its ranks lost a peer, because the run failed elsewhere); the first '
         'failure, as the master judged it (a cause before the ranks that lost it), names '
         'host, rank, exit code and log tail',
         "read that host's logs"),
    Unit(('run.restart',), RUN,
         'with `max_restarts=R`, a host an attempt lost (host.lost, its start failed, '
         'unreachable) or whose rank died and which then failed its re-check: a warning naming '
         'the attempt and the host that replaced it (the run went on without it)',
         'fix the named host before it is needed again'),
    Unit(('host.lost',), RUN,
         "a host's agent sent no heartbeat for `lost_after_s` (network cut, host frozen), "
         "its agent's connection closed without its exit and did not come back in 3 s "
         '(agent killed), or its agent died on the master; every lost host is named',
         'check the host and its network; the others were stopped'),
    Unit(('run.hang',), RUN,
         "no rank of the run wrote to its logs for `hang_timeout_s`; every rank's py-spy "
         'stack is in its log directory',
         'read where each rank was stuck'),
    Unit(('run.hardware',), RUN,
         "a fatal hardware event on one of the run's devices during the run (an Xid NVIDIA's "
         'catalog resolves with a reset, an uncorrected fatal PCIe AER error or a failed '
         'recovery, an mlx5 health error, a fatal NVSwitch SXid (the host\'s, no GPU\'s), an '
         'AMD GPU reset, climbing uncorrected ECC, NVML '
         "asking for a reset, an RDMA port of the run's HCAs that went down and stayed down, "
         'NVML unanswered for 30 s): the cause, named first; warnings (clocks held down, a '
         'link that flapped or slowed, a recovered non-fatal AER error, other Xids, the same '
         'fatal line on a device the run does not use) never fail a run; the table below',
         'drain the host (listed in `drain`; `slurm_drain=true` drains it in Slurm) and look '
         'at the device named; the restart skips it'),
    Unit(('run.oom',), RUN,
         "the kernel's OOM killer ended a process of the run (global or its memory cgroup), "
         "from the line the kernel wrote: a rank by its PID, a process in a rank's tree (a "
         "DataLoader worker), or one in a rank's own cgroup (a container with its own PID "
         "namespace); another program's OOM kill is a warning",
         'give the ranks more memory or use less; the host is not drained '
         '(`restart_on=any` restarts the run)'),
    Unit(('run.straggler',), RUN,
         'a rank or host the others waited for: at each sampled collective of its own '
         'groups, later than the others (their median) beyond the clocks\' uncertainties, on '
         'average at least `straggler_threshold` of the interval between collectives and '
         'beyond chance (a z test), periodic work of the script set aside (from the ranks\' '
         'Flight Recorders: NCCL\'s GPU-timed durations, gloo\'s call times on offsets the '
         'master measured); a warning, an error when `straggler_action=restart` ended the '
         'attempt with it',
         "look at the host's GPU clocks and thermals, CPU load and NIC rate; "
         '`straggler_action=restart` with a spare replaces it'),
    Unit(('host.kmsg',), RUN,
         "the kernel log could not be read during the run, or preflight found it unreadable "
         '(a non-root agent where `kernel.dmesg_restrict=1`): hardware events are not seen '
         'there; or it overran (the kernel printed faster than the watch read, records were '
         'lost unread); a warning',
         'run the agents as root, `sysctl kernel.dmesg_restrict=0`, add the user to group '
         'adm / systemd-journal, or set `kernel_log` to a readable file; for an overrun, find '
         'the flood in the kernel log'),
    Unit(('run.timeout',), RUN,
         'the run outlived `job_timeout_s`',
         'raise `job_timeout_s`'),
    Unit(('run.controller_lost',), RUN,
         'the controller stopped watching for `lease_s` (120 s: interrupted, killed, or cut '
         'off from the hosts, or the master is down); no host is named; every host was '
         'stopped',
         'run again'),
    Unit(('run.stopped_by_user',), RUN,
         'the run was stopped on purpose: Ctrl-C, SIGTERM or SIGHUP to the controller (or '
         'its ansible-playbook gone), or `stop.yml -e run_id=` / `torchfleet stop ID` of a '
         'detached run; every host was stopped, then gathered',
         'start it again when you want it to run'),
    Unit(('nccl.transport',), RUN,
         'with NCCL (the collective test, or `nccl_transport_check`): a host whose ranks used '
         'sockets (NET/Socket) where IB was expected (`network: ib`, or `auto` chose it); a '
         'warning where RDMA went without GPUDirect, or no NCCL INFO line was found',
         "the rdma.* checks, NCCL_IB_HCA, /dev/infiniband in the ranks' container, "
         'nvidia-peermem'),
    Unit(('rank.missing', 'collective.wrong', 'train.checksum'), RUN,
         'a rank that wrote no result; a collective result that is not exact; parameter '
         'checksums that differ across ranks',
         'as each names'),
    Unit(('node.slow',), RUN,
         'with `collective_isolate`: a host whose every pair is slow (at least two '
         'partners), with its figures against the reference',
         '`ethtool <nic>` speed and `ethtool -S` errors on that host, the NCCL transport '
         'in its rank logs'),
    Unit(('link.slow',), RUN,
         'with `collective_isolate`: a pair that is slow or failed while both its hosts '
         'are fine with other partners',
         "the cables and switch ports between the two, and each one's route to the other"),
    Unit(('input.collective_isolate', 'input.collective_isolate_schedule'), INPUT,
         'pair rounds asked for one host; a schedule other than `ring` / `full` (reported '
         'before any host is touched)',
         'the value to set'),
    Unit(('input.nccl_ib_hca', 'input.nccl_ib_gid_index'), INPUT,
         'an HCA list that is not plain names with an optional `:port` (NCCL_IB_HCA\'s form), a '
         'GID index that is not an integer 0-255; reported before any host is touched',
         'the value to set'),
    Unit(('input.run_id',), INPUT,
         'a `run_id` that cannot name a directory (letters, digits, `.`, `_`, `-`, at most '
         '64); reported before any host is touched',
         'a run_id made of those characters, or leave it unset'),
    Unit(('run.cancelled',), API,
         'the API call was cancelled (`cancel()` returned True, or Ctrl-C); torchrun was '
         'stopped on every host',
         'run again'),
    Unit(('ansible.error',), API,
         'ansible-playbook stopped before writing its report (an inventory that cannot be '
         'read, a Slurm job that is not running, a syntax error); the detail is the first '
         'error it printed',
         "as the detail says; ansible.log in the run's directory has the rest"),
)

# docs/checks.md's tables: what preflight reports, what a run adds, what only the API adds.
TABLES = ((PREFLIGHT, INPUT), (RUN,), (API,))
IDS = frozenset(cid for unit in REGISTRY for cid in unit.ids)


def markdown(phases):
    """docs/checks.md's table of the units decided in `phases`."""
    lines = ["| id | what it catches | the fix it names |", "| --- | --- | --- |"]
    for unit in REGISTRY:
        if unit.phase in phases:
            ids = ", ".join("`%s`" % i for i in unit.ids)
            lines.append("| %s | %s | %s |" % (ids, unit.catches, unit.fix))
    return "\n".join(lines)
