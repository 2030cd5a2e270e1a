"""The checkpoint watch (ckptwatch.py): checkpoints seen from outside, on real torch.save
files and a real torch.distributed.checkpoint save, and on hostile or odd directories.

The watch's monotonic clock is the test's (each look says when it happens); the files' times
are the file system's own."""
from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import ckptwatch
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.ckptwatch import CheckpointWatch, Watcher, step_of
from tests.conftest import examples

torch = pytest.importorskip("torch")


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def watch(path, **kw):
    clock = Clock()
    return CheckpointWatch(str(path), mono=clock, **kw), clock


def look(w, clock, at):
    clock.t = at
    return w.look(time.time())


def save(path, n=1000):
    torch.save({"step": 1, "w": torch.arange(n, dtype=torch.float32)}, str(path))


def test_a_torch_save_file_is_recorded_once_it_held_still_with_its_step_and_times(tmp_path):
    w, clock = watch(tmp_path)
    assert look(w, clock, 100.0) == ([], [])  # an empty directory: the past is nothing
    save(tmp_path / "step_1200.pt")
    dir_mtime = os.stat(tmp_path).st_mtime
    found, _ = look(w, clock, 101.0)
    assert found == []  # not held still for CHECKPOINT_STILL_S yet
    found, warnings = look(w, clock, 101.0 + defaults.CHECKPOINT_STILL_S)
    st = os.stat(tmp_path / "step_1200.pt")
    assert warnings == []
    assert found == [{"path": "step_1200.pt", "began": round(min(dir_mtime, st.st_mtime), 3),
                      "ended": round(st.st_mtime, 3), "step": 1200, "kind": "file",
                      "bytes": st.st_size}]
    assert look(w, clock, 110.0) == ([], [])  # once


def test_a_save_to_a_temporary_name_then_renamed_keeps_when_it_began(tmp_path):
    """As the built-in workload saves (last.pt.tmp, then os.replace over last.pt): the last
    attempt's last.pt is the past; the new one began when its temporary file appeared and is
    complete as soon as it is renamed."""
    save(tmp_path / "last.pt")
    w, clock = watch(tmp_path)
    look(w, clock, 100.0)
    (tmp_path / "last.pt.tmp").write_bytes(b"PK\x03\x04")  # the save begins
    appeared = os.stat(tmp_path).st_mtime
    assert look(w, clock, 101.0) == ([], [])
    time.sleep(0.05)
    save(tmp_path / "last.pt.tmp", 5000)
    os.replace(tmp_path / "last.pt.tmp", tmp_path / "last.pt")
    found, _ = look(w, clock, 101.5)  # renamed: the writer is done, no wait
    assert [(c["path"], c["began"], c["step"]) for c in found] == [
        ("last.pt", round(appeared, 3), None)]
    assert found[0]["ended"] >= found[0]["began"] + 0.04


