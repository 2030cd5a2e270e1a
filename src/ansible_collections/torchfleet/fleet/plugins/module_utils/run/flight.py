"""Where each rank is in its collectives, from torch's Flight Recorder, and what that says
when a run hangs or fails: the collective at which the ranks diverge, the ranks that never
joined it or called something else.

Three parts, one per place they run:

- WATCHER, in every rank (part of the sitecustomize stacks.py installs): a daemon thread that
  each second reads the recorder's pg_status (last enqueued and last completed collective of
  each process group: 0.1 ms, no entry copied) and writes it to fr_position.json in the rank's
  log directory; when a collective stays pending for a second it adds that collective's op,
  shapes and dtypes (one JSON dump of the buffer, once per position). A thread, because a
  rank blocked inside a collective runs no Python signal handler. When the agent asks (a hang:
  the file TORCHFLEET_FR_TRIGGER appears) and when the rank exits inside a collective, it
  writes the whole recording in torch's own format (fr_trace_rank_<rank>, what torchfrtrace
  reads; without the entries' call sites, which take seconds to symbolize) beside the rank's
  logs, gathered with them.
  Once, when the recorder first shows a collective completed, it adds "first": when this
  rank's first collective completed (NCCL's recorded completion; with gloo, which records
  none, its call: the first collective runs in its caller and completes when the last rank
  calls it), for goodput's
  init (the first collective completed on every rank: runstate.RunState.timeline).
- positions(), in the host's agent: those files, checked and bounded, for its heartbeat.
- clean() and finding(), in the master's judge (runstate.py): a heartbeat's positions from
  another host are hostile until checked; finding() reads every rank's last position.

A position's groups are keyed by each group's name (the entries' process_group[0], torch's
_process_group_name: a run-wide count, "0" the default group, or a hash of the ranks), the
same on every rank of the group; the recorder's pg_status is keyed by pg_id, which counts the
groups of one process (with tensor- and data-parallel groups rank 0's pg 1 and rank 2's are two
groups), so the watcher learns each pg_id's name from the entries (_torchfleet_pgs). Each
group's hang is judged among the ranks that have it.

torch's analyzer (torchfrtrace) is not run by the judge: it needs the dumps of every rank in
one place, and on gloo it raises KeyError (gloo's dumps carry an empty pg_config). Its rule for
a hang is the one here: the ranks behind the highest sequence number of a group never joined
that collective; ranks at it with another op or size called something else.

Only the standard library: it runs inside the agent on every host.
"""
from __future__ import annotations

import json
import os
import time

POSITION = "fr_position.json"
TRIGGER = "_fr_dump"       # in the host's run directory: the agent asks every rank to dump
DUMP_PREFIX = "fr_trace_rank_"
ENV_BUFFER = "TORCH_FR_BUFFER_SIZE"  # torch's own (TORCH_NCCL_TRACE_BUFFER_SIZE is its old name)
ENV_TRIGGER = "TORCHFLEET_FR_TRIGGER"

# A position is one moment's when it held still this long (the watcher writes each second).
STEADY_S = 3.0
# Bounds of what one rank's position may hold (a beat carries every local rank's).
MAX_GROUPS = 4
OP_MAX, SHAPE_MAX, DTYPE_MAX, PG_MAX = 48, 120, 60, 16
FILE_MAX = 16 << 10

