"""How a hang's stacks are taken: whether py-spy can attach (ptrace rules), and the ranks' own
faulthandler where it cannot, on a real process."""
from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import stacks

# `setcap cap_sys_ptrace+ep` writes this xattr (VFS_CAP_REVISION_2, bit 19 permitted).
CAP_SYS_PTRACE_EP = struct.pack("<5I", 0x02000001, 1 << 19, 0, 0, 0)


@pytest.fixture
def py_spy(tmp_path):
    path = tmp_path / "py-spy"
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("cap, scope, attach", [
    (True, 1, True), (False, None, True), (False, 0, True), (False, 1, False), (False, 2, False),
    (True, 3, False), (False, 3, False)])
def test_who_may_attach_follows_the_kernels_ptrace_rules(py_spy, cap, scope, attach):
    """cap: CAP_SYS_PTRACE in the effective set (root in a container without it: False)."""
    facts = stacks.attach_facts("/usr/bin/python3", cap, scope=scope, py_spy=py_spy)
    assert facts["can_attach"] is attach
    assert (facts["why"] == "") is attach
    if not attach:
        assert "ptrace_scope=%d" % scope in facts["why"]


def test_no_py_spy_says_so(tmp_path):
    facts = stacks.attach_facts(str(tmp_path / "python"), True, scope=0, py_spy="")
    assert not facts["can_attach"] and "py-spy is not installed" in facts["why"]


def test_the_file_capability_is_read_from_its_xattr():
    assert stacks.permitted_caps(CAP_SYS_PTRACE_EP) >> stacks.CAP_SYS_PTRACE & 1
    assert not stacks.permitted_caps(struct.pack("<5I", 0x02000001, 1 << 12, 0, 0, 0)) >> 19 & 1
    assert stacks.permitted_caps(b"\x01") == 0  # garbled: no capability


SLEEPER = """
import time
from pathlib import Path
print("ready", flush=True)
def wait_here():
    time.sleep(120)
wait_here()
"""


def test_a_rank_dumps_its_own_stack_on_sigusr1_and_a_shadowed_sitecustomize_still_runs(
        tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text(
        "import os\nopen(os.environ['MARK'], 'w').write('ran')\n")
    env = dict(os.environ, PYTHONPATH=str(theirs), MARK=str(tmp_path / "mark"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    stacks.install_hook(str(run_dir), env)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(run_dir / stacks.HOOK_DIR), str(theirs)]
    rank_dir = tmp_path / "rank0"
    rank_dir.mkdir()
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    with open(rank_dir / "stdout.log", "w") as out, open(rank_dir / "stderr.log", "w") as err:
        proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=out, stderr=err)
    try:
        deadline = time.monotonic() + 60
        while "ready" not in (rank_dir / "stdout.log").read_text():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        texts = stacks.faulthandler_dumps({0: (proc.pid, 0)}, {0: str(rank_dir)})
    finally:
        proc.kill()
        proc.wait()
    assert "most recent call first" in texts[0]
    assert 'in wait_here' in texts[0] and "sleeper.py" in texts[0]
    assert (tmp_path / "mark").read_text() == "ran"


def bounded(argv, timeout_s=60):
    """command.bounded's contract without a module: (stdout, None) or (None, why)."""
    try:
        proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, "%s did not answer within %g s" % (argv[0], timeout_s)
    return (proc.stdout, None) if proc.returncode == 0 else (None, proc.stderr or "failed")


def start_ranks(tmp_path, n):
    """n sleeping Python processes started as torchrun starts ranks (the run's sitecustomize
    first on PYTHONPATH), each with its log directory; returns (procs, workers, dirs)."""
    env = dict(os.environ)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    stacks.install_hook(str(run_dir), env)
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    procs, workers, dirs = [], {}, {}
    for lr in range(n):
        d = tmp_path / ("rank%d" % lr)
        d.mkdir()
        with open(d / "stdout.log", "w") as out, open(d / "stderr.log", "w") as err:
            procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stdout=out,
                                          stderr=err))
        workers[lr], dirs[lr] = (procs[-1].pid, 10 + lr), str(d)
    deadline = time.monotonic() + 60
    for d in dirs.values():
        while "ready" not in (Path(d) / "stdout.log").read_text():
            assert time.monotonic() < deadline
            time.sleep(0.05)
    return procs, workers, dirs


