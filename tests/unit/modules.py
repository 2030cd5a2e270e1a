"""Run a module's main() with arguments and capture what it exits with.

Follows community.general's module tests, with ansible-core 2.19's patch_module_args.
"""
from __future__ import annotations

import json

import pytest
from ansible.module_utils.testing import patch_module_args


class ModuleExit(Exception):
    def __init__(self, result):
        super().__init__(result)
        self.result = result


def run_module(module, args, capsys):
    """Return the JSON result the module printed; failed results have failed=True."""
    with patch_module_args(args), pytest.raises(SystemExit):
        module.main()
    return json.loads(capsys.readouterr().out)