WATCHER = r'''

def _torchfleet_group(e):
    """torchfleet: the key of a recorder entry's process group, the same on every rank of it:
    its name (process_group[0]: torch's _process_group_name, a run-wide count or a hash of its
    ranks), hashed when longer than 16 characters. Not pg_id: that counts the groups of one
    process, so rank 0's pg 1 may be its tensor-parallel group and rank 2's pg 1 another.
    A torch whose entries carry no name: pg_id (right while the run has one group)."""
    pg = e.get("process_group")
    name = str(pg[0]) if isinstance(pg, (list, tuple)) and pg and pg[0] != "" else ""
    if not name:
        return str(e.get("pg_id"))
    if len(name) <= 16:
        return name
    import hashlib
    return "~" + hashlib.sha1(name.encode()).hexdigest()[:15]


def _torchfleet_pgs(status_dumps, entry_dumps, names):
    """torchfleet: ({group: [last enqueued, last completed, op, shapes, dtypes, last started]},
    the pg_ids without a name yet) from the recorder's JSON dumps, each (source, dump): gloo's
    and NCCL's have the same pg_status, keyed by pg_id (gloo writes its numbers as strings;
    last started is -1 unless NCCL times its collectives, TORCH_NCCL_ENABLE_TIMING=1). Each
    group is keyed by _torchfleet_group, names ({(source, pg_id): group}) learned from the
    entries of entry_dumps (the only place a pg_id meets its group's name); the op of each
    group's newest collective from them too."""
    import json
    for src, d in entry_dumps:
        for e in d.get("entries") or []:
            names[(src, str(e.get("pg_id")))] = _torchfleet_group(e)
    pgs, unknown = {}, set()
    for src, d in status_dumps:
        for pg_id, s in (d.get("pg_status") or {}).items():
            seq = int(s.get("last_enqueued_collective", -1))
            done = int(s.get("last_completed_collective", -1))
            started = int(s.get("last_started_collective", -1))
            group = names.get((src, str(pg_id)))
            if group is None:
                if seq > 0:  # (none yet: -1 or 0, and nothing to say)
                    unknown.add((src, str(pg_id)))
                continue
            if group not in pgs or seq > pgs[group][0]:
                pgs[group] = [seq, done, "", "", "", started]
    for _src, d in entry_dumps:
        for e in d.get("entries") or []:
            v = pgs.get(_torchfleet_group(e))
            if v and not e.get("is_p2p") and e.get("collective_seq_id") == v[0]:
                v[2:5] = [str(e.get("profiling_name") or ""),
                          json.dumps(e.get("input_sizes"))[:120],
                          ",".join(map(str, e.get("input_dtypes") or []))[:60]]
    return pgs, unknown


def _torchfleet_first(entry_dumps):
    """torchfleet: when this rank's first collective completed (epoch seconds, this host's
    clock): the earliest collective entry's time_discovered_completed_ns where the recorder
    knows it (NCCL's watchdog: the first collective also sets up the communicator, which can
    take seconds at scale, after the call returned), else its time_created_ns (gloo says 0:
    its collective runs in the caller and completes when the last rank calls it, so the latest
    rank's call is that moment). The recorder keeps the newest few thousand: a rank that ran
    more before the watcher's first look reads a later one. None without one."""
    first = None
    for _src, d in entry_dumps:
        for e in d.get("entries") or []:
            created = int(e.get("time_created_ns") or 0)
            if not e.get("is_p2p") and created > 0 and (first is None or created < first[0]):
                first = (created, int(e.get("time_discovered_completed_ns") or 0))
    if first is None:
        return None
    return (first[1] if first[1] >= first[0] else first[0]) / 1e9


def _torchfleet_samples(entries, after, n_max):
    """torchfleet: the rows to write for stragglers (straggle.py) from the recorder's entries:
    ([[group, seq, time_created_ns, duration_ms or -1], ...] of the newest n_max sampled
    collectives past `after` ({group: seq}), after updated, how many NCCL collectives completed
    untimed). gloo's every collective (its call time); NCCL's once timed (duration_ms:
    TORCH_NCCL_ENABLE_TIMING=1). Sampled: the
    collectives whose seq hashes into the top 2^-j, j the least that keeps them to n_max (the
    same seqs on every rank: straggle.sampled). Not sends and receives (is_p2p): nothing in a
    send's entry and its receive's is the same (p2p_seq_id counts one process's own; torch's
    analyzer pairs them by order over whole recordings, and this ring wraps between samples),
    and gloo records none; a run whose hosts only they connect is said blind there
    (straggle.between_hosts)."""
    fresh, untimed = [], 0
    for e in entries:  # (the group: _torchfleet_group)
        name, dur = str(e.get("profiling_name") or ""), e.get("duration_ms")
        timed = isinstance(dur, (int, float)) and not isinstance(dur, bool) and dur >= 0
        untimed += name.startswith("nccl:") and not timed and e.get("state") == "completed"
        if e.get("is_p2p") or not (name.startswith("gloo:") or name.startswith("nccl:")
                                   and timed):
            continue
        pg, seq = _torchfleet_group(e), int(e.get("collective_seq_id") or 0)
        if seq > after.get(pg, -1):
            fresh.append([pg, seq, int(e.get("time_created_ns") or 0),
                          float(dur) if timed else -1.0])
    for pg, seq, _t, _d in fresh:
        after[pg] = max(after.get(pg, -1), seq)
    j = 0
    while len(fresh) >> j > n_max and j < 32:
        j += 1
    rows = [r for r in fresh if j == 0 or ((r[1] * 2654435761) & 0xFFFFFFFF) >> (32 - j) == 0]
    return sorted(rows, key=lambda r: (r[1], r[0]))[-n_max:], after, untimed


def _torchfleet_next(cost, period, budget, now):
    """torchfleet: seconds from now (the wall clock) until a rank's next sample for stragglers,
    after one that cost `cost` s of CPU: the next multiple on the wall clock of `period` or
    twice it, the shorter whose samples keep within budget. Ranks whose dumps cost alike
    sample at the same moments: each collective's rows reach the master from every rank
    together, and the ranks' stalls of the GIL overlap instead of adding up. Never rarer than
    twice `period`: a full recorder's dump cost 50 ms on a loaded 2-CPU host, one each 25 s at
    the budget alone, and the rows of one collective came further apart than the master's
    window (issue 57): the dumps then cost up to cost / (2 x period) of a core."""
    every = period
    while every < cost / budget and every < 2 * period:
        every *= 2
    return (now // every + 1) * every - now


def _torchfleet_flight():
    """torchfleet: this rank's place in its collectives, from torch's Flight Recorder, each
    second to fr_position.json beside its logs; the whole recording when the agent asks."""
    import atexit
    import json
    import os
    import sys
    import threading
    import time

    err, rank = os.environ.get("TORCHELASTIC_ERROR_FILE"), os.environ.get("RANK")
    trigger = os.environ.get("TORCHFLEET_FR_TRIGGER")
    if not err or rank is None or not trigger:
        return
    here, pid = os.path.dirname(err), os.getpid()
    seen = {"pgs": None, "detailed": None, "dumped": False, "after": {}, "next": 0.0,
            "names": {}, "lost": set(), "first": None}
    try:  # stragglers: "period,budget,rows" (straggle.py), or unset: off
        period, budget, n_max = (float(v) for v in os.environ["TORCHFLEET_FR_SAMPLE"].split(","))
    except (KeyError, ValueError):
        period = budget = n_max = 0.0
    dumping = threading.Lock()

    def recorder():
        dist = sys.modules.get("torch.distributed")
        try:
            if dist is None or not dist.is_available() or not dist.is_initialized():
                return None
            import torch._C._distributed_c10d as c10d
            return c10d
        except Exception:
            return None

    def dumps(c10d, collectives):
        out = []
        for name in ("_dump_nccl_trace_json", "_dump_fr_trace_json"):
            dump = getattr(c10d, name, None)
            if dump is not None:
                try:
                    out.append((name[:-5], json.loads(dump(includeCollectives=collectives))))
                except Exception:
                    pass
        return out

    def write(name, data):
        tmp = os.path.join(here, "." + name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(here, name))

    def look(c10d, detail):
        pgs, unknown = _torchfleet_pgs(dumps(c10d, False), [], seen["names"])
        # A group not named yet: its name from the entries, once (a group whose entries the
        # recorder no longer holds stays unnamed: nothing of it is said).
        if unknown - seen["lost"] or detail and any(v[0] > v[1] for v in pgs.values()):
            pgs, unknown = _torchfleet_pgs(dumps(c10d, False), dumps(c10d, True),
                                           seen["names"])
            seen["lost"] |= unknown
        return pgs

    def save(pgs):
        out = {"rank": int(rank), "pid": pid, "pgs": pgs}
        if seen["first"]:
            out["first"] = seen["first"]
        write("fr_position.json", json.dumps(out).encode())

    def dump_all(c10d):
        with dumping:
            if not seen["dumped"]:
                seen["dumped"] = True
                dump_once(c10d)

    def dump_once(c10d):
        # Without the entries' call sites: symbolizing them took over 5 s in a loaded rank, and
        # each rank's stack is taken beside (stacks.py).
        for name in ("_dump_nccl_trace", "_dump_fr_trace"):
            dump = getattr(c10d, name, None)
            if dump is not None:
                try:
                    write("fr_trace_rank_" + rank, dump(includeCollectives=True,
                                                        includeStackTraces=False))
                    return
                except Exception:
                    pass

    def sample(c10d):
        # For stragglers: the recorder's entries (a pickled dump, which costs about half of
        # the JSON one: 2000 entries took 33 ms on a CPU host, the GIL held), no more often
        # than its cost allows: its CPU time, so that a host whose CPU is capped still samples.
        import pickle
        began = time.thread_time()
        entries = []
        for name in ("_dump_nccl_trace", "_dump_fr_trace"):
            dump = getattr(c10d, name, None)
            if dump is not None:
                try:
                    entries = pickle.loads(dump(includeCollectives=True,
                                                includeStackTraces=False))["entries"]
                    for e in entries:
                        seen["names"][(name, str(e.get("pg_id")))] = _torchfleet_group(e)
                    break
                except Exception:
                    pass
        rows, seen["after"], untimed = _torchfleet_samples(entries, seen["after"], int(n_max))
        if rows or untimed:
            write("fr_sample.json", json.dumps({"rank": int(rank), "rows": rows,
                                                "untimed": untimed > 0}).encode())
        seen["next"] = time.monotonic() + _torchfleet_next(time.thread_time() - began, period,
                                                           budget, time.time())

    def once():
        c10d = recorder()
        if c10d is None:
            return
        if period > 0 and budget > 0 and time.monotonic() >= seen["next"]:
            sample(c10d)
        plain = look(c10d, False)
        pending = any(v[0] > v[1] for v in plain.values())
        # (From the recorder's own status, named or not: a group the watcher could not name
        # yet, or ever, still tells when this rank's first collective completed.)
        first = seen["first"] is None and (any(v[1] >= 1 for v in plain.values()) or any(
            int(st.get("last_completed_collective", -1)) >= 1 for _src, d in dumps(c10d, False)
            for st in (d.get("pg_status") or {}).values()))
        if first:  # (a dump that failed or held none: this look's time, a second late at most)
            seen["first"] = _torchfleet_first(dumps(c10d, True)) or time.time()
        if plain == seen["pgs"] and pending and seen["detailed"] != plain:
            seen["detailed"] = plain
            save(look(c10d, True))  # the same collective pending for a second: its op
        elif plain != seen["pgs"] or first:
            save(plain)
        seen["pgs"] = plain
        if not seen["dumped"] and os.path.exists(trigger):
            dump_all(c10d)

    def loop():
        while os.getpid() == pid:
            time.sleep(1.0)
            try:
                once()
            except Exception:
                pass

    def at_exit():
        # A rank leaving inside a collective (its timeout), or while the agent asks for the
        # recordings (a peer stopped first broke the collective): its place and its recording,
        # before the process group is gone. A dump the watcher began is finished first.
        try:
            c10d = recorder()
            if c10d is not None and os.getpid() == pid:
                pgs = look(c10d, True)
                if any(v[0] > v[1] for v in pgs.values()):
                    save(pgs)
                if any(v[0] > v[1] for v in pgs.values()) or os.path.exists(trigger):
                    dump_all(c10d)
        except Exception:
            pass

    atexit.register(at_exit)
    threading.Thread(target=loop, name="torchfleet-flight", daemon=True).start()


_torchfleet_flight()
'''


