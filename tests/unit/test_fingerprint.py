"""code_dir fingerprints: git checkouts and plain trees."""
from __future__ import annotations

import subprocess

from ansible_collections.torchfleet.fleet.plugins.module_utils.host.fingerprint import fingerprint as fingerprint_with

from tests.unit.modules import command_runner


def fingerprint(code_dir, **kwargs):
    return fingerprint_with(code_dir, command_runner(), **kwargs)


def make_tree(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def git(root, *args):
    subprocess.run(["git", "-C", str(root), "-c", "user.email=t@t", "-c", "user.name=t", *args],
                   check=True, capture_output=True)


def test_plain_tree_hashes_every_file_but_caches(tmp_path):
    make_tree(tmp_path, {"train.py": "a", "pkg/model.py": "b", "__pycache__/x.pyc": "c",
                         "pkg/y.pyc": "d"})
    fp = fingerprint(str(tmp_path))
    assert fp["exists"] and fp["git_commit"] is None
    assert sorted(fp["files"]) == ["pkg/model.py", "train.py"]


def test_same_content_same_fingerprint_and_an_edit_shows(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    make_tree(a, {"train.py": "x = 1\n"})
    make_tree(b, {"train.py": "x = 1\n"})
    assert fingerprint(str(a))["files"] == fingerprint(str(b))["files"]
    (b / "train.py").write_text("x = 2\n")
    assert fingerprint(str(a))["files"] != fingerprint(str(b))["files"]


def test_git_checkout_reports_commit_dirty_and_skips_ignored(tmp_path):
    make_tree(tmp_path, {"train.py": "a", ".gitignore": "ckpt/\n", "ckpt/big.pt": "weights"})
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "init")
    fp = fingerprint(str(tmp_path))
    assert len(fp["git_commit"]) == 40 and fp["git_dirty"] is False
    assert sorted(fp["files"]) == [".gitignore", "train.py"]
    (tmp_path / "new.py").write_text("untracked")
    fp = fingerprint(str(tmp_path))
    assert fp["git_dirty"] is True and "new.py" in fp["files"]


def test_missing_dir_and_truncation(tmp_path):
    assert fingerprint(str(tmp_path / "nope"))["exists"] is False
    make_tree(tmp_path, {"%d.py" % i: str(i) for i in range(5)})
    fp = fingerprint(str(tmp_path), max_files=3)
    assert fp["truncated"] and len(fp["files"]) == 3
