"""Node health, on the host: what a GPU's and a host's tools say, gathered and read.

Two steps, each usable alone. `collect` runs on a host (node_probe) and returns the raw
outputs under the file names of a saved bundle (BUNDLE). `facts` reads those texts into a
compact record: node_probe sends that to the controller, `torchfleet health --from DIR` builds
it from a directory of saved files; so a host's live answer and an operator's saved one go
through the same parsers. The verdicts are health_checks.py's, on the controller (this module
is shipped to every host and carries no rule).
"""
from __future__ import annotations

import os
import pwd
import re
import resource

from ansible_collections.torchfleet.fleet.plugins.module_utils.host import smi, xid
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import procs
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.command import missing
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.gpu import AMD_SMI_ARGV

# The files of a saved bundle (`torchfleet health --from DIR`), each optional: what is absent
# is not checked. The same names key what a host's probe collects.
BUNDLE = (
    ("nvidia-smi-q.txt", "`nvidia-smi -q`"),
    ("nvidia-smi-rc.txt", "nvidia-smi's exit status when it failed (e.g. `15`, or `timeout`)"),
    ("nvidia-smi-nvlink.txt", "`nvidia-smi nvlink -s`"),
    ("dmesg.txt", "the kernel log: `dmesg`, `dmesg -T`, `dmesg --time-format iso` or "
                  "`journalctl -k -o short-iso`"),
    ("uptime.txt", "/proc/uptime at the time of dmesg.txt (windows a raw dmesg's seconds since "
                   "boot; without it the log's last line stands for now)"),
    ("amd-smi-metric.json", "`amd-smi metric --json` (ECC, PCIe, XGMI)"),
    ("amd-smi-static.json", "`amd-smi static --json` (each link's maximum width)"),
    ("amd-smi-process.json", "`amd-smi process --json`"),
    ("amd-smi-bad-pages.json", "`amd-smi bad-pages --json`"),
    ("ulimit-l.txt", "`ulimit -l` as the run's user"),
    ("modules.txt", "/proc/modules (is nvidia_peermem loaded)"),
    ("infiniband.txt", "`ls /sys/class/infiniband` (memlock and peermem matter with RDMA)"),
    ("fabricmanager.txt", "`systemctl is-active nvidia-fabricmanager`"),
    ("df.txt", "`df -Pk DIR ...` of the run directory and the checkpoint directory"),
)
FILES = tuple(entry[0] for entry in BUNDLE)
AMD_STATIC = "amd-smi-static.json"  # also what node_probe counts AMD GPUs from (gpu.AMD_SMI_ARGV)
MAX_FILE = 16 << 20


# A line a shell or a tool prints instead of the output asked for: what `cmd > file 2>&1`
# saves on a host without that command, device or permission.
SAVED_ERROR = re.compile(r"command not found|No such file or directory|cannot access|"
                         r"Permission denied|Operation not permitted|not found\s*$|"
                         r"has failed because|couldn't communicate", re.I | re.M)
SMI_Q_HEAD = re.compile(r"^=+NVSMI LOG=+\s*$", re.M)
SMI_Q_GPU = re.compile(r"^GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]\s*$", re.M)
SMI_Q_FIELD = re.compile(r"^ {4,}\S[^:]*?\s:\s", re.M)
RDMA_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
# Where a partial `nvidia-smi -q` is judged, it stands for a GPU of unknown address.
UNKNOWN_GPU = "GPU unknown"


def bundle_problems(files):
    """Which saved files are not (all of) their command's output: ({name: text fit to judge},
    [{"name", "kind": "foreign" | "partial", "detail"}]). A foreign file (a saved error message,
    another command's output) is left out, never read as the host's state; a partial
    `nvidia-smi -q` (what `| grep -A2 Fabric` keeps) is judged for what it says, as one GPU
    of unknown address."""
    fit, problems = {}, []
    what = dict(BUNDLE)
    for name, text in files.items():
        lines = [line for line in text.splitlines() if line.strip()]
        first = lines[0].strip()[:160] if lines else ""
        if name == "nvidia-smi-q.txt":
            whole, section = SMI_Q_HEAD.search(text), SMI_Q_GPU.search(text)
            if SMI_Q_FIELD.search(text) and not SAVED_ERROR.search(first) and not (
                    whole and section):
                fit[name] = text if section else UNKNOWN_GPU + "\n" + text
                problems.append({"name": name, "kind": "partial", "detail": (
                    "%s is part of %s (%s): only what it holds was judged" % (
                        name, what[name], "no NVSMI LOG header" if section
                        else "no NVSMI LOG header and no GPU section"))})
                continue
            bad = None if whole and section else first
        elif name == "infiniband.txt":
            bad = next((line for line in lines if not RDMA_NAME.match(line.strip())), None)
        elif name == "ulimit-l.txt":
            bad = first if lines and parse_memlock(text) is None else None
        else:
            bad = first if lines and len(lines) <= 3 and SAVED_ERROR.search(first) else None
        if bad is None:
            fit[name] = text
        else:
            problems.append({"name": name, "kind": "foreign", "detail": (
                "%s is not %s's output: %r" % (name, what[name], bad.strip()[:160]))})
    return fit, problems