def rank_env(entries, run_dir):
    """The ranks' environment for a Flight Recorder of `entries` (0: off). torch's own
    variable is set even when off (0, never empty: an empty one kills the rank at its process
    group's creation); NCCL's own dump on a collective's timeout goes beside the watcher's."""
    env = {ENV_BUFFER: str(int(entries))}
    if entries:
        env.update({ENV_TRIGGER: os.path.join(run_dir, TRIGGER),
                    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                    "TORCH_FR_DUMP_TEMP_FILE": os.path.join(run_dir, "logs", "nccl_" + DUMP_PREFIX)})
    return env


def ask_dump(run_dir):
    """Every rank of this host writes its whole recording (the watcher looks each second)."""
    try:
        with open(os.path.join(run_dir, TRIGGER), "w"):
            pass
    except OSError:
        pass


def wait_dumps(dirs, workers, wait_s):
    """Wait, at most wait_s, until every live rank (workers: {local rank: (pid, rank)}) wrote
    its recording into its log directory (dirs: {local rank: directory})."""
    deadline = time.monotonic() + wait_s
    want = [os.path.join(dirs[lr], DUMP_PREFIX + str(rank)) for lr, (_pid, rank)
            in workers.items() if lr in dirs]
    while time.monotonic() < deadline and not all(os.path.exists(p) for p in want):
        time.sleep(0.2)


