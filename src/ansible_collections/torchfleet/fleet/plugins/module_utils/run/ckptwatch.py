"""Checkpoints seen from outside: the run's checkpoint_dir watched, read-only, by the
master's agent, each checkpoint recorded when it completes with when its writing began and
ended (goodput's lost work and checkpoint stalls: runstate.RunState.checkpoint_seen).

What counts as a checkpoint, one level down the directory (a sub-directory read with its own
sub-directories):

- a torch.save file (a zip since torch 1.6, else a pickle; a safetensors file too): a regular
  file, not hidden, not a temporary name (*.tmp, *.partial, ...; those are followed by inode,
  so that a save that writes a temporary file and renames it keeps when it began), complete
  once its size and mtime held still for CHECKPOINT_STILL_S (at once when it was renamed from
  a temporary name: the writer is done) and, for a zip, its end-of-central-directory record is
  there (a writer killed mid-save leaves a zip without it: never counted). Anything else (a
  log, a JSON file, DeepSpeed's `latest`) is not a checkpoint;
- a torch.distributed.checkpoint directory (one holding .metadata, which torch writes last,
  through a temporary name and a rename): complete once .metadata is there; a directory of
  *.distcp files without it is a save still going (or one that died);
- any other sub-directory, read with its own sub-directories (two levels below checkpoint_dir
  at most: Megatron's iter_0001000/mp_rank_00/model_optim_rng.pt, NeMo 2's
  step=...-last/weights/.metadata), on its framework's commit marker where its layout has one
  (a save goes on for minutes after its first files held still): HF Trainer's checkpoint-N/
  once trainer_state.json is in it (and its tree held still CHECKPOINT_STILL_S), DeepSpeed's
  global_stepN/ once the top-level `latest` names it, Megatron's iter_N/ once the top-level
  latest_checkpointed_iteration.txt holds N, a distributed checkpoint one level down once its
  .metadata is there (and the tree held still); with no known marker, once its whole tree held
  still for DIR_STILL_S. Either way it holds a checkpoint file and none is a zip cut short. A
  directory is recorded once: again only when its marker is rewritten (a new save into the
  same path, e.g. a latest/ overwritten by each save).

Per-rank shard files (a name holding rank<r>, r one of the world's ranks, when the world is
known, and another rank's file of the same save there: a lone lora_rank16_step100.pt or
ckpt_step100_rank0.pt is a whole save) are one save, recorded once every file of it there is
complete and it has as many as the last complete save of its name-pattern (its numbers as #)
had, however far apart they were written: the ranks that write shards (data-parallel ones
only, the master's own on node-local disk) are learned from the saves, not assumed to be the
world. At the run's end a save with fewer files than that, or with a file that never
completed (a zip cut short), is recorded as partial (with "files" and "of": no checkpoint to
resume from). On a filesystem whose clients cache attributes
(NFS, SMB: host/mounts.py reads the mount's options) a file counts once it held still longer
than that cache, and a marker-less directory longer than its listing's.

A checkpoint's ended is its newest mtime (its .metadata's); began is when its name (or its
inode under a temporary name) first appeared: the directory's mtime at the scan that first saw
it when it was the only new entry of that scan, else the scan's time. Its step comes from its
name (step_1200, epoch-3, checkpoint-500). What is there at the first look is the past
(an earlier attempt's): only a change of it counts.

Cheap: a look stats the directory and the pending candidates; a scan of the directory (one
level; a sub-directory only while it is a candidate) comes no sooner than its own measured
CPU cost / CHECKPOINT_SCAN_BUDGET after the last (the watch stays within 0.1 % of a core
however large the directory is). Bounded: the names kept (NAMES_MAX, the newest), the
candidates (CANDIDATES_MAX, the newest), a sub-directory's entries read, its own
sub-directories' included (DIR_ENTRIES_MAX).
Hostile or odd input (a directory missing, unreadable, huge; a file that never stops growing;
symlinks, which are never followed; names that are not UTF-8) is at most one sentence each;
look() never raises. Watcher runs the watch in its own thread: a look that hangs on a dead
mount never holds up the agent's loop.

Only the standard library, defaults.py and host/mounts.py: it runs inside the master's agent.
"""
from __future__ import annotations

import os
import re
import stat
import threading
import time

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.host import mounts

