"""Which filesystem holds a path, and its mount options, from the kernel's /proc/self/mountinfo
(proc(5)): what a watcher of files another host writes needs to know (NFS's attribute cache:
run/ckptwatch.py).

A mountinfo line (proc(5)): "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root
rw,errors=continue": mount id, parent id, major:minor, root, mount point (octal escapes: \\040
is a space), per-mount options, optional fields up to "-", then the filesystem type, the source
and the per-superblock options (where NFS puts vers=, acregmin=, actimeo=, nocto, ...).

Only the standard library: it runs inside the master's agent. Bounded (MOUNTINFO_MAX bytes,
a line's fields) and it never raises: what it cannot read is ("", {}).
"""
from __future__ import annotations

import os
import re

MOUNTINFO = "/proc/self/mountinfo"
MOUNTINFO_MAX = 4 << 20  # a host with 10,000 mounts writes about 1.5 MB
_OCTAL = re.compile(r"\\([0-7]{3})")
# Filesystems whose clients cache a file's attributes and a directory's listing for seconds:
# what another host wrote shows that late (nfs(5)'s acregmin/acregmax/acdirmin/acdirmax;
# mount.cifs(8)'s actimeo).
ATTRIBUTE_CACHED = ("nfs", "nfs4", "cifs", "smb3", "smbfs")
# Their defaults where the options do not name them: nfs(5) (acregmin 3, acregmax 60, acdirmin
# 30, acdirmax 60); mount.cifs(8) (actimeo=1).
AC_DEFAULTS = {"nfs": (3.0, 60.0, 30.0, 60.0), "cifs": (1.0, 1.0, 1.0, 1.0)}


def _unescape(field):
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse(text):
    """mountinfo's text -> [(mount point, fstype, {option: value or True})], in its order
    (a later mount over the same point hides an earlier one). A line that is not one is
    skipped."""
    out = []
    for line in text.splitlines():
        fields = line.split(" ", 64)
        if "-" not in fields[6:]:
            continue
        dash = fields.index("-", 6)
        if len(fields) < dash + 3 or len(fields) < 5:
            continue
        options = {}
        for opt in (fields[dash + 3] if len(fields) > dash + 3 else "").split(","):
            if opt:
                key, _eq, value = opt.partition("=")
                options[key] = value if _eq else True
        out.append((_unescape(fields[4]), fields[dash + 1], options))
    return out


def read_mountinfo(path=MOUNTINFO):
    try:
        with open(path, "rb") as f:
            return f.read(MOUNTINFO_MAX).decode("utf-8", "replace")
    except OSError:
        return ""


def mount_of(path, text=None):
    """(fstype, options) of the mount that holds path (the longest mount point above its real
    path; the last such mount wins), ("", {}) when it cannot be told."""
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):
        return "", {}
    best, found = -1, ("", {})
    for point, fstype, options in parse(read_mountinfo() if text is None else text):
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:
            best, found = len(point), (fstype, options)
    return found


def _seconds(value, default):
    try:
        return max(0.0, min(float(value), 86400.0))
    except (TypeError, ValueError):
        return default


def attribute_cache(fstype, options):
    """How late a change another host made can show here, in seconds: (a file's attributes
    while it changes (acregmin), a file's attributes at most (acregmax), a directory's listing
    at most (acdirmax), close-to-open: opening a file asks the server afresh); (0, 0, 0, True)
    for a filesystem whose clients see each other's writes at once (local disks, Lustre, GPFS,
    CephFS)."""
    if fstype not in ATTRIBUTE_CACHED:
        return 0.0, 0.0, 0.0, True
    acregmin, acregmax, _acdirmin, acdirmax = AC_DEFAULTS["nfs" if fstype.startswith("nfs")
                                                          else "cifs"]
    if options.get("noac") is True:
        return 0.0, 0.0, 0.0, True
    if "actimeo" in options:
        acregmin = acregmax = acdirmax = _seconds(options["actimeo"], acregmax)
    acregmin = _seconds(options.get("acregmin"), acregmin)
    acregmax = _seconds(options.get("acregmax"), acregmax)
    acdirmax = _seconds(options.get("acdirmax"), acdirmax)
    cto = fstype.startswith("nfs") and options.get("nocto") is not True
    return acregmin, max(acregmin, acregmax), acdirmax, cto