# -- checking what a rank or another host wrote ----------------------------------------------

def _int(value):
    return value if isinstance(value, int) and not isinstance(value, bool) and \
        -1 <= value < 1 << 62 else None


def clean_groups(pgs):
    """A rank's {group: [seq, done, op, shapes, dtypes, started]} checked and bounded, or
    None (started: -1 when unknown, and for a position written without it). At most
    MAX_GROUPS groups: those with a collective pending first, then by group id."""
    if not isinstance(pgs, dict):
        return None
    out = {}
    for pg, v in pgs.items():
        if not (isinstance(pg, str) and 0 < len(pg) <= PG_MAX and isinstance(v, list)
                and len(v) in (5, 6)):
            return None
        seq, done = _int(v[0]), _int(v[1])
        started = _int(v[5]) if len(v) == 6 else -1
        if seq is None or done is None or started is None \
                or not all(isinstance(s, str) for s in v[2:5]):
            return None
        out[pg] = [seq, done, v[2][:OP_MAX], v[3][:SHAPE_MAX], v[4][:DTYPE_MAX], started]
    keep = sorted(out, key=lambda g: (out[g][0] <= out[g][1], len(g), g))[:MAX_GROUPS]
    return {g: out[g] for g in sorted(keep, key=lambda g: (len(g), g))}


