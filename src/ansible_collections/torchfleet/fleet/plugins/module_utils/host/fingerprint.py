"""A fingerprint of a code directory that two hosts can compare file by file."""
from __future__ import annotations

import hashlib
import os

SKIP_DIRS = {".git", "__pycache__", ".venv", "venv", "node_modules", ".mypy_cache",
             ".pytest_cache", "runs"}
SKIP_SUFFIXES = (".pyc", ".pyo")


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _git(run, code_dir, *args):
    return run(["git", "-C", code_dir, *args])[0]


def _walk(code_dir):
    for root, dirs, files in os.walk(code_dir):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            if not name.endswith(SKIP_SUFFIXES):
                yield os.path.relpath(os.path.join(root, name), code_dir)


def fingerprint(code_dir, run, max_files=20000):
    """{exists, git_commit, git_dirty, files: {relpath: sha256}, truncated}.

    In a git checkout the files are those git tracks plus untracked, not ignored ones (so
    checkpoints and caches listed in .gitignore do not count); elsewhere every file below
    code_dir except caches. Hashing contents, not trusting the commit alone, catches an
    edited file on one host.
    """
    if not os.path.isdir(code_dir):
        return {"exists": False, "git_commit": None, "git_dirty": False, "files": {},
                "truncated": False}
    commit = _git(run, code_dir, "rev-parse", "HEAD")
    listing = _git(run, code_dir, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    if commit is not None and listing is not None:
        paths = sorted({p for p in listing.split("\0") if p})
        dirty = bool((_git(run, code_dir, "status", "--porcelain") or "").strip())
    else:
        commit, dirty = None, False
        paths = _walk(code_dir)
    files = {}
    truncated = False
    for rel in paths:
        if len(files) >= max_files:
            truncated = True
            break
        full = os.path.join(code_dir, rel)
        if os.path.isfile(full):
            files[rel] = sha256_file(full)
    return {"exists": True, "git_commit": commit.strip() if commit else None,
            "git_dirty": dirty, "files": files, "truncated": truncated}