NAMES_MAX = 4096          # top-level names whose identity is kept (the newest by mtime)
# Checkpoints being written, followed at once (the newest): a save of 4096 per-rank shards is
# followed whole (a stat each between scans, spaced by their own cost as scans are).
CANDIDATES_MAX = NAMES_MAX
SHARD_GROUPS_MAX = 64     # saves of per-rank shards being gathered at once (the newest)
DIR_ENTRIES_MAX = 10000   # entries of one sub-directory read per look
HUGE = 10000              # a directory with more entries than this is said to be large
PATH_MAX = 200
TEMP_SUFFIXES = (".tmp", ".temp", ".partial", ".part", ".incomplete", ".swp", "~")
TAIL = 64 * 1024 + 22     # a zip's end-of-central-directory record lies within this of its end
ZIP, EOCD = b"PK\x03\x04", b"PK\x05\x06"
DIR_STILL_S = defaults.CHECKPOINT_DIR_STILL_S  # a directory of no known layout: held still
# Commit markers, written by each framework once a save is whole: HF Trainer's trainer_state.json
# inside checkpoint-N/; DeepSpeed's top-level `latest` naming the tag; Megatron's top-level
# tracker holding the iteration; torch.distributed.checkpoint's .metadata.
HF_NAME, HF_MARKER = re.compile(r"checkpoint-\d+$"), "trainer_state.json"
DS_NAME, DS_MARKER = re.compile(r"global_step\d+$"), "latest"
DS_FILE = re.compile(r"(?:mp_rank_\d+_model_states|.*zero_pp_rank_\d+.*_optim_states)\.pt$")
MEGATRON_NAME, MEGATRON_MARKER = re.compile(r"iter_\d+$"), "latest_checkpointed_iteration.txt"
MEGATRON_SUB = re.compile(r"mp_rank_\d+")
# A per-rank shard of a save (model_rank3_step100.pt, optim-rank_03.pt): its rank, the rest of
# its name the save's (every rank's shard of it alike, the rank as *).
SHARD = re.compile(r"(?<![a-z0-9])rank[_-]?(\d{1,7})(?!\d)", re.IGNORECASE)
DIGITS = re.compile(r"\d+")
STEP = re.compile(r"(?:global_step|iteration|checkpoint|epoch|step|iter|ckpt)[_=-]?(\d{1,18})",
                  re.IGNORECASE)


def step_of(name):
    """The step a checkpoint's name carries (the last match: run3/step_1200 is 1200), else
    None."""
    found = STEP.findall(name or "")
    return int(found[-1]) if found else None


def printable(name, limit=PATH_MAX):
    """A file name as text for the record: bytes that are not UTF-8 escaped (\\x80: two names
    stay two), bounded."""
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")[:limit]


def shard_keys(name, world):
    """Each way a file may be one rank's shard of a save of a world of `world` ranks: [(the
    save's name with that rank as *, the rank)], one per rank<r> in its name with r below the
    world (zero_pp_rank_3_mp_rank_00: the data-parallel rank, or the model-parallel one: its
    save's other files tell which); [] when no world is known."""
    if not world:
        return []
    out = []
    for m in SHARD.finditer(name):
        rank = int(m.group(1))
        if rank < world:
            out.append((name[:m.start(1)] + "*" + name[m.end(1):], rank))
    return out


def pattern_of(key):
    """A save's name-pattern: its name (the rank as *) with its numbers as # (the saves of one
    layout, step after step)."""
    return DIGITS.sub("#", key)


def final_name(name):
    """The name a temporary file will be renamed to, as near as its name says
    (.model_rank3.pt.tmp: model_rank3.pt)."""
    name = name.lstrip(".")
    for suffix in TEMP_SUFFIXES:
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return name


def is_temp(name):
    return name.startswith(".") or name.endswith(TEMP_SUFFIXES)