def rank_key(key, ranks):
    """A JSON key naming one of `ranks` ('3'), as that rank; None for anything else (a digit
    str.isdigit() takes that int() does not, such as '²', included)."""
    if not (isinstance(key, str) and key.isdigit() and len(key) < 8):
        return None
    try:
        rank = int(key)
    except ValueError:
        return None
    return rank if rank in ranks else None


def clean(coll, ranks):
    """A heartbeat's positions, {rank: groups} with rank as a string (JSON), checked: only the
    ranks of `ranks` (the host's own), each clean_groups(). Anything else is dropped."""
    if not isinstance(coll, dict):
        return {}
    out = {}
    for key, pgs in list(coll.items())[:len(ranks)]:
        rank, groups = rank_key(key, ranks), clean_groups(pgs)
        if rank is not None and groups is not None:
            out[str(rank)] = groups
    return out


def positions(dirs, first_dead, alive, now=None, firsts=None):
    """This host's ranks' positions from each rank's fr_position.json (dirs: {local rank: log
    directory}): ({rank: groups}, {rank: [steady_s, alive]}). steady_s: how long the position
    had not changed (the watcher rewrites the file only on a change), up to now for a live rank,
    up to when it was first seen dead (first_dead: {rank: time}, kept by the caller) for one
    that died; alive(pid) says which (procs.alive). A missing, garbled or oversized file is no
    position. firsts, when given, gets {rank: age_s} of each rank's first collective (the
    watcher's "first", on this host's clock)."""
    now = time.time() if now is None else now
    coll, steady = {}, {}
    for rdir in dirs.values():
        path = os.path.join(rdir, POSITION)
        try:
            with open(path, "rb") as f:
                raw = f.read(FILE_MAX + 1)
            mtime = os.stat(path).st_mtime
            data = json.loads(raw) if len(raw) <= FILE_MAX else None
        except (OSError, ValueError, RecursionError):
            continue
        if not isinstance(data, dict):
            continue
        rank, groups = _int(data.get("rank")), clean_groups(data.get("pgs"))
        pid = _int(data.get("pid"))
        if rank is None or rank < 0 or groups is None:
            continue
        running = pid is not None and pid > 0 and alive(pid)
        until = now if running else first_dead.setdefault(rank, now)
        coll[str(rank)] = groups
        steady[str(rank)] = [round(max(0.0, until - mtime), 3), running]
        first = data.get("first")
        if firsts is not None and isinstance(first, (int, float)) and \
                not isinstance(first, bool) and 0 < first <= now:
            firsts[str(rank)] = round(now - first, 3)
    return coll, steady