def bundle_help():
    return "\n".join("  %-24s %s" % (name, what) for name, what in BUNDLE)


# -- on the host ---------------------------------------------------------------------------------

def _read(path, limit=MAX_FILE):
    try:
        with open(path, errors="replace") as f:
            return f.read(limit)
    except OSError:
        return None


def collect(run, disk_paths, tool, smi_why=None, rdma_names=(), known=None):
    """{bundle name: text} from this host; `run` is command.bounded's. `tool`: the GPU tool
    node_probe found (nvidia-smi, amd-smi, ...), `smi_why`: how nvidia-smi failed there, if it
    did (it is not run again: a hung one would cost its timeout twice). Only what the host has:
    nvidia-smi's outputs with NVIDIA GPUs, amd-smi's with AMD ones, the kernel log where Xids
    can be in it. `rdma_names`: the host's RDMA devices (node_probe reads them); `known`:
    outputs node_probe already has, by bundle name (amd-smi static's, from counting the GPUs)."""
    files = dict(known or {})
    if tool == "nvidia-smi":
        out, why = (None, smi_why) if smi_why else run(["nvidia-smi", "-q"])
        if out is None:
            files["nvidia-smi-rc.txt"] = str(getattr(why, "rc", None) or "timeout")
            files["nvidia-smi-error"] = str(why)
        else:
            files["nvidia-smi-q.txt"] = out
            link = run(["nvidia-smi", "nvlink", "-s"])[0]
            if link is not None:
                files["nvidia-smi-nvlink.txt"] = link
            state, why = run(["systemctl", "is-active", "nvidia-fabricmanager"])
            # is-active prints the state and exits non-zero unless it is "active"; without
            # systemd the state is unknown, not a fault.
            state = "unknown" if missing(why) else (state or str(why or "")).strip()
            files["fabricmanager.txt"] = state.split("\n")[-1] or "unknown"
    elif tool == "amd-smi":
        for name, argv in (("amd-smi-metric.json", ["amd-smi", "metric", "--json"]),
                           (AMD_STATIC, AMD_SMI_ARGV),
                           ("amd-smi-process.json", ["amd-smi", "process", "--json"]),
                           ("amd-smi-bad-pages.json", ["amd-smi", "bad-pages", "--json"])):
            out = files.get(name) or run(argv)[0]
            if out is not None:
                files[name] = out
    if tool == "nvidia-smi":
        out, why = run(["dmesg", "--time-format", "iso"])
        if out is None:
            # dmesg_restrict=1: the journal may still let this user read the kernel's lines.
            out, why2 = run(["journalctl", "-k", "-b", "-o", "short-iso", "--no-pager", "-q"])
            if out is None or not out.strip():
                files["dmesg-error"] = "dmesg: %s; journalctl -k: %s" % (
                    why, why2 or "nothing readable")
        if out is not None and out.strip():
            files["dmesg.txt"] = out
    files["uptime.txt"] = _read("/proc/uptime") or ""
    files["modules.txt"] = _read("/proc/modules") or ""
    files["infiniband.txt"] = "\n".join(sorted(rdma_names))
    files["ulimit-l.txt"] = _memlock_text()
    files["df.txt"] = _df(disk_paths)
    return files