def file_verdict(path, size, head_only=False):
    """What a file that held still is: "ok" (a whole zip, a pickle, a safetensors file),
    "cut" (a zip without its end record: a writer killed mid-save) or "other" (not a
    checkpoint, or unreadable). head_only: by its first bytes alone (a zip is "ok")."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return "other"
    try:
        head = os.pread(fd, 16, 0)
        if head.startswith(ZIP):
            if head_only:
                return "ok"
            tail = os.pread(fd, TAIL, max(0, size - TAIL))
            return "ok" if EOCD in tail else "cut"
        if head[:1] == b"\x80":  # a pickle (torch.save's legacy format)
            return "ok"
        if len(head) >= 9 and head[8:9] == b"{" and (head_only or 0 < int.from_bytes(
                head[:8], "little") < size):
            return "ok"  # safetensors: its JSON header's length, then the header
        return "other"
    except OSError:
        return "other"
    finally:
        os.close(fd)


class Candidate:
    """A checkpoint being written: a file (its name, its inode under a temporary name) or a
    sub-directory."""

    __slots__ = ("name", "ino", "is_dir", "began", "ident", "still_m", "first_m", "renamed",
                 "verdict", "warned", "head", "distcp", "next_m", "checked_m")

    def __init__(self, name, ino, is_dir, began, ident, now_m):
        self.name, self.ino, self.is_dir, self.began = name, ino, is_dir, began
        self.ident, self.still_m, self.first_m = ident, now_m, now_m
        self.renamed = False  # a temporary file renamed to its final name: the writer is done
        self.verdict = None   # (ident, "cut") of a file that held still cut short
        self.warned = False
        self.head = None      # the ident whose first bytes said it may be a checkpoint
        self.distcp = None    # where a distributed checkpoint's shards are ("": in it)
        self.next_m = 0.0     # a directory's next scan (spaced by its cost, as the top's)
        self.checked_m = now_m  # the last stat that saw its ident (a file's): it counts only
        # once a stat still_s after its last change still sees it unchanged


class CheckpointWatch:
    """look(now_wall) -> (checkpoints completed since the last look, warnings), each checkpoint
    {"path", "began", "ended" (this host's wall clock), "step", "kind", "bytes"}."""

    def __init__(self, path, still_s=defaults.CHECKPOINT_STILL_S,
                 growing_warn_s=defaults.CHECKPOINT_GROWING_WARN_S,
                 budget=defaults.CHECKPOINT_SCAN_BUDGET, mono=time.monotonic,
                 cpu=time.thread_time, dir_still_s=DIR_STILL_S, world=None, mountinfo=None):
        self.path = os.path.expanduser(path)
        self.said = printable(path, 300)
        self.still_s, self.growing_warn_s, self.budget = still_s, growing_warn_s, budget
        self.mono, self.cpu = mono, cpu
        self.dir_still_s = dir_still_s
        # A network filesystem that caches attributes (NFS, SMB) shows what another host wrote
        # that late: a file counts once it held still longer than its client may show it
        # unchanged while it grows (acregmin, with close-to-open: a file is opened to be
        # stat'ed, which asks the server; acregmax without), a directory longer than its
        # listing may be cached (acdirmax).
        fstype, options = mounts.mount_of(self.path, mountinfo)
        acregmin, acregmax, acdirmax, self.cto = mounts.attribute_cache(fstype, options)
        self.fstype = fstype
        self.still_s = max(still_s, (acregmin if self.cto else acregmax) + still_s)
        self.dir_still_s = max(dir_still_s, acdirmax + self.still_s)
        self.open_stat = fstype in mounts.ATTRIBUTE_CACHED and self.cto
        # Per-rank shard files (model_rank{r}_step100.pt, r below the world, another rank's
        # file of the save there) are one save, recorded once every file of it there is
        # complete and it has as many as its name-pattern's last complete save; at the run's
        # end one short of that is recorded as partial (no checkpoint to resume from). world:
        # the run's ranks (nnodes x nproc_per_node), None: each file its own checkpoint.
        self.world = world if isinstance(world, int) and world > 0 else None
        self.shards = {}      # save's name (rank as *) -> {rank: (began, ended, bytes)}
        self.shards_m = {}    # -> when its first shard completed (monotonic)
        self.name_keys = {}   # a file's name at the last scan -> its shard_keys' keys
        self.siblings = {}    # a save's name (rank as *) -> its files at the last scan
        self.expect = {}      # a name-pattern -> the files of its last complete save
        self.next_restat_m = 0.0
        # A directory recorded -> its commit marker then: recorded once, again only on a new
        # marker (a new save into the same path).
        self.recorded = {}
        self.known = {}       # name -> (ino, size, mtime_ns, is_dir) at the last scan
        self.floor_ns = -1    # names older than this were let go (NAMES_MAX): not new
        self.cands = {}       # name -> Candidate
        self.baseline = None  # True once a first scan found the directory there
        self.dir_mtime = None
        self.next_scan_m = 0.0
        self.warned = set()
        self.missing_m = None  # since when the directory is missing
        self.final = False
        self.looks = self.scans = 0
        # The last look could not read the directory (missing, unreadable, not one): what was
        # lost since a checkpoint is then unknown, not all of the training (goodput).
        self.blind = self._sees = False
        self.cpu_s = 0.0      # this watch's CPU time, all looks (the bench's figure)
        self.last_scan_cpu_s = 0.0

    # -- the look -----------------------------------------------------------------------------

    def look(self, now_wall, final=False):
        """final: the run is over (every torchrun ended, so no save is still being written):
        a scan whatever its cost, and what is pending counts without waiting for it to hold
        still (a save at the run's last step); a directory that never appeared is said."""
        began_cpu = self.cpu()
        found, warnings = [], []
        self.final = final
        self._sees = False  # this look read the directory (blind is set once, at the end:
        try:                # the agent's thread reads it)
            self._look(now_wall, found, warnings)
        except Exception as exc:  # never out of the agent's loop: one sentence instead
            self._sees = False
            self._warn(warnings, "error", "checkpoint_dir %s could not be watched (%s: %s); "
                       "checkpoints are not recorded" % (self.said, type(exc).__name__, exc))
        self.blind = not self._sees
        self.looks += 1
        self.cpu_s += max(0.0, self.cpu() - began_cpu)
        return found, warnings

    def _warn(self, warnings, key, text):
        if key not in self.warned:
            self.warned.add(key)
            warnings.append(text[:300])

    def _look(self, now_wall, found, warnings):
        now_m = self.mono()
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            # (A script may make it at its first save: said only if it stays missing.)
            self.missing_m = now_m if self.missing_m is None else self.missing_m
            if self.final or now_m - self.missing_m >= defaults.CHECKPOINT_MISSING_WARN_S:
                self._warn(warnings, "missing", "checkpoint_dir %s does not exist%s: set "
                           "checkpoint_dir to where the script saves its checkpoints" % (
                               self.said, "" if self.final else " (yet; it is watched until "
                               "it does)"))
            if self.baseline is None:
                self.baseline = False  # everything found once it exists is new
            return
        except OSError as exc:
            self._warn(warnings, "stat", "checkpoint_dir %s cannot be read (%s): give the "
                       "run's user read access to it" % (self.said, exc.strerror or exc))
            return
        if not stat.S_ISDIR(st.st_mode):
            self._warn(warnings, "notdir", "checkpoint_dir %s is not a directory: set "
                       "checkpoint_dir to the directory the script saves into" % self.said)
            return
        self._sees = True
        if now_m >= self.next_scan_m or self.final:
            began = self.cpu()
            self._scan(now_wall, now_m, st, warnings)
            self.last_scan_cpu_s = max(0.0, self.cpu() - began)
            self.scans += 1
            self.next_scan_m = now_m + self.last_scan_cpu_s / self.budget
        else:
            self._restat(now_m)
        self._complete(now_wall, now_m, found, warnings)

    def _scan(self, now_wall, now_m, st, warnings):
        """Every entry of the directory, one level: new and changed names become candidates."""
        try:
            it = os.scandir(self.path)
        except OSError as exc:
            why = exc.strerror or exc
            self._sees = False
            self._warn(warnings, "scan", "checkpoint_dir %s cannot be listed (%s): give the "
                       "run's user read and execute access to it" % (self.said, why))
            return
        first = self.baseline is None
        seen, new, count = {}, [], 0
        with it:
            for e in it:
                count += 1
                try:
                    if e.is_symlink():
                        continue  # never followed
                    s = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                is_dir = stat.S_ISDIR(s.st_mode)
                if not is_dir and not stat.S_ISREG(s.st_mode):
                    continue
                ident = (s.st_ino, 0 if is_dir else s.st_size, s.st_mtime_ns, is_dir)
                name = e.name
                if name not in self.known and name not in self.cands and \
                        s.st_mtime_ns <= self.floor_ns:
                    continue  # let go as old (NAMES_MAX)
                seen[name] = ident
                if first or self.known.get(name) == ident:
                    continue
                new.append((name, ident, name not in self.known))
        if count > HUGE:
            self._warn(warnings, "huge", "checkpoint_dir %s holds %d entries: it is scanned "
                       "only as often as 0.1 %% of a core allows; keep each run's checkpoints "
                       "in a directory of their own" % (self.said, count))
        self.baseline = True
        # began: the directory's mtime when this scan saw exactly one new name (its creation),
        # else the scan's time.
        fresh = [n for n, _i, is_new in new if is_new]
        dir_time = st.st_mtime if len(fresh) == 1 and st.st_mtime_ns != self.dir_mtime \
            else now_wall
        self.dir_mtime = st.st_mtime_ns
        by_ino = {c.ino: c for c in self.cands.values() if not c.is_dir}
        for name, ident, is_new in new:
            when = min(dir_time if is_new else now_wall, now_wall)
            c = self.cands.get(name)
            if c is not None and c.ino == ident[0] and c.is_dir == ident[3]:
                if not c.is_dir and c.ident != ident:  # (a directory's: _dir_done)
                    c.ident, c.still_m = ident, now_m
                continue
            moved = by_ino.get(ident[0]) if not ident[3] else None
            if moved is not None and moved.name != name and not is_temp(name):
                # A temporary file renamed to its final name: the save began when it appeared.
                self.cands.pop(moved.name, None)
                moved.name, moved.ident, moved.renamed = name, ident, is_temp(moved.name) or \
                    moved.renamed
                moved.still_m = now_m
                self.cands[name] = moved
                continue
            self.cands[name] = Candidate(name, ident[0], ident[3], when, ident, now_m)
        # Gone (deleted, or renamed away and seen under its new name above); the others were
        # stat'ed now.
        for name in [n for n in self.cands if n not in seen]:
            del self.cands[name]
        for name, c in self.cands.items():
            if not c.is_dir:
                if c.ident != seen[name]:
                    c.ident, c.still_m = seen[name], now_m
                c.checked_m = now_m
        if len(self.cands) > CANDIDATES_MAX:
            keep = sorted(self.cands, key=lambda n: self.cands[n].ident[2])[-CANDIDATES_MAX:]
            self.cands = {n: self.cands[n] for n in keep}
        if len(seen) > NAMES_MAX:
            ordered = sorted(seen, key=lambda n: seen[n][2])
            self.floor_ns = max(self.floor_ns, seen[ordered[-NAMES_MAX - 1]][2])
            seen = {n: seen[n] for n in ordered[-NAMES_MAX:]}
        self.known = seen
        if self.world:
            self._index(seen)
        if len(self.recorded) > len(seen):
            self.recorded = {n: m for n, m in self.recorded.items() if n in seen}

    def _index(self, seen):
        """The saves' files by their name with a rank as * (a name's keys kept while it is
        there: a regex once a name)."""
        keys, siblings = {}, {}
        for name, ident in seen.items():
            if ident[3]:
                continue
            k = self.name_keys.get(name)
            if k is None:
                k = [key for key, _r in shard_keys(printable(final_name(name)), self.world)]
            keys[name] = k
            for key in k:
                siblings[key] = siblings.get(key, 0) + 1
        self.name_keys, self.siblings = keys, siblings

    def _shard(self, name):
        """(the save's name with the rank as *, the rank) of a file that is one rank's shard of
        a save: one of its ranks' saves has another file there (of its rank<r>, the one its
        save's files differ by); None for a file that is a whole save (rank 0's alone, a LoRA's
        lora_rank16)."""
        best = None
        for key, rank in shard_keys(name, self.world):
            n = max(self.siblings.get(key, 0), 2 if key in self.shards else 0)
            if n >= 2 and (best is None or n > best[0]):
                best = n, key, rank
        return None if best is None else best[1:]

    def _stat(self, path):
        """A file's stat; on NFS with close-to-open through an open file, which asks the
        server, not the attribute cache."""
        if not self.open_stat:
            return os.stat(path, follow_symlinks=False)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def _restat(self, now_m):
        """Between scans, the pending candidates alone (a stat each), no sooner than their own
        cost / budget after the last (4096 shards being written cost as a scan does); those
        whose hold has run out since their last stat are stat'ed at every look whatever the
        pacing (a file counts only on a stat that still sees it unchanged, never on time
        alone: a file still growing would count, and again at each scan)."""
        paced = now_m < self.next_restat_m
        began = self.cpu()
        for name, c in list(self.cands.items()):
            if c.is_dir:
                continue  # (_dir_done reads it)
            if paced and not (now_m - c.still_m >= self.still_s > c.checked_m - c.still_m):
                continue
            try:
                s = self._stat(os.path.join(self.path, name))
            except OSError:
                del self.cands[name]
                continue
            ident = (s.st_ino, 0 if c.is_dir else s.st_size, s.st_mtime_ns, c.is_dir)
            if ident != c.ident:
                c.ident, c.still_m = ident, now_m
                self.known[name] = ident
            c.checked_m = now_m
        if not paced:
            self.next_restat_m = now_m + max(0.0, self.cpu() - began) / self.budget

    # -- completion ---------------------------------------------------------------------------

    def _complete(self, now_wall, now_m, found, warnings):
        for name, c in list(self.cands.items()):
            if is_temp(name):
                continue  # counted, if ever, under the name it is renamed to
            done = self._dir_done(c, now_m) if c.is_dir else self._file_done(c, now_m, warnings)
            if done is None:
                if not c.warned and now_m - c.first_m > self.growing_warn_s:
                    c.warned = True
                    self._warn(warnings, "growing", "%s in checkpoint_dir %s has not completed "
                               "in %.0f s (still written, or its save died): not counted until "
                               "it does; save each checkpoint to a name of its own" % (
                                   printable(name, 100), self.said, now_m - c.first_m))
                continue
            del self.cands[name]
            if done is False:
                continue
            kind, ended, size = done
            shard = self._shard(printable(name)) if kind == "file" and self.world else None
            if shard is not None:
                self._shard_done(shard, min(c.began, ended), ended, size, now_m, found)
                continue
            found.append({"path": printable(name), "began": round(min(c.began, ended), 3),
                          "ended": round(ended, 3), "step": step_of(printable(name)),
                          "kind": kind, "bytes": size})
        self._shards_pending(now_m, found, warnings)

    def _shard_done(self, shard, began, ended, size, now_m, found):
        """A per-rank shard complete: its save is recorded once all of it is
        (_shards_pending)."""
        key, rank = shard
        group = self.shards.setdefault(key, {})
        self.shards_m.setdefault(key, now_m)
        group[rank] = (began, ended, size)
        if len(self.shards) > SHARD_GROUPS_MAX:
            oldest = min(self.shards_m, key=self.shards_m.get)
            del self.shards[oldest], self.shards_m[oldest]

    def _shard_entry(self, key, group, partial=False, of=None):
        entry = {"path": key, "began": round(min(g[0] for g in group.values()), 3),
                 "ended": round(max(g[1] for g in group.values()), 3), "step": step_of(key),
                 "kind": "file", "bytes": sum(g[2] for g in group.values()),
                 "files": len(group)}
        if partial:
            entry.update(partial=True, of=of)
        return entry

    def _shards_pending(self, now_m, found, warnings):
        """The saves whose shards are being gathered: one is whole once no file of it is still
        being written (a zip cut short never is) and it has as many files as the last complete
        save of its name-pattern (none known: the files there, which the next save of the
        pattern then needs: the ranks that write shards are learned, not assumed to be the
        world's); said once when it lasts; at the run's end (no save is being written any more)
        one short of that is recorded as partial."""
        if not self.shards:
            return
        pending = {}  # a save's files not complete yet
        for name, c in self.cands.items():
            if not c.is_dir:
                for key in self.name_keys.get(name, ()):
                    if key in self.shards:
                        pending[key] = pending.get(key, 0) + 1
        for key in list(self.shards):
            group, pattern = self.shards[key], pattern_of(key)
            want = self.expect.get(pattern, 0)
            if not pending.get(key) and len(group) >= want:
                found.append(self._shard_entry(key, group))
                del self.shards[key], self.shards_m[key]
                self.expect.pop(pattern, None)  # (the newest patterns kept)
                self.expect[pattern] = len(group)
                if len(self.expect) > SHARD_GROUPS_MAX:
                    del self.expect[next(iter(self.expect))]
            elif self.final:
                found.append(self._shard_entry(key, group, partial=True, of=max(
                    want, len(group) + pending.get(key, 0))))
                del self.shards[key], self.shards_m[key]
            elif now_m - self.shards_m[key] > self.growing_warn_s:
                self._warn(warnings, "shards:" + key, "%s in checkpoint_dir %s: %d of %d "
                           "shards in %.0f s; the save counts once all of them are there" % (
                               printable(key, 100), self.said, len(group),
                               max(want, len(group) + pending.get(key, 0)),
                               now_m - self.shards_m[key]))

    def _file_done(self, c, now_m, warnings):
        """("file", ended, bytes) once complete; False when it is no checkpoint (a log, a
        JSON file: told by its first bytes, at once); else None."""
        path = os.path.join(self.path, c.name)
        if c.ident[1] >= 16 and c.head != c.ident:
            if file_verdict(path, 0, head_only=True) == "other":
                return False
            c.head = c.ident
        if not (c.renamed or self.final) and c.checked_m - c.still_m < self.still_s:
            return None  # not yet seen unchanged by a stat still_s after its last change
        if c.verdict is not None and c.verdict[0] == c.ident:
            return None  # a zip cut short, unchanged: never counted
        ino, size, mtime_ns, _d = c.ident
        verdict = file_verdict(path, size)
        if verdict == "cut":
            c.verdict = (c.ident, verdict)
            if now_m - c.still_m >= self.still_s:
                self._warn(warnings, "cut", "%s in checkpoint_dir %s is a zip cut short (a "
                           "save that died): not counted" % (printable(c.name, 100), self.said))
            return None
        if verdict != "ok":
            return False
        return "file", mtime_ns / 1e9, size

    def _pointer(self, name):
        """A framework's top-level pointer file (DeepSpeed's latest, Megatron's tracker): (its
        text, (inode, mtime)), else None."""
        try:
            fd = os.open(os.path.join(self.path, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            s = os.fstat(fd)
            if not stat.S_ISREG(s.st_mode):
                return None
            return os.pread(fd, 256, 0).decode("utf-8", "replace").strip(), (s.st_ino, s.st_mtime_ns)
        except OSError:
            return None
        finally:
            os.close(fd)

    def _tree(self, path):
        """The directory and its sub-directories (depth 2 below checkpoint_dir at most),
        DIR_ENTRIES_MAX entries in all: (files [(name, size, mtime_ns, ino)], sub-directory
        names, newest mtime_ns, bytes, where shards of a distributed checkpoint are), None when
        it cannot be read."""
        files, subs, newest, total, distcp, read = [], [], 0, 0, None, 0
        queue = [""]  # the directory, then its sub-directories (found while reading it)
        while queue:
            rel = queue.pop(0)
            if read >= DIR_ENTRIES_MAX:
                break
            try:
                with os.scandir(os.path.join(path, rel) if rel else path) as it:
                    for e in it:
                        read += 1
                        if read > DIR_ENTRIES_MAX:
                            break
                        if e.is_symlink():
                            continue
                        try:
                            s = e.stat(follow_symlinks=False)
                        except OSError:
                            continue
                        newest = max(newest, s.st_mtime_ns)
                        if stat.S_ISDIR(s.st_mode):
                            if not rel:
                                queue.append(e.name)
                                subs.append(e.name)
                            continue
                        if not stat.S_ISREG(s.st_mode):
                            continue
                        total += s.st_size
                        if distcp is None and e.name.endswith(".distcp"):
                            distcp = rel
                        files.append((os.path.join(rel, e.name) if rel else e.name, s.st_size,
                                      s.st_mtime_ns, s.st_ino))
            except OSError:
                if not rel:
                    return None
        return files, subs, newest, total, distcp

    @staticmethod
    def _metadata(path):
        """A distributed checkpoint's .metadata read directly: (name, size, mtime_ns, ino), or
        None. The tree's read stops at DIR_ENTRIES_MAX entries in no set order, so with more
        shards than that its .metadata may be among those left unread."""
        try:
            s = os.lstat(os.path.join(path, ".metadata"))
        except OSError:
            return None
        if not stat.S_ISREG(s.st_mode):
            return None
        return ".metadata", s.st_size, s.st_mtime_ns, s.st_ino

    def _dir_done(self, c, now_m):
        """("dcp" | "dir", ended, bytes) once complete; False when it holds no checkpoint (or
        one already recorded); None while it is written. Complete on its framework's commit
        marker where its layout has one (HF, DeepSpeed, Megatron, a distributed checkpoint in
        it or one level down), else once its tree held still for dir_still_s."""
        path = os.path.join(self.path, c.name)
        if not self.final:
            # A distributed checkpoint's shards are there: one stat a look until its .metadata
            # is; any other directory is scanned no more often than its cost allows.
            if c.distcp is not None and not os.path.lexists(
                    os.path.join(path, c.distcp, ".metadata")) or now_m < c.next_m:
                return None
        began = self.cpu()
        tree = self._tree(path)
        c.next_m = now_m + max(0.0, self.cpu() - began) / self.budget
        if tree is None:
            return None
        files, subs, newest, total, c.distcp = tree
        by_name = {f[0]: f for f in files}
        meta = by_name.get(".metadata") or self._metadata(path)
        sub_meta = [by_name[n] for n in (os.path.join(d, ".metadata") for d in subs) if n in by_name]
        kind, hold, ended, marker = "dir", self.still_s, None, None
        if meta is not None:  # torch wrote it last: at once
            kind, hold, ended, marker = "dcp", 0.0, meta[2] / 1e9, (meta[3], meta[2])
        elif HF_MARKER in by_name:
            marker = by_name[HF_MARKER][3], by_name[HF_MARKER][2]
        elif sub_meta:  # NeMo 2: a distributed checkpoint in weights/, context/ beside it
            kind, marker = "dcp", max((m[3], m[2]) for m in sub_meta)
        elif HF_NAME.match(c.name):
            pass  # HF's: its marker awaited
        elif DS_NAME.match(c.name) or any(DS_FILE.match(f[0]) for f in files):
            pointer = self._pointer(DS_MARKER)
            if pointer is not None and pointer[0] == c.name:
                hold, ended, marker = 0.0, pointer[1][1] / 1e9, pointer[1]
        elif MEGATRON_NAME.match(c.name) or any(MEGATRON_SUB.match(d) for d in subs):
            pointer = self._pointer(MEGATRON_MARKER)
            step = step_of(c.name)
            if pointer is not None and pointer[0].isdigit() and step is not None and \
                    int(pointer[0]) == step:
                hold, ended, marker = 0.0, pointer[1][1] / 1e9, pointer[1]
        else:
            hold, marker = self.dir_still_s, ("dir", c.ino)
        if c.name in self.recorded and (marker is None or self.recorded[c.name] == marker):
            return False  # recorded once already; a new save into it rewrites its marker
        if marker is None:
            return None  # its framework's marker is not there yet: a save still going
        if kind == "dir" and (not files or c.distcp is not None):
            return None  # a distributed checkpoint still being written; nothing yet
        ident = (c.ino, total, newest, True, len(files))
        if ident != c.ident and not self.final:
            c.ident, c.still_m = ident, now_m
            if hold:
                return None
        if now_m - c.still_m < hold and not self.final:
            return None
        if kind == "dir":
            # A checkpoint holds one (a model's weights, an optimizer's state); a directory of
            # logs or events does not.
            verdicts = [file_verdict(os.path.join(path, f[0]), f[1]) for f in files[:64]]
            if "cut" in verdicts:
                return None
            if "ok" not in verdicts:
                return False
        self.recorded[c.name] = marker
        return kind, newest / 1e9 if ended is None else ended, total


class Watcher:
    """The watch in a daemon thread of its own, looking each CHECKPOINT_LOOK_S: a look that
    blocks (a dead NFS mount) never holds up the agent's loop; one that has not come back for
    CHECKPOINT_HUNG_WARN_S is said once. take() hands over what it found, on this host's wall
    clock."""

    def __init__(self, path, look_s=defaults.CHECKPOINT_LOOK_S, wall=time.time,
                 mono=time.monotonic, start=True, world=None, watch=None):
        self.watch = watch or CheckpointWatch(path, world=world)
        self.slowest_s = 0.0  # the longest look so far (wall clock): the final one's wait
        self.look_s, self.wall, self.mono = look_s, wall, mono
        self.lock = threading.Lock()
        self.found, self.warnings = [], []
        self.last_m = mono()
        self.hung_said = False
        self.stopped = threading.Event()
        self.last_done = threading.Event()  # the final look (finish()) has been made
        self.thread = threading.Thread(target=self._run, name="torchfleet-ckptwatch",
                                       daemon=True)
        if start:
            self.thread.start()

    def _run(self):
        while True:
            final = self.stopped.wait(self.look_s)
            began = self.mono()
            found, warnings = self.watch.look(self.wall(), final=final)
            with self.lock:
                self.slowest_s = max(self.slowest_s, self.mono() - began)
                self.found.extend(found)
                del self.found[:-CANDIDATES_MAX]
                self.warnings.extend(warnings)
                self.last_m = self.mono()
            if final:
                self.last_done.set()
                return

    def take(self):
        """(checkpoints, warnings) found since the last take."""
        with self.lock:
            found, warnings = self.found, self.warnings
            self.found, self.warnings = [], []
            stuck = self.mono() - self.last_m
        if stuck > defaults.CHECKPOINT_HUNG_WARN_S and not self.hung_said:
            self.hung_said = True
            warnings.append("checkpoint_dir %s has not answered for %.0f s (a hung mount?): "
                            "checkpoints are not recorded while it does not; the run goes on"
                            % (self.watch.said, stuck))
        return found, warnings

    def finish(self, wait_s=defaults.CHECKPOINT_FINAL_WAIT_S,
               most_s=defaults.CHECKPOINT_FINAL_WAIT_MAX_S):
        """The run is over: one final look (what is pending counts at once, a directory that
        never appeared is said), awaited wait_s and as long again as two of the slowest looks
        so far (a look under way comes first, and a long Lustre or NFS scan is what the final
        one will be), at most most_s; when it does not come, a sentence says a save at the
        very end may be missing. Then the thread ends."""
        self.stopped.set()
        with self.lock:
            wait = min(most_s, wait_s + 2 * self.slowest_s)
        if not self.last_done.wait(wait):
            with self.lock:
                self.warnings.append(
                    "checkpoint_dir %s: the final look did not finish in %.0f s (a slow "
                    "filesystem): a save at the very end may be missing" % (self.watch.said, wait))

    def close(self):
        self.stopped.set()
