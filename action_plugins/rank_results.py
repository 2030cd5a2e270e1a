"""rank_results on a host, then its log files written on the controller under dest/<host>/."""
from __future__ import annotations

import base64
import os

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        dest = args.pop("dest", None)
        remote = self._execute_module(module_name="rank_results", module_args=args,
                                      task_vars=task_vars)
        result.update(remote)
        files = result.pop("files", [])
        if dest and not result.get("failed") and not self._task.check_mode:
            host_dir = os.path.join(dest, task_vars["inventory_hostname"])
            written = []
            for item in files:
                path = os.path.normpath(os.path.join(host_dir, item["path"]))
                if not path.startswith(host_dir + os.sep):
                    continue  # a path that climbs out of the host's directory is not written
                os.makedirs(os.path.dirname(path), mode=0o750, exist_ok=True)
                with open(path, "wb") as f:
                    f.write(base64.b64decode(item["content"]))
                written.append({"path": path, "size": item["size"],
                                "truncated": item["truncated"]})
            result["files"] = written
        result["changed"] = False
        return result