def _memlock_text():
    soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    return "unlimited" if soft == resource.RLIM_INFINITY else str(soft // 1024)


def _df(paths):
    """`df -Pk` lines for each path (its nearest existing parent: a run directory that does not
    exist yet is made on that filesystem)."""
    lines = ["Filesystem 1024-blocks Used Available Capacity Mounted on"]
    for path in paths:
        probe = os.path.expanduser(path)
        while probe and not os.path.exists(probe):
            probe = os.path.dirname(probe.rstrip("/")) or "/"
        try:
            st = os.statvfs(probe)
        except OSError:
            continue
        size, free = st.f_blocks * st.f_frsize // 1024, st.f_bavail * st.f_frsize // 1024
        lines.append("%s %d %d %d %d%% %s" % (path, size, size - free, free,
                                              100 * (size - free) // max(size, 1), probe))
    return "\n".join(lines) + "\n"


def process_users(pids):
    """{pid: user name} for the GPU's processes this host can see (another PID namespace's
    are not there: '?')."""
    users = {}
    for pid in pids:
        owner = procs.uid(pid)
        try:
            users[pid] = pwd.getpwuid(owner).pw_name if owner is not None else "?"
        except KeyError:
            users[pid] = str(owner)
    return users


# -- what the texts say --------------------------------------------------------------------------

def parse_df(text):
    """[{path, free_bytes, mount}] of `df -Pk` lines (the header skipped)."""
    found = []
    for line in str(text)[:MAX_FILE].splitlines():
        fields = line.split()
        if len(fields) >= 6 and re.fullmatch("[0-9]{1,18}", fields[3]):
            found.append({"path": fields[0], "free_bytes": int(fields[3]) * 1024,
                          "mount": fields[-1]})
    return found


def parse_memlock(text):
    """KiB of `ulimit -l`, -1 for unlimited, None when unreadable."""
    value = str(text or "").strip().split("\n", 1)[0].strip()
    if value == "unlimited":
        return -1
    return int(value) if re.fullmatch("[0-9]{1,18}", value) else None


def _uptime(text):
    try:
        return float(str(text).split()[0])
    except (ValueError, IndexError):
        return None


def facts(files, window_s, now_wall=None, users=None):
    """The compact health record of one host from its bundle texts. `users`: a function
    {pids} -> {pid: user} where the processes can be looked at (on the host itself)."""
    files = {k: v for k, v in files.items() if isinstance(v, str)}
    rc_text = files.get("nvidia-smi-rc.txt", "").strip()
    gpus, vendor = [], None
    if "nvidia-smi-q.txt" in files:
        vendor, gpus = "nvidia", smi.parse_smi_q(files["nvidia-smi-q.txt"])
        links = smi.parse_nvlink_status(files.get("nvidia-smi-nvlink.txt", ""))
        for gpu in gpus:
            gpu["nvlink_inactive"] = smi.inactive_links(links.get(gpu["index"], {}))
    elif any(name.startswith("amd-smi-") for name in files):
        vendor = "amd"
        gpus = smi.amd_gpus(files.get("amd-smi-metric.json", ""),
                            files.get("amd-smi-static.json", ""),
                            files.get("amd-smi-process.json", ""),
                            files.get("amd-smi-bad-pages.json", ""))
    pids = [p["pid"] for g in gpus for p in g["processes"] if p.get("pid") is not None]
    users = users(pids) if users is not None and pids else {}
    for gpu in gpus:
        for proc in gpu["processes"]:
            proc["user"] = users.get(proc["pid"], "?")
    events = xid.parse_xids(files["dmesg.txt"]) if "dmesg.txt" in files else []
    recent = xid.within(events, window_s, now_wall, _uptime(files.get("uptime.txt", "")))
    modules = files.get("modules.txt")
    return {
        "vendor": vendor,
        "smi_failed": None if not rc_text else {
            "rc": int(rc_text) if re.fullmatch("[0-9]{1,18}", rc_text) else None,
            "error": files.get("nvidia-smi-error", "").strip()[:300] or None},
        "gpus": gpus,
        "kernel_log": ("read" if "dmesg.txt" in files else
                       files.get("dmesg-error", "").strip()[:300] or None),
        "xids": recent[-200:],
        "xid_window_s": window_s,
        "memlock_kib": parse_memlock(files["ulimit-l.txt"]) if "ulimit-l.txt" in files else None,
        "rdma": bool(files.get("infiniband.txt", "").split()),
        "peermem": None if modules is None else bool(
            re.search(r"^nvidia_peermem\s", modules, re.M)),
        "fabricmanager": files.get("fabricmanager.txt", "").strip() or None,
        "disk": parse_df(files["df.txt"]) if "df.txt" in files else [],
    }