def clean_steady(steady, ranks):
    """A heartbeat's {rank: [steady_s, alive]} for the host's own ranks, checked."""
    out = {}
    if not isinstance(steady, dict):
        return out
    for key, v in list(steady.items())[:len(ranks)]:
        rank = rank_key(key, ranks)
        if not (rank is not None
                and isinstance(v, list) and len(v) == 2 and isinstance(v[1], bool)
                and isinstance(v[0], (int, float)) and not isinstance(v[0], bool)
                and 0 <= v[0] < 1e9):
            continue
        out[str(rank)] = [float(v[0]), v[1]]
    return out


# -- the finding --------------------------------------------------------------------------------

ELEMENT_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4,
                 "Short": 2, "Char": 1, "Byte": 1, "Bool": 1, "ComplexFloat": 8,
                 "ComplexDouble": 16, "UInt16": 2, "UInt32": 4, "UInt64": 8}


def nbytes(shapes, dtypes):
    """Bytes of a collective's inputs from the recorder's input_sizes and input_dtypes; None
    when they cannot be read."""
    try:
        sizes = json.loads(shapes) if shapes else None
    except (ValueError, RecursionError):
        return None
    names = dtypes.split(",") if dtypes else []
    if not isinstance(sizes, list) or len(sizes) != len(names):
        return None
    total = 0
    for i, dims in enumerate(sizes):
        name = names[i]
        if not isinstance(dims, list) or not all(_int(d) is not None and d >= 0 for d in dims):
            return None
        count = 1
        for d in dims:
            count *= d
        per = ELEMENT_BYTES.get(name) or (1 if name.startswith("Float8") else None)
        if per is None:
            return None
        total += count * per
    return total


def human(n):
    if n is None:
        return "size unknown"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return "%.1f %s" % (n / scale, unit)
    return "%d B" % n


def op_name(profiling_name):
    """'gloo:all_reduce' / 'nccl:all_reduce' -> 'all_reduce'."""
    return profiling_name.split(":", 1)[-1] if profiling_name else ""


