"""A rank's log read in chunks (module_utils/run/ranklog.py, the rank_log module) while a real
process writes it, and followed to its end with every byte seen once; and a run's status view
(module_utils/reports/status.py, run_record's module) from a record that came from another host."""
from __future__ import annotations

import subprocess
import sys
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import status
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import ranklog
from ansible_collections.torchfleet.fleet.plugins.modules import rank_log, run_record

from tests.unit.modules import run_module
from tests.conftest import examples


def rank_dir(run_dir, local_rank=0, layout="host"):
    base = run_dir / "logs" / "r1_abc" if layout == "host" else run_dir
    path = base / "attempt_0" / str(local_rank)
    path.mkdir(parents=True)
    return path


def args(run_dir, **p):
    return dict({"run_dir": str(run_dir), "local_rank": 0, "offsets": {}, "tail": 50,
                 "max_bytes": ranklog.MAX_BYTES, "wait_s": 0.0}, **p)


def test_a_followed_log_of_a_writing_process_is_read_whole_once(tmp_path):
    where = rank_dir(tmp_path)
    writer = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "f = open(sys.argv[1], 'w')\n"
        "for i in range(200):\n"
        "    f.write('step %d' % i); f.flush()\n"
        "    f.write(' loss 0.%d\\n' % i); f.flush()\n"
        "    time.sleep(0.005)\n"
        "open(sys.argv[2], 'w').write('{}')\n"), str(where / "stdout.log"),
        str(tmp_path / "exitcode.json")])
    seen, offsets, deadline = [], {"stdout": 0, "stderr": 0}, time.monotonic() + 60
    while time.monotonic() < deadline:
        got = ranklog.read(args(tmp_path, offsets=offsets, wait_s=1.0, max_bytes=700))
        seen.append(got["streams"]["stdout"]["text"])
        offsets = {s: got["streams"][s]["offset"] for s in ranklog.STREAMS}
        if got["ended"] and not got["streams"]["stdout"]["text"]:
            break
    writer.wait(timeout=30)
    lines = "".join(seen).splitlines()
    assert lines == ["step %d loss 0.%d" % (i, i) for i in range(200)]


def test_a_first_read_starts_at_the_last_lines_of_both_streams(tmp_path):
    where = rank_dir(tmp_path, layout="gathered")
    (where / "stdout.log").write_text("".join("line %d\n" % i for i in range(100)))
    (where / "stderr.log").write_text("Traceback\nValueError: boom\n")
    got = ranklog.read(args(tmp_path, tail=3))
    assert got["found"] and got["streams"]["stdout"]["text"] == "line 97\nline 98\nline 99\n"
    assert got["streams"]["stderr"]["text"].endswith("ValueError: boom\n")
    assert got["streams"]["stdout"]["offset"] == (where / "stdout.log").stat().st_size


def test_a_run_without_its_log_yet_or_at_all(tmp_path):
    assert ranklog.read(args(tmp_path))["found"] is False
    assert ranklog.read(args(tmp_path / "gone"))["missing"] is True


@settings(max_examples=examples(200), deadline=None)
@given(content=st.binary(max_size=3000), offset=st.one_of(st.none(), st.integers(-5, 4000)),
       tail=st.integers(0, 60), max_bytes=st.integers(-2, 2000))
def test_any_bytes_and_any_offset_never_raise(tmp_path_factory, content, offset, tail, max_bytes):
    run_dir = tmp_path_factory.mktemp("r")
    where = rank_dir(run_dir)
    (where / "stdout.log").write_bytes(content)
    got = ranklog.read(args(run_dir, offsets={"stdout": offset, "stderr": "x"}, tail=tail,
                            max_bytes=max_bytes))
    out = got["streams"]["stdout"]
    assert 0 <= out["offset"] <= len(content) or out["offset"] == offset
    assert isinstance(out["text"], str)


def test_the_module_answers_what_its_return_documents(tmp_path, capsys):
    where = rank_dir(tmp_path)
    (where / "stdout.log").write_text("step 1\n")
    result = run_module(rank_log, {"run_dir": str(tmp_path), "local_rank": 0}, capsys)
    assert result["streams"]["stdout"]["text"] == "step 1\n" and not result["ended"]


def test_run_record_answers_what_its_return_documents(tmp_path, capsys):
    (tmp_path / "r1").mkdir()
    record = {"kind": "train", "master": "node0", "hosts": {"node0": {"remote_dir": "/d"}},
              "watch": {"nproc_per_node": 1}}
    run_module(run_record, {"state": "present", "run_id": "r1", "runs_root": str(tmp_path),
                            "record": record}, capsys)
    got = run_module(run_record, {"state": "read", "run_id": "r1", "runs_root": str(tmp_path),
                                  "rank": 0}, capsys)
    assert got["place"] == {"host": "node0", "local_rank": 0, "rank": 0}
    refused = run_module(run_record, {"run_id": "nosuch", "runs_root": str(tmp_path)}, capsys)
    assert refused["failed"] and refused["msg"].startswith("no run nosuch under")


RECORD = {"run_id": "r1", "phase": "running", "final": False, "started": 1000.0,
          "failure": None, "hosts": [
              {"host": "node0", "state": "running", "alive": 2, "last_seen": 1098.0,
               "last_line": "[rank 0] step 40/300 loss 0.2"},
              {"host": "node1", "state": "lost", "alive": 0, "last_seen": 1060.0,
               "last_line": ""}]}


def test_the_status_of_a_record():
    view = status.view(RECORD, 1100.0, attempt=1)
    assert view["elapsed_s"] == 100.0 and view["attempt"] == 1
    assert [(h["host"], h["state"], h["ranks_alive"], h["last_heard_s"]) for h in view["hosts"]] \
        == [("node0", "running", 2, 2.0), ("node1", "lost", 0, 40.0)]
    text = status.text(view)
    assert "run r1  running  attempt 1  elapsed 100 s" in text and "40 s ago" in text


garbage = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                       lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=20)


@settings(max_examples=examples(300), deadline=None)
@given(record=st.one_of(garbage, st.fixed_dictionaries(
    {k: garbage for k in RECORD if k != "hosts"}, optional={"hosts": st.lists(st.fixed_dictionaries(
        {}, optional={k: garbage for k in RECORD["hosts"][0]}), max_size=3)})),
       now=garbage)
def test_a_hostile_record_never_raises(record, now):
    status.text(status.view(record, now))
