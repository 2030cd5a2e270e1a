"""One rank's log, read in bounded chunks: on its host while the run goes on (the rank_log
module), or on the controller from the gathered copy (runs/<id>/logs/<host>).

A rank's log is torchrun's per-rank stdout.log and stderr.log (--redirects 3): on the host under
<run_dir>/logs/<rdzv>_<random>/attempt_<n>/<local_rank>/, gathered under
runs/<id>/logs/<host>/attempt_<n>/<local_rank>/ (the latest torchrun attempt in both). A read
starts at the given byte offset of each stream, or at its last `tail` lines; it returns at most
max_bytes per stream and the offsets to go on from, so that a follower sees every byte once.
"""
from __future__ import annotations

import glob
import os
import time

from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import EXITCODE, LOGS

STREAMS = ("stdout", "stderr")
MAX_BYTES = 1024 * 1024
POLL_S = 0.25

ARGUMENT_SPEC = dict(
    run_dir=dict(type="path", required=True),
    local_rank=dict(type="int", required=True),
    offsets=dict(type="dict", default={}),
    tail=dict(type="int", default=50),
    max_bytes=dict(type="int", default=MAX_BYTES),
    wait_s=dict(type="float", default=0.0),
)


def rank_dir(run_dir, local_rank):
    """The directory of the latest torchrun attempt's local rank, on a host or gathered; None
    when there is none (yet)."""
    attempts = (glob.glob(os.path.join(glob.escape(run_dir), LOGS, "*", "attempt_[0-9]*"))
                or glob.glob(os.path.join(glob.escape(run_dir), "attempt_[0-9]*")))
    if not attempts:
        return None
    latest = max(attempts, key=lambda a: int(a.rsplit("_", 1)[1]))
    path = os.path.join(latest, str(int(local_rank)))
    return path if os.path.isdir(path) else None


def _chunk(path, offset, tail, max_bytes, flush=False):
    """(text, next offset) of one stream from offset (None: its last `tail` lines); a last line
    without its newline waits for it, unless flush (the rank has ended)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            if offset is None or offset > size:  # a new start, or the file was replaced
                f.seek(max(0, size - max_bytes))
                data = f.read(max_bytes)
                lines = data.splitlines(keepends=True)
                data = b"".join(lines[-tail:]) if tail > 0 else b""
                return data.decode("utf-8", "replace"), size
            f.seek(offset)
            data = f.read(max_bytes)
    except OSError:
        return "", offset or 0
    # Only whole lines go out, unless one line alone fills the chunk.
    cut = data.rfind(b"\n") + 1
    if not flush and (0 < cut < len(data) or (cut == 0 and len(data) < max_bytes)):
        data = data[:cut]
    return data.decode("utf-8", "replace"), offset + len(data)


def _offset(offsets, stream):
    value = (offsets or {}).get(stream)
    try:
        value = int(value)
    except (TypeError, ValueError):
        return None
    return value if value >= 0 else None


def read(p, sleep=time.sleep, clock=time.monotonic):
    """The rank_log module's answer for these parameters (ARGUMENT_SPEC)."""
    run_dir = os.path.expanduser(p["run_dir"])
    max_bytes = max(1, min(int(p["max_bytes"]), MAX_BYTES))
    deadline = clock() + max(0.0, float(p["wait_s"]))
    while True:
        where = rank_dir(run_dir, p["local_rank"])
        ended = os.path.exists(os.path.join(run_dir, EXITCODE))
        streams = {}
        for stream in STREAMS:
            offset = _offset(p["offsets"], stream)
            if where is None:
                streams[stream] = {"text": "", "offset": offset or 0}
                continue
            text, nxt = _chunk(os.path.join(where, "%s.log" % stream), offset,
                               int(p["tail"]), max_bytes, flush=ended)
            streams[stream] = {"text": text, "offset": nxt}
        fresh = any(s["text"] for s in streams.values())
        if fresh or ended or clock() >= deadline:
            return {"found": where is not None, "ended": ended, "dir": where or "",
                    "missing": not os.path.isdir(run_dir), "streams": streams}
        sleep(POLL_S)