def finding(ranks, world, failed_rank=None, moving=()):
    """What every rank's last position says. ranks: {rank: (host, groups)}; world: how many
    ranks the run has; failed_rank: a rank whose death is being judged (for where the others
    were); moving: ranks whose position had not held still for STEADY_S, so that the positions
    are not one moment's (a rank running twenty collectives a second is seen a beat late).

    Returns {"recorded", "world", "group", "seq", "op", "bytes", "missing": [{rank, host,
    seq}], "mismatch": [{rank, host, op, bytes, dtypes}], "waiting", "others", "note",
    "backend", "not_started": [{rank, host}]}: missing
    and mismatch name ranks only when every rank of the run has a position; otherwise note
    says why nothing is named."""
    out = {"recorded": len(ranks), "world": world, "group": None, "seq": None, "op": "",
           "bytes": None, "missing": [], "mismatch": [], "waiting": 0, "others": "",
           "backend": "", "not_started": [],
           "note": ""}
    if not ranks:
        out["note"] = ("no rank's collectives were recorded (flight_recorder=0, a torch "
                       "without the recorder, or no process group yet)")
        return out
    if len(ranks) < world:
        absent = [r for r in range(world) if r not in ranks]
        out["note"] = "no collective position from rank(s) %s: nothing is named from the " \
            "recording" % ", ".join(map(str, absent[:8])) + (" ..." if len(absent) > 8 else "")
        return out
    if moving:
        out["note"] = "rank(s) %s were still moving through their collectives: the " \
            "positions are not one moment's, nothing is named from them" % ", ".join(
                map(str, sorted(moving)[:8]))
        return out
    out["others"] = _others(ranks, failed_rank)
    groups = sorted({g for _h, pgs in ranks.values() for g in pgs},
                    key=lambda g: (g != "0", len(g), g))
    if "0" not in groups:
        groups.insert(0, "0")
    # A rank behind in one group while it waits in another group's collective is held there,
    # a consequence (tensor- and data-parallel groups: rank 1 behind in its tensor-parallel
    # group because it waits for rank 3 in their data-parallel one): a group whose ranks
    # behind all wait elsewhere is named only when no group names a rank that waits nowhere.
    held = {r for r, (_h, pgs) in ranks.items() if any(v[0] > v[1] for v in pgs.values())}
    found = None
    for g in groups:
        members = {r: pgs[g] for r, (_h, pgs) in ranks.items() if g in pgs}
        if g == "0":  # every rank is in the default group: one without it has not used it
            members = {r: members.get(r, [-1, -1, "", "", "", -1]) for r in ranks}
        top = max(v[0] for v in members.values())
        at_top = {r: v for r, v in members.items() if v[0] == top}
        waiting = [r for r, v in at_top.items() if v[0] > v[1]]
        if not waiting:
            continue  # nobody waits in this group's newest collective
        behind = sorted(r for r, v in members.items() if v[0] < top)
        signature = {r: (op_name(v[2]), v[3], v[4]) for r, v in at_top.items() if v[2]}
        common = _majority(signature)
        # Without a strict majority every rank at the collective is named with what it called.
        odd = sorted(r for r, s in signature.items() if s != common) if len(
            set(signature.values())) > 1 else []
        if not behind and not odd and len(waiting) < len(at_top):
            continue
        if behind and not odd and held.issuperset(behind):
            found = found or (g, members, top, at_top, waiting, behind, signature, common, odd)
            continue
        found = (g, members, top, at_top, waiting, behind, signature, common, odd)
        break
    if found is not None:
        g, members, top, at_top, waiting, behind, signature, common, odd = found
        ref = next((at_top[r] for r in sorted(at_top) if signature.get(r) == common), None)
        out.update(group=g, seq=top, waiting=len(waiting),
                   backend=ref[2].split(":", 1)[0] if ref and ":" in ref[2] else "",
                   # With NCCL's timing (last started known, >= 0): the ranks whose GPU never
                   # started the collective they all wait in.
                   not_started=[{"rank": r, "host": ranks[r][0]} for r in sorted(at_top)
                                if len(at_top[r]) > 5 and 0 <= at_top[r][5] < top],
                   op=common[0] if common else "",
                   bytes=nbytes(ref[3], ref[4]) if ref else None,
                   missing=[{"rank": r, "host": ranks[r][0], "seq": members[r][0]}
                            for r in behind],
                   mismatch=[{"rank": r, "host": ranks[r][0], "op": signature[r][0],
                              "bytes": nbytes(at_top[r][3], at_top[r][4]),
                              "dtypes": at_top[r][4]} for r in odd])
        return out
    out["note"] = "no rank waits in a collective that another has not joined"
    return out


