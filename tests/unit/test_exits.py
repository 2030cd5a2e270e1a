"""A rank's own exit note (exits.NOTE in the run's sitecustomize), written by real Python
processes started as torchrun starts a rank, read back as the agent reads it; and the words of
a rank's death. Real torchrun runs: tests/unit/test_run_modules.py (a slow sibling, an abort at
interpreter exit)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from ansible_collections.torchfleet.fleet.plugins.module_utils.run import exits, stacks
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.conftest import examples


def rank(tmp_path, body):
    """One process as torchrun starts a rank: the run's sitecustomize first on PYTHONPATH,
    TORCHELASTIC_ERROR_FILE in its rank directory. Returns (returncode, note)."""
    rank_dir = tmp_path / "attempt_0" / "0"
    rank_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TORCHELASTIC_ERROR_FILE=str(rank_dir / "error.json"))
    env.pop("TORCHFLEET_RANK_PID", None)
    stacks.install_hook(str(tmp_path), env, exits.NOTE)
    script = tmp_path / "rank.py"
    script.write_text(body)
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=60)
    return proc.returncode, exits.read_note(str(rank_dir)), rank_dir


def test_a_rank_notes_the_code_its_script_ended_with(tmp_path):
    rc, note, _ = rank(tmp_path / "a", "import sys\nsys.exit(3)\n")
    assert rc == 3 and note["code"] == 3
    rc, note, _ = rank(tmp_path / "b", "raise ValueError('bad batch')\n")
    assert rc == 1 and note["code"] == 1
    rc, note, _ = rank(tmp_path / "c", "print('done')\n")
    assert rc == 0 and note["code"] is None


def test_an_abort_after_the_script_ended_keeps_the_scripts_code(tmp_path):
    """A global whose finalizer aborts: the process dies of SIGABRT while the interpreter shuts
    down, after the exit handlers (as a process group never destroyed does)."""
    body = ("import os, sys\nclass Pg:\n    def __del__(self):\n        os.abort()\n"
            "pg = Pg()\nsys.exit(3)\n")
    rc, note, _ = rank(tmp_path, body)
    assert rc == -6 and note["code"] == 3


def test_a_process_the_rank_spawns_writes_no_note(tmp_path):
    """A child (a DataLoader worker, say) that inherits the rank's environment and ends after
    the rank, with 7: the note stays the rank's 2 (the test's run waits for the child too: it
    holds the captured output open)."""
    body = ("import subprocess, sys\n"
            "subprocess.Popen([sys.executable, '-c', "
            "'import sys, time; time.sleep(1); sys.exit(7)'])\n"
            "sys.exit(2)\n")
    rc, note, _rank_dir = rank(tmp_path, body)
    assert rc == 2 and note["code"] == 2


def test_a_child_os_fork_made_writes_no_note(tmp_path):
    """A child os.fork made inherits the rank's hook itself (not only its environment): it ends
    with sys.exit(7) after the rank's own note, and the note stays the rank's 2."""
    body = ("import os, sys, time\n"
            "if os.fork() == 0:\n"
            "    time.sleep(1)\n"
            "    sys.exit(7)\n"
            "sys.exit(2)\n")
    rc, note, _rank_dir = rank(tmp_path, body)
    assert rc == 2 and note["code"] == 2


def test_a_process_that_is_not_a_rank_writes_nothing(tmp_path):
    env = dict(os.environ)
    env.pop("TORCHELASTIC_ERROR_FILE", None)
    stacks.install_hook(str(tmp_path), env, exits.NOTE)
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True, timeout=60)
    assert not list(tmp_path.rglob(exits.NOTE_FILE))


@settings(max_examples=examples(200), deadline=None)
@given(st.one_of(st.binary(max_size=400), st.builds(
    lambda v: json.dumps(v).encode(), st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(["code", "ts", "x"]),
                                                           c, max_size=3), max_leaves=8))))
def test_any_bytes_in_a_note_read_as_a_note_of_the_right_shape_or_none(tmp_path_factory, raw):
    d = tmp_path_factory.mktemp("note")
    (d / exits.NOTE_FILE).write_bytes(raw)
    note = exits.read_note(str(d))
    assert note is None or (set(note) == {"code", "ts"} and isinstance(note["ts"], float)
                            and (note["code"] is None or type(note["code"]) is int))


def test_the_words_of_a_ranks_death():
    assert exits.words(3, 3) == "rank 3 exited with 3"
    assert exits.words(3, -6, 3, True) == "rank 3 exited with 3 (then SIGABRT at interpreter exit)"
    assert exits.words(1, -6, None, True).startswith(
        "rank 1 ended its script, then died of SIGABRT at interpreter exit (-6): its process "
        "group was never destroyed")
    assert exits.words(3, None, 3, True) == "rank 3 exited with 3"
    assert exits.words(3, None) == "rank 3 died (killed by a signal: no exit code)"
    assert exits.words(2, -9) == "rank 2 exited with -9"