def test_py_spy_dumps_every_rank_at_once_and_a_rank_it_cannot_dump_dumps_itself(tmp_path):
    """8 ranks, as on an 8-GPU host. A py-spy in front of the real one waits until it was
    started for all eight (so they ran at once: one after another, the first would give up),
    and refuses the last rank as a container without CAP_SYS_PTRACE would: that rank's stack
    comes from its own faulthandler, the others' from py-spy."""
    real = stacks.find_py_spy(sys.executable)
    if not real:
        pytest.skip("py-spy is not installed beside this Python (pip install -e '.[dev]')")
    procs, workers, dirs = start_ranks(tmp_path, 8)
    starts = tmp_path / "starts"
    gate = tmp_path / "py-spy"
    gate.write_text(
        "#!/bin/sh\necho \"$3\" >> %s\n"
        "i=0; while [ $(wc -l < %s) -lt 8 ]; do i=$((i+1)); "
        "[ $i -gt 300 ] && { echo 'not started at once' >&2; exit 2; }; sleep 0.1; done\n"
        "[ \"$3\" = %d ] && { echo 'Permission denied (os error 13)' >&2; exit 1; }\n"
        "exec %s \"$@\"\n" % (starts, starts, workers[7][0], real))
    gate.chmod(0o755)
    try:
        stacks.dump(bounded, {"py_spy": str(gate), "can_attach": True, "why": ""}, "auto",
                    workers, dirs, "stack.txt")
    finally:
        for p in procs:
            p.kill()
            p.wait()
    texts = [(Path(dirs[lr]) / "stack.txt").read_text() for lr in range(8)]
    for text in texts[:7]:
        assert "wait_here" in text and "Thread" in text and "faulthandler" not in text, text
    assert "py-spy failed: Permission denied (os error 13)" in texts[7], texts[7]
    assert "most recent call first" in texts[7] and "wait_here" in texts[7]


def test_preflight_tries_py_spy_for_real_before_it_says_py_spy_can_attach(tmp_path):
    real = stacks.find_py_spy(sys.executable)
    if not real:
        pytest.skip("py-spy is not installed beside this Python (pip install -e '.[dev]')")
    facts = stacks.attach_facts(sys.executable, True, scope=0, py_spy=real)
    assert stacks.probe_attach(facts, sys.executable, bounded)["can_attach"] is True
    # Where the kernel's rules say yes but the dump fails (seccomp, an LSM): no, and why.
    denied = tmp_path / "py-spy"
    denied.write_text("#!/bin/sh\necho 'Operation not permitted (os error 1)' >&2\nexit 1\n")
    denied.chmod(0o755)
    facts = stacks.attach_facts(sys.executable, True, scope=0, py_spy=str(denied))
    probed = stacks.probe_attach(facts, sys.executable, bounded)
    assert not probed["can_attach"] and "Operation not permitted" in probed["why"]


FH_MAIN = ('Current thread 0x00007fe57a03ab80 (most recent call first):\n'
           '  File "/work/hang_rank1.py", line 9 in <module>\n')
FH_WATCHER = ('Thread 0x00007fe5793f06c0 (most recent call first):\n'
              '  File "/run/_stack_hook/sitecustomize.py", line 313 in loop\n'
              '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap\n\n')
WARNING = ('/torch/_subclasses/functional_tensor.py:279: UserWarning: Failed to initialize '
           'NumPy: No module named \'numpy\'\n  cpu = _conversion_method_template(device=x)\n')


def test_a_dump_is_whole_at_the_main_threads_outermost_frame_whatever_other_threads_wrote():
    """CI, loaded: the rank was descheduled after the watcher thread's block while that thread
    wrote a warning; the dump read then (it held still) had no main thread."""
    assert stacks._dump_state(FH_WATCHER + WARNING) == (True, False)
    assert stacks._dump_state(WARNING) == (False, False)
    assert stacks._dump_state(FH_WATCHER + WARNING + FH_MAIN) == (True, True)
    m = FH_MAIN.replace("<module>", "_run_module_as_main")
    assert stacks._dump_state(FH_WATCHER + m) == (True, True)


def test_a_dump_written_in_pieces_slower_than_a_moment_is_read_whole(tmp_path):
    """A 'rank' that answers SIGUSR1 with a dump in three pieces 0.5 s apart (the watcher's
    block, another thread's warning, then the main thread): the reader waits for the end."""
    rank_dir = tmp_path / "rank0"
    rank_dir.mkdir()
    script = tmp_path / "slow_dump.py"
    script.write_text(
        "import signal, sys, time\n"
        "parts = %r\n"
        "def on(sig, frame):\n"
        "    for p in parts:\n"
        "        sys.stderr.write(p); sys.stderr.flush(); time.sleep(0.5)\n"
        "signal.signal(signal.SIGUSR1, on)\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n" % ([FH_WATCHER, WARNING, FH_MAIN],))
    with open(rank_dir / "stdout.log", "w") as out, open(rank_dir / "stderr.log", "w") as err:
        proc = subprocess.Popen([sys.executable, str(script)], stdout=out, stderr=err)
    try:
        deadline = time.monotonic() + 60
        while "ready" not in (rank_dir / "stdout.log").read_text():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        texts = stacks.faulthandler_dumps({0: (proc.pid, 0)}, {0: str(rank_dir)}, wait_s=30)
    finally:
        proc.kill()
        proc.wait()
    assert texts[0].endswith(FH_MAIN), texts[0]