def _majority(signature):
    """The signature more than half the ranks share, else None."""
    counts = {}
    for s in signature.values():
        counts[s] = counts.get(s, 0) + 1
    best = max(sorted(counts), key=lambda s: counts[s]) if counts else None
    return best if best is not None and counts[best] * 2 > len(signature) else None


def _others(ranks, failed_rank):
    """Where the ranks other than failed_rank were: their most common collective, when they
    waited in one (ranks past every collective they called were computing: that says nothing
    of the failure, and whether the recorder saw them there is a matter of timing)."""
    if failed_rank is None:
        return ""
    where = {}
    for r, (_h, pgs) in ranks.items():
        if r == failed_rank or not pgs:
            continue
        g = "0" if "0" in pgs else sorted(pgs, key=lambda k: (len(k), k))[0]
        seq, done, op = pgs[g][0], pgs[g][1], op_name(pgs[g][2])
        if seq > done:
            where.setdefault((g, seq, op), []).append(r)
    if not where:
        return ""
    (g, seq, op), rs = max(where.items(), key=lambda kv: (len(kv[1]), kv[0][1]))
    others = len(ranks) - (1 if failed_rank in ranks else 0)
    who = ("the other rank was" if others == 1 else
           "all of the other %d ranks were" % others if len(rs) == others else
           "%d of the other %d ranks %s" % (len(rs), others, "was" if len(rs) == 1 else "were"))
    return "%s in %s #%d%s" % (who, op or "collective", seq, "" if g == "0" else " (group %s)" % g)


def culprits(f):
    """The ranks a finding names: those that never joined, then those that called another
    collective."""
    return [m["rank"] for m in f.get("missing") or []] + \
        [m["rank"] for m in f.get("mismatch") or []]


# What is stuck when every rank joined a collective that never completed, by backend.
STUCK_BELOW = {"nccl": "a GPU, NCCL or the network", "gloo": "gloo or the network"}


def all_in(f):
    """Every rank of the run waits in the finding's collective, none missing or at odds: the
    collective itself never completed."""
    return bool(f) and f.get("seq") is not None and not culprits(f) \
        and f.get("waiting") == f.get("world") and f.get("recorded") == f.get("world")


def text(f):
    """The finding in words, '' when it says nothing about a collective."""
    if not f or not (culprits(f) or all_in(f)):
        return ""
    head = "collective #%d (%s, %s, group %s)" % (
        f["seq"], f["op"] or "op unknown", human(f["bytes"]), f["group"])
    if all_in(f):
        idle = f.get("not_started") or []
        if idle:
            return "%s: every rank joined it and it never completed: it never started on the " \
                "GPU of %s%s (a GPU still busy with earlier work, or stuck), not a rank" % (
                    head, ", ".join("%s rank %d" % (m["host"], m["rank"]) for m in idle[:4]),
                    " and %d more" % (len(idle) - 4) if len(idle) > 4 else "")
        return "%s: every rank joined it and it never completed: %s is stuck, not a rank" % (
            head, STUCK_BELOW.get(f.get("backend") or "", "a device, the backend or the network"))
    parts = []
    for m in f["missing"][:4]:
        parts.append("%s rank %d never joined" % (m["host"], m["rank"]))
    for m in f["mismatch"][:4]:
        parts.append("%s rank %d called %s (%s, %s)" % (
            m["host"], m["rank"], m["op"], human(m["bytes"]), m["dtypes"]))
    more = len(culprits(f)) - len(parts)
    return "%s: %s%s" % (head, "; ".join(parts), " and %d more" % more if more > 0 else "")