def test_a_save_cut_short_is_never_counted_however_long_it_holds_still(tmp_path):
    save(tmp_path / "whole.pt", 50000)
    data = (tmp_path / "whole.pt").read_bytes()
    w, clock = watch(tmp_path)
    look(w, clock, 100.0)
    (tmp_path / "epoch-3.pt").write_bytes(data[:len(data) // 2])  # a writer killed mid-save
    said = []
    for t in range(101, 200, 3):
        found, warnings = look(w, clock, float(t))
        assert found == []
        said += warnings
    assert len(said) == 1 and "epoch-3.pt" in said[0] and "cut short" in said[0] and \
        str(tmp_path) in said[0]
    # Written whole later under the same name: counted.
    (tmp_path / "epoch-3.pt").write_bytes(data)
    look(w, clock, 201.0)
    found, _ = look(w, clock, 204.0)
    assert [(c["path"], c["step"], c["bytes"]) for c in found] == [("epoch-3.pt", 3, len(data))]


def test_a_distributed_checkpoint_is_complete_once_its_metadata_is_written(tmp_path):
    import torch.distributed.checkpoint as dcp

    w, clock = watch(tmp_path)
    look(w, clock, 100.0)
    target = tmp_path / "step_200"
    dcp.save({"w": torch.zeros(64), "b": torch.ones(8)}, checkpoint_id=str(target))
    meta = target / ".metadata"
    kept = meta.read_bytes()
    meta.unlink()  # as it is while the ranks still write their shards
    assert look(w, clock, 101.0)[0] == [] and look(w, clock, 200.0)[0] == []
    meta.write_bytes(kept)
    found, _ = look(w, clock, 200.5)  # no stillness awaited: .metadata is written last
    total = sum(os.stat(target / n).st_size for n in os.listdir(target))
    assert found == [{"path": "step_200", "began": found[0]["began"],
                      "ended": round(os.stat(meta).st_mtime, 3), "step": 200, "kind": "dcp",
                      "bytes": total}]
    assert found[0]["began"] <= found[0]["ended"]


def test_a_distributed_checkpoints_many_shards_are_read_once_while_they_are_written(tmp_path,
                                                                                  monkeypatch):
    """1,000 ranks' shards: while .metadata is not there, a look stats it alone (a listing of
    the shards each second would cost more than the watch may); once it is, one listing sums
    the bytes."""
    w, clock = watch(tmp_path)
    look(w, clock, 100.0)
    shards = tmp_path / "global_step7"
    shards.mkdir()
    for i in range(1000):
        (shards / ("__%d_0.distcp" % i)).write_bytes(b"x" * 10)
    listed = []
    real = os.scandir

    def counting(path="."):
        listed.append(str(path))
        return real(path)
    monkeypatch.setattr(ckptwatch.os, "scandir", counting)
    for t in range(101, 131):
        assert look(w, clock, float(t))[0] == []
    assert listed.count(str(shards)) == 1, listed
    (shards / ".metadata").write_bytes(b"m" * 5)
    found, _ = look(w, clock, 131.0)
    assert [(c["path"], c["kind"], c["step"], c["bytes"]) for c in found] == [
        ("global_step7", "dcp", 7, 10005)]
    assert listed.count(str(shards)) == 2


def test_an_hf_style_directory_counts_once_its_files_held_still_a_log_directory_never(tmp_path):
    w, clock = watch(tmp_path)
    look(w, clock, 100.0)
    ck, runs = tmp_path / "checkpoint-500", tmp_path / "runs"
    ck.mkdir()
    runs.mkdir()
    save(ck / "pytorch_model.bin")
    (ck / "trainer_state.json").write_text("{}")
    (runs / "events.out.tfevents").write_bytes(b"\x18\x00\x00\x00 not a checkpoint")
    (tmp_path / "train.log").write_text("step 1 loss 2.0\n" * 10)
    (tmp_path / "latest").write_text("global_step500")  # DeepSpeed's pointer, not one
    look(w, clock, 101.0)
    found, warnings = look(w, clock, 101.0 + defaults.CHECKPOINT_STILL_S)
    assert [(c["path"], c["kind"], c["step"]) for c in found] == [("checkpoint-500", "dir", 500)]
    for t in range(104, 800, 50):  # the log keeps growing: no checkpoint, no warning
        with open(tmp_path / "train.log", "a") as f:
            f.write("more\n")
        found, more = look(w, clock, float(t))
        assert found == [] and more == []
    assert warnings == []


def test_hfs_two_phase_save_counts_once_on_trainer_state_not_when_the_model_held_still(
        tmp_path):
    """HF Trainer writes the model, gathers the optimizer's state for minutes, then writes
    optimizer.pt and trainer_state.json (its commit), and rng state after: one checkpoint,
    counted on trainer_state.json, never twice."""
    w, clock = watch(tmp_path)
    look(w, clock, 100.0)
    ck = tmp_path / "checkpoint-500"
    ck.mkdir()
    save(ck / "pytorch_model.bin")
    for t in (101.0, 110.0, 125.0, 130.0):  # the model held still for 29 s: not yet
        assert look(w, clock, t) == ([], [])
    save(ck / "optimizer.pt", 4000)  # 30 s later by the watch's clock
    assert look(w, clock, 131.0) == ([], [])
    assert look(w, clock, 140.0) == ([], [])
    (ck / "trainer_state.json").write_text('{"global_step": 500}')
    found = look(w, clock, 141.0)[0] + look(w, clock, 141.0 + defaults.CHECKPOINT_STILL_S)[0]
    assert [(c["path"], c["kind"], c["step"]) for c in found] == [("checkpoint-500", "dir", 500)]
    assert found[0]["bytes"] == sum(os.stat(ck / n).st_size for n in os.listdir(ck))
    save(ck / "rng_state.pth", 10)  # written after its commit: the same checkpoint
    for t in range(150, 300, 10):
        assert look(w, clock, float(t)) == ([], [])


def test_deepspeeds_tag_counts_once_latest_names_it(tmp_path):
    w, clock = watch(tmp_path)
    (tmp_path / "latest").write_text("global_step50")  # an earlier save's
    look(w, clock, 100.0)
    tag = tmp_path / "global_step100"
    tag.mkdir()
    save(tag / "mp_rank_00_model_states.pt")
    for t in (101.0, 105.0):
        assert look(w, clock, t) == ([], [])
    save(tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt", 3000)
    for t in range(106, 200, 10):  # the ZeRO shards held still: still no `latest` naming it
        assert look(w, clock, float(t)) == ([], [])
    (tmp_path / "latest").write_text("global_step100")
    found = look(w, clock, 200.5)[0]
    assert [(c["path"], c["kind"], c["step"], c["ended"]) for c in found] == [
        ("global_step100", "dir", 100, round(os.stat(tmp_path / "latest").st_mtime, 3))]
    assert look(w, clock, 230.0) == ([], [])


def test_megatrons_iteration_two_levels_down_counts_on_its_tracker(tmp_path):
    """Megatron's legacy layout: iter_0001000/mp_rank_00/model_optim_rng.pt, then the top-level
    latest_checkpointed_iteration.txt naming 1000 once every rank saved."""
    w, clock = watch(tmp_path)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("500")
    look(w, clock, 100.0)
    it = tmp_path / "iter_0001000"
    for rank in ("mp_rank_00", "mp_rank_01"):
        (it / rank).mkdir(parents=True)
        save(it / rank / "model_optim_rng.pt", 2000)
    for t in range(101, 200, 10):
        assert look(w, clock, float(t)) == ([], [])
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("1000")
    found = look(w, clock, 200.5)[0]
    assert [(c["path"], c["kind"], c["step"]) for c in found] == [("iter_0001000", "dir", 1000)]
    assert found[0]["bytes"] == 2 * os.stat(it / "mp_rank_00" / "model_optim_rng.pt").st_size


def test_nemos_distributed_checkpoint_one_level_down_counts_once_its_metadata_is_there(tmp_path):
    import torch.distributed.checkpoint as dcp

    w, clock = watch(tmp_path)
    look(w, clock, 100.0)
    ck = tmp_path / "model--step=99-consumed_samples=1600.0-last"
    (ck / "context").mkdir(parents=True)
    (ck / "context" / "io.json").write_text("{}")
    dcp.save({"w": torch.zeros(64), "b": torch.ones(8)}, checkpoint_id=str(ck / "weights"))
    meta = ck / "weights" / ".metadata"
    kept = meta.read_bytes()
    meta.unlink()  # as it is while the ranks still write their shards
    for t in range(101, 200, 10):
        assert look(w, clock, float(t)) == ([], [])
    meta.write_bytes(kept)
    found = look(w, clock, 200.5)[0] + look(w, clock, 200.5 + defaults.CHECKPOINT_STILL_S)[0]
    assert [(c["path"], c["kind"], c["step"]) for c in found] == [(ck.name, "dcp", 99)]


def test_a_directory_without_a_known_marker_counts_only_once_it_held_still_long_and_once(
        tmp_path):
    w, clock = watch(tmp_path)
    look(w, clock, 100.0)
    ck = tmp_path / "run7_save"
    ck.mkdir()
    save(ck / "model.pt")
    for t in (101.0, 101.0 + defaults.CHECKPOINT_STILL_S, 110.0, 130.0):
        assert look(w, clock, t) == ([], [])  # not before DIR_STILL_S: it may not be done
    assert ckptwatch.DIR_STILL_S >= 30.0
    found = look(w, clock, 101.0 + ckptwatch.DIR_STILL_S)[0]
    assert [(c["path"], c["kind"]) for c in found] == [("run7_save", "dir")]
    save(ck / "optim.pt")  # changed again: not a second checkpoint
    for t in range(140, 300, 10):
        assert look(w, clock, float(t)) == ([], [])


def test_a_new_save_into_the_same_directory_is_a_new_checkpoint(tmp_path):
    """A `latest/` distributed checkpoint overwritten by each save: its .metadata rewritten."""
    import torch.distributed.checkpoint as dcp

    w, clock = watch(tmp_path)
    look(w, clock, 100.0)
    dcp.save({"w": torch.zeros(64)}, checkpoint_id=str(tmp_path / "latest"))
    assert [c["path"] for c in look(w, clock, 101.0)[0]] == ["latest"]
    assert look(w, clock, 110.0) == ([], [])
    time.sleep(0.01)
    dcp.save({"w": torch.ones(64)}, checkpoint_id=str(tmp_path / "latest"))
    found = look(w, clock, 111.0)[0] + look(w, clock, 120.0)[0]
    assert [c["path"] for c in found] == ["latest"]


def test_what_was_there_at_the_first_look_is_the_past_unless_the_directory_came_later(tmp_path):
    save(tmp_path / "step_1.pt")
    w, clock = watch(tmp_path)
    assert look(w, clock, 100.0) == ([], [])
    assert look(w, clock, 110.0) == ([], [])
    later = tmp_path / "later"
    w2, clock2 = watch(later)
    # A script may make it at its first save: said only once it stayed missing.
    assert look(w2, clock2, 100.0) == ([], [])
    found, warnings = look(w2, clock2, 100.0 + defaults.CHECKPOINT_MISSING_WARN_S)
    assert found == [] and len(warnings) == 1 and "does not exist (yet" in warnings[0] and \
        str(later) in warnings[0]
    assert look(w2, clock2, 500.0) == ([], [])  # said once
    assert w2.blind  # (goodput: lost work unknown, not all of it)
    later.mkdir()
    save(later / "step_2.pt")
    look(w2, clock2, 502.0)
    assert not w2.blind and not w.blind
    assert [c["path"] for c in look(w2, clock2, 505.0)[0]] == ["step_2.pt"]


def test_the_final_look_counts_a_save_at_the_runs_last_step_and_says_a_directory_never_made(
        tmp_path):
    """The run is over (every torchrun ended): what is pending counts without waiting for it
    to hold still; a zip cut short still never does."""
    save(tmp_path / "whole.pt", 50000)
    data = (tmp_path / "whole.pt").read_bytes()
    w, clock = watch(tmp_path)
    look(w, clock, 100.0)
    save(tmp_path / "step_300.pt")
    (tmp_path / "step_299.pt").write_bytes(data[:1000])
    assert look(w, clock, 100.5)[0] == []
    clock.t = 100.6
    found, _ = w.look(time.time(), final=True)
    assert [c["path"] for c in found] == ["step_300.pt"]
    never = tmp_path / "never"
    w2, clock2 = watch(never)
    assert look(w2, clock2, 100.0) == ([], [])
    clock2.t = 101.0
    said = w2.look(time.time(), final=True)[1]
    assert said == ["checkpoint_dir %s does not exist: set checkpoint_dir to where the script "
                    "saves its checkpoints" % never]


def test_a_file_that_never_stops_growing_is_said_once_and_never_counted(tmp_path):
    w, clock = watch(tmp_path, growing_warn_s=60.0)
    look(w, clock, 100.0)
    path = tmp_path / "ckpt_9.pt"
    path.write_bytes(b"PK\x03\x04")
    said = []
    for i in range(1, 100):
        with open(path, "ab") as f:
            f.write(b"x" * 100)
        os.utime(path, ns=(i * 10**9, i * 10**9))  # (a coarse file system: each look sees it)
        found, warnings = look(w, clock, 100.0 + i)
        assert found == []
        said += warnings
    assert len(said) == 1 and "ckpt_9.pt" in said[0] and "not counted" in said[0]


def test_symlinks_are_not_followed_and_odd_names_are_bounded_text(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    save(outside / "step_5.pt")
    inside = tmp_path / "ckpt"
    inside.mkdir()
    w, clock = watch(inside)
    look(w, clock, 100.0)
    os.symlink(outside / "step_5.pt", inside / "step_5.pt")
    os.symlink(outside, inside / "step_6")
    odd = os.fsencode(str(inside)) + b"/step_7\xff" + b"x" * 230 + b".pt"
    with open(odd, "wb") as f:
        f.write((outside / "step_5.pt").read_bytes())
    look(w, clock, 101.0)
    found, warnings = look(w, clock, 104.0)
    assert warnings == [] and len(found) == 1
    assert found[0]["path"].startswith("step_7\\xffxxx") and len(found[0]["path"]) == 200
    assert found[0]["step"] == 7


def test_a_directory_that_cannot_be_read_or_is_no_directory_is_one_sentence(tmp_path,
                                                                             monkeypatch):
    f = tmp_path / "file"
    f.write_text("x")
    w, clock = watch(f)
    assert look(w, clock, 100.0)[1] == ["checkpoint_dir %s is not a directory: set "
                                        "checkpoint_dir to the directory the script saves "
                                        "into" % f]
    assert w.blind
    w, clock = watch(tmp_path)

    def refused(path):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(ckptwatch.os, "scandir", refused)
    said = look(w, clock, 100.0)[1] + look(w, clock, 101.0)[1]
    assert len(said) == 1 and "Permission denied" in said[0] and "read and execute" in said[0]
    assert w.blind


def test_look_never_raises(tmp_path, monkeypatch):
    w, clock = watch(tmp_path)
    look(w, clock, 100.0)
    save(tmp_path / "step_3.pt")

    def broken(*_a, **_k):
        raise RuntimeError("boom")
    monkeypatch.setattr(ckptwatch, "file_verdict", broken)
    found, warnings = look(w, clock, 101.0)
    found2, warnings2 = look(w, clock, 104.0)
    assert found + found2 == [] and len(warnings + warnings2) == 1 and "boom" in warnings[0]


def test_a_huge_directory_is_scanned_only_as_often_as_its_cost_allows(tmp_path):
    """100,000 files: one sentence, the names kept bounded, and the scans spaced by their own
    CPU cost (CHECKPOINT_SCAN_BUDGET: 0.1 % of a core); the figures are printed, not
    asserted on time."""
    n = 100_000
    for i in range(n):
        os.close(os.open(str(tmp_path / ("f%06d" % i)), os.O_CREAT | os.O_WRONLY, 0o600))
    w, clock = watch(tmp_path)
    found, warnings = look(w, clock, 100.0)
    assert len(warnings) == 1 and "100000 entries" in warnings[0]
    assert len(w.known) <= ckptwatch.NAMES_MAX
    spacing, cost = w.next_scan_m - 100.0, w.last_scan_cpu_s
    assert spacing == pytest.approx(w.last_scan_cpu_s / defaults.CHECKPOINT_SCAN_BUDGET)
    for t in range(1, 11):  # one look a second: no scan before its cost allows
        look(w, clock, 100.0 + min(t, spacing * 0.9))
    assert w.scans == 1
    look(w, clock, 100.0 + spacing + 0.01)
    assert w.scans == 2
    save(tmp_path / "step_9.pt")  # a new checkpoint among them is still found
    look(w, clock, w.next_scan_m)
    found, _ = look(w, clock, max(w.next_scan_m, clock.t + defaults.CHECKPOINT_STILL_S))
    assert [c["path"] for c in found] == ["step_9.pt"]
    print("\nckptwatch: %d files, one scan %.1f ms CPU, scans %.0f s apart: %.3f %% of a core"
          % (n, cost * 1e3, spacing, 100.0 * cost / max(spacing, 1.0)))


def test_a_small_directorys_watch_costs_well_under_a_tenth_of_a_percent_of_a_core(tmp_path):
    """The common case, as a user checks it: 20 checkpoints kept and a save of 8 shards going
    on, one look a second (the watch's own pacing decides when it scans) for 300 seconds:
    the watch's CPU time (its own account and this thread's) is under 0.1 % of a core."""
    for i in range(20):
        save(tmp_path / ("step_%d.pt" % i), 10)
    w, clock = watch(tmp_path, world=8)
    began = time.thread_time()
    for t in range(300):
        if t == 100:  # a save: every rank's shard
            for r in range(8):
                save(tmp_path / ("model_rank%d_step100.pt" % r), 10)
        found, _ = look(w, clock, 100.0 + t)
        if found:
            assert [c["files"] for c in found] == [8]
    cpu = time.thread_time() - began
    assert w.cpu_s <= cpu + 1e-3
    assert cpu / 300.0 < defaults.CHECKPOINT_SCAN_BUDGET, (
        "ckptwatch: %.1f us CPU a look: %.4f %% of a core" % (cpu / 300 * 1e6, cpu / 3.0))


def test_per_rank_shards_are_one_save_once_every_rank_has_its_shard(tmp_path):
    """Issue 67: with 5 of 8 model_rank{r}_step100.pt written when the run ended, the save is
    recorded as partial (5 of 8), never as a checkpoint; a whole save of 8 is one entry."""
    w, clock = watch(tmp_path, world=8)
    look(w, clock, 100.0)
    for r in range(8):
        save(tmp_path / ("model_rank%d_step50.pt" % r))
    look(w, clock, 101.0)
    found, _ = look(w, clock, 101.0 + defaults.CHECKPOINT_STILL_S)
    assert [(c["path"], c["files"], c["step"], c.get("partial")) for c in found] == [
        ("model_rank*_step50.pt", 8, 50, None)]
    for r in range(5):
        save(tmp_path / ("model_rank%d_step100.pt" % r))
    look(w, clock, 110.0)
    assert look(w, clock, 110.0 + defaults.CHECKPOINT_STILL_S) == ([], [])  # 3 ranks to come
    found, _ = w.look(time.time(), final=True)  # the run is over: they never will
    assert [(c["path"], c["files"], c["of"], c["partial"]) for c in found] == [
        ("model_rank*_step100.pt", 5, 8, True)]


def test_a_save_of_200_shards_written_over_10_s_is_one_save_of_200_files(tmp_path):
    """Issue 67: CANDIDATES_MAX was 64 (a save of 200 shards recorded as 64 files), and shards
    written more than 1 s apart were several saves."""
    w, clock = watch(tmp_path, world=200)
    look(w, clock, 100.0)
    now = time.time()
    for r in range(200):
        path = tmp_path / ("shard_rank%03d_step7.pt" % r)
        save(path, 10)
        os.utime(path, (now - 10 + r / 20.0, now - 10 + r / 20.0))  # 10 s of writing
    found = []
    for t in range(1, 30):
        found += look(w, clock, 100.0 + t)[0]
    assert [(c["files"], c["step"]) for c in found] == [(200, 7)]
    assert found[0]["ended"] - found[0]["began"] >= 9.9


def test_on_nfs_a_file_counts_once_it_held_still_longer_than_the_attribute_cache(tmp_path):
    """Issue 67: NFS caches a file's attributes for acregmin (3 s) and more while it changes,
    a directory's listing for up to acdirmax (60 s): 2 s and 30 s of holding still are not
    enough. The mount is told by the kernel's own mountinfo lines."""
    point = str(tmp_path)
    nfs = ("36 25 0:52 / %s rw,relatime shared:30 - nfs4 fs1:/export/ckpt rw,vers=4.2,"
           "rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys,"
           "clientaddr=10.0.0.2,local_lock=none,addr=10.0.0.1\n" % point)
    root = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro\n"
    w, clock = watch(tmp_path, mountinfo=root + nfs)
    assert w.fstype == "nfs4" and w.open_stat
    assert w.still_s > 3.0 and w.dir_still_s > 60.0
    look(w, clock, 100.0)
    save(tmp_path / "step_3.pt")
    look(w, clock, 101.0)
    assert look(w, clock, 101.0 + defaults.CHECKPOINT_STILL_S)[0] == []  # 2 s: not yet
    assert [c["path"] for c in look(w, clock, 101.0 + w.still_s)[0]] == ["step_3.pt"]
    # actimeo=30 without close-to-open: 30 s; on a local disk (ext4), 2 s as before.
    w, _c = watch(tmp_path, mountinfo=root + nfs.replace("hard,", "hard,nocto,actimeo=30,"))
    assert w.still_s == 30.0 + defaults.CHECKPOINT_STILL_S and not w.open_stat
    w, _c = watch(tmp_path, mountinfo=root)
    assert w.still_s == defaults.CHECKPOINT_STILL_S and w.dir_still_s == defaults.CHECKPOINT_DIR_STILL_S


@settings(max_examples=examples(300), deadline=None)
@given(text=st.text(max_size=400) | st.lists(st.sampled_from(
    ["36", "25", "0:52", "/", "/a\\040b", "-", "nfs", "rw,acregmin=x,actimeo=", "noac", "",
     "shared:1"]), max_size=14).map(" ".join))
def test_any_mountinfo_text_gives_a_mount_or_none_and_never_raises(text):
    from ansible_collections.torchfleet.fleet.plugins.module_utils.host import mounts
    fstype, options = mounts.mount_of("/a b/c", text)
    assert isinstance(fstype, str) and isinstance(options, dict)
    acregmin, acregmax, acdirmax, cto = mounts.attribute_cache(fstype, options)
    assert 0 <= acregmin <= acregmax and 0 <= acdirmax and isinstance(cto, bool)


def test_the_final_look_is_awaited_as_long_as_a_slow_scan_takes(tmp_path):
    """Issue 67: the final look was awaited 3 s and could sit behind a long Lustre/NFS scan:
    a save at the very end was lost. It is awaited as long as two of the slowest looks (at
    most CHECKPOINT_FINAL_WAIT_MAX_S), and when it does not come, a sentence says so."""
    inner = CheckpointWatch(str(tmp_path), world=1)
    slow = {"s": 0.0}

    class Slow:
        said = inner.said

        def look(self, now, final=False):
            time.sleep(slow["s"])
            return inner.look(now, final)

    w = Watcher(str(tmp_path), look_s=0.05, watch=Slow())
    time.sleep(0.2)
    slow["s"] = 1.5   # a scan as slow as a large NFS directory's
    time.sleep(1.7)   # (one such look so far)
    save(tmp_path / "step_9.pt")  # the last save, at the very end
    w.finish(wait_s=0.5)
    found, warnings = w.take()
    assert [c["path"] for c in found] == ["step_9.pt"] and warnings == []
    slow["s"] = 5.0
    w2 = Watcher(str(tmp_path), look_s=0.05, watch=Slow())
    time.sleep(0.1)
    w2.finish(wait_s=0.1, most_s=0.5)
    assert "the final look did not finish" in w2.take()[1][0]


@settings(max_examples=examples(200), deadline=None)
@given(prefix=st.sampled_from(["", "run3/", "model_", "a-b."]),
       word=st.sampled_from(["step", "STEP", "global_step", "iter", "iteration", "epoch",
                             "checkpoint", "ckpt", "Ckpt"]),
       sep=st.sampled_from(["", "_", "-", "="]), n=st.integers(0, 10**12),
       suffix=st.sampled_from(["", ".pt", ".pth", "/", ".distcp", "_final.bin"]))
def test_the_step_is_read_from_any_common_name(prefix, word, sep, n, suffix):
    assert step_of(prefix + word + sep + str(n) + suffix) == n


def test_names_without_a_step_have_none_and_the_last_one_wins():
    assert [step_of(n) for n in ("model.pt", "final", "stepper.pt", "epoch-3_step_1200.pt",
                                 "v2_iteration7", "")] == [None, None, None, 1200, 7, None]


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=st.lists(st.tuples(
    st.binary(min_size=1, max_size=40).filter(lambda b: b"/" not in b and b"\x00" not in b
                                               and b not in (b".", b"..")),
    st.sampled_from(["file", "zip", "cut", "dir", "dcpdir", "link", "empty"])),
    max_size=12))
def test_a_hostile_tree_never_breaks_the_watch(tmp_path_factory, tree):
    root = tmp_path_factory.mktemp("h")
    w, clock = watch(root)
    look(w, clock, 100.0)
    base = os.fsencode(str(root)) + b"/"
    for name, kind in tree:
        path = base + name
        if os.path.lexists(path):
            continue
        if kind in ("dir", "dcpdir"):
            os.mkdir(path)
            with open(path + (b"/.metadata" if kind == "dcpdir" else b"/x.bin"), "wb") as f:
                f.write(b"PK\x03\x04" + b"\x00" * 30)
        elif kind == "link":
            os.symlink(b"/etc", path)
        else:
            with open(path, "wb") as f:
                f.write({"file": b"text", "zip": b"PK\x03\x04PK\x05\x06" + b"\x00" * 18,
                         "cut": b"PK\x03\x04" + b"\x00" * 100, "empty": b""}[kind])
    seen = []
    for t in (101.0, 104.0, 110.0):
        found, warnings = look(w, clock, t)
        seen += found
        assert all(isinstance(x, str) and len(x) <= 300 for x in warnings)
    for c in seen:
        assert set(c) == {"path", "began", "ended", "step", "kind", "bytes"}
        assert isinstance(c["path"], str) and 0 < len(c["path"]) <= 200
        c["path"].encode("utf-8")  # (text the record can hold)
        assert c["began"] <= c["ended"] and c["kind"] in ("file", "dcp", "dir")
    assert len({c["path"] for c in seen}) == len(seen)


def test_the_watcher_thread_hands_over_what_it_found_and_says_a_hung_look_once(tmp_path):
    w = Watcher(str(tmp_path), look_s=0.05)
    try:
        deadline = time.monotonic() + 30
        while w.watch.looks == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # its first look: the past
        save(tmp_path / "step_4.pt")
        found = []
        while not found and time.monotonic() < deadline:
            time.sleep(0.1)
            w.watch.still_s = 0.0  # (held still long enough for this test)
            found += w.take()[0]
        assert [c["path"] for c in found] == ["step_4.pt"]
        save(tmp_path / "step_5.pt")  # at the run's last step: the final look counts it
        w.watch.still_s = 60.0
        w.finish(wait_s=30.0)
        assert [c["path"] for c in w.take()[0]] == ["step_5.pt"]
    finally:
        w.close()
    w.thread.join(5)
    assert not w.thread.is_alive()
    clock = Clock()
    hung = Watcher(str(tmp_path), mono=clock, start=False)
    clock.t += defaults.CHECKPOINT_HUNG_WARN_S + 1
    said = hung.take()[1] + hung.take()[1]
    assert len(said) == 1 and "has not answered" in said[0] and str(tmp_path) in said[0]


def test_a_distributed_checkpoint_with_more_shards_than_a_read_takes_still_completes(
        tmp_path, monkeypatch):
    # More shards than DIR_ENTRIES_MAX (8 files per rank at 1,250 ranks; directory order is
    # arbitrary): .metadata among the entries left unread is still seen.
    monkeypatch.setattr(ckptwatch, "DIR_ENTRIES_MAX", 50)
    w, clock = watch(tmp_path)
    look(w, clock, 100.0)
    shards = tmp_path / "step_9"
    shards.mkdir()
    for i in range(80):
        (shards / ("__%d_0.distcp" % i)).write_bytes(b"x")
    (shards / ".metadata").write_bytes(b"m")
    found = look(w, clock, 101.0)[0] + look(w, clock, 104.0)[0] + look(w, clock, 108.0)[0]
    assert [(c["path"], c["kind"], c["step"]) for c in found] == [("step_9", "dcp", 9)]


def test_a_file_growing_while_the_restat_is_paced_is_counted_once_when_it_stops(tmp_path):
    """Fleet review (issue 67, 3): with the re-stat of pending files paced away (its CPU cost:
    ~1,000 shards), a file passed the hold on time alone, so a safetensors file growing for 60 s
    was recorded at each scan (6 times). It counts only on a stat taken still_s after its last
    change that still sees it unchanged: once, after it stopped."""
    ticks = [0.0]

    def cpu():  # each look's scan and re-stat cost 10 ms: paced ~10 s apart
        ticks[0] += 0.01
        return ticks[0]

    w, clock = watch(tmp_path, cpu=cpu)
    look(w, clock, 100.0)
    path = tmp_path / "model.safetensors"
    header = b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    found = []
    for t in range(1, 90):
        if t <= 60:  # written for 60 s
            with open(path, "ab") as f:
                f.write(b"x" * 1000)
            os.utime(path, ns=(int((1e9 + t) * 1e9), int((1e9 + t) * 1e9)))
        found += look(w, clock, 100.0 + t)[0]
    assert [(c["path"], c["bytes"]) for c in found] == [
        ("model.safetensors", path.stat().st_size)]


def test_a_lone_file_with_rank_in_its_name_is_a_whole_save(tmp_path):
    """Fleet review (issue 67, 2): any name holding rank<N> below the world was held back until
    the world's ranks had each written one: a LoRA's lora_rank16_step100.pt, or a save by rank 0
    alone, ended up partial at the run's end. A file is a shard only once another rank's file
    of its save is there."""
    w, clock = watch(tmp_path, world=4096)
    look(w, clock, 100.0)
    save(tmp_path / "lora_rank16_step100.pt")
    save(tmp_path / "ckpt_step100_rank0.pt")
    look(w, clock, 101.0)
    found, warnings = look(w, clock, 101.0 + defaults.CHECKPOINT_STILL_S)
    assert sorted((c["path"], c["step"], c.get("partial")) for c in found) == [
        ("ckpt_step100_rank0.pt", 100, None), ("lora_rank16_step100.pt", 100, None)]
    assert warnings == [] and w.look(time.time(), final=True) == ([], [])


def test_shards_of_some_ranks_only_are_a_save_and_their_count_is_learned(tmp_path):
    """Fleet review (issue 67, 2): shards written by some ranks only (the master's 8 of a
    world of 4096 on node-local disk; DeepSpeed's zero_pp_rank_N_mp_rank_00 from its
    data-parallel ranks alone) never reached the world, so every save was partial and all the
    training lost. A save is whole once every file of it there is complete and it has as many
    as its name-pattern's last complete save; at the run's end one short of that is partial."""
    w, clock = watch(tmp_path, world=4096)
    look(w, clock, 100.0)
    for r in range(8):
        save(tmp_path / ("model_rank%d_step100.pt" % r))
    for dp in range(4):
        save(tmp_path / ("zero_pp_rank_%d_mp_rank_00_optim_states.pt" % dp))
    look(w, clock, 101.0)
    found, _ = look(w, clock, 101.0 + defaults.CHECKPOINT_STILL_S)
    assert sorted((c["path"], c["files"], c.get("partial")) for c in found) == [
        ("model_rank*_step100.pt", 8, None), ("zero_pp_rank_*_mp_rank_00_optim_states.pt", 4, None)]
    for r in range(8):
        save(tmp_path / ("model_rank%d_step200.pt" % r))
    look(w, clock, 110.0)
    found, _ = look(w, clock, 110.0 + defaults.CHECKPOINT_STILL_S)
    assert [(c["path"], c["files"], c["step"]) for c in found] == [("model_rank*_step200.pt", 8, 200)]
    for r in range(5):  # the host died mid-save: 5 of the 8 learned
        save(tmp_path / ("model_rank%d_step300.pt" % r))
    look(w, clock, 120.0)
    assert look(w, clock, 120.0 + defaults.CHECKPOINT_STILL_S) == ([], [])
    found, _ = w.look(time.time(), final=True)
    assert [(c["path"], c["files"], c["of"], c["partial"]) for c in found] == [
        ("model_rank*_step300.pt", 5, 8, True)]


def test_a_first_save_with_a_shard_cut_short_is_partial_at_the_runs_end(tmp_path):
    """With no complete save of its pattern known, a save whose file never completed (a zip a
    dying rank left without its end record) is partial, never whole."""
    w, clock = watch(tmp_path, world=16)
    look(w, clock, 100.0)
    for r in range(3):
        save(tmp_path / ("model_rank%d_step100.pt" % r))
    cut = tmp_path / "model_rank3_step100.pt"
    save(cut)
    cut.write_bytes(cut.read_bytes()[:-200])  # its end record gone
    look(w, clock, 101.0)
    assert look(w, clock, 101.0 + defaults.CHECKPOINT_STILL_S)[0] == []
    found, _ = w.look(time.time(), final=True)
    assert [(c["path"], c["files"], c["of"], c["partial"]) for c in found] == [
        ("model_rank*_step100.pt", 3, 4, True)]
