"""Run a module's main() with arguments and capture what it exits with.

Follows community.general's module tests, with ansible-core 2.19's patch_module_args.
"""
from __future__ import annotations

import json

import pytest
import yaml
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.command import bounded


class ModuleExit(Exception):
    def __init__(self, result):
        super().__init__(result)
        self.result = result


# What AnsibleModule adds to every result, documented by Ansible, not by each module.
COMMON = {"changed", "failed", "msg", "invocation", "warnings", "deprecations", "skipped",
          "exception"}


def undocumented(module, result):
    """Keys of a module's real result that its RETURN does not document."""
    documented = set(yaml.safe_load(module.RETURN) or {})
    return sorted(set(result) - documented - COMMON)


def run_module(module, args, capsys):
    """Return the JSON result the module printed; failed results have failed=True. A result
    that is not failed must match RETURN: every key it holds is documented there."""
    with patch_module_args(args), pytest.raises(SystemExit):
        module.main()
    result = json.loads(capsys.readouterr().out)
    if not result.get("failed"):
        missing = undocumented(module, result)
        assert not missing, "%s returns %s, not in its RETURN" % (module.__name__, missing)
    return result


def command_runner(timeout_s=20):
    """The command runner a module builds (command.bounded over a real AnsibleModule)."""
    with patch_module_args({}):
        return bounded(AnsibleModule(argument_spec={}), timeout_s)
