"""rank_results on a host, then its log files written on the controller under dest/<host>/."""
from __future__ import annotations

import base64
import os

from ansible.plugins.action import ActionBase

from ansible_collections.torchfleet.fleet.plugins.module_utils.run.rundir import RANK_RESULTS_SPEC


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        self.validate_argument_spec(argument_spec=RANK_RESULTS_SPEC)  # fails the task, naming it
        args = dict(self._task.args)  # as given: run_dir is the host's path, expanded there
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
        return result
