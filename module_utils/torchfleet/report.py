"""Run directories on the controller: one JSON report per playbook and runs/latest."""
from __future__ import annotations

import json
import os
import tempfile


def write_report(run_dir, name, data, runs_root=None):
    """Write run_dir/name atomically (0640, directory 0750); point runs_root/latest at run_dir.

    Returns the report's path. The rename makes a reader never see half a report.
    """
    os.makedirs(run_dir, mode=0o750, exist_ok=True)
    path = os.path.join(run_dir, name)
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix="." + name)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
        os.chmod(tmp, 0o640)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    if runs_root:
        link = os.path.join(runs_root, "latest")
        tmp_link = link + ".tmp%d" % os.getpid()
        os.symlink(os.path.relpath(run_dir, runs_root), tmp_link)
        os.replace(tmp_link, link)
    return path
