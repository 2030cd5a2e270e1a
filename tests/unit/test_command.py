"""The command runner every module uses (host/command.py): real commands, real `timeout`."""
from __future__ import annotations

from unittest import mock

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args
from ansible_collections.torchfleet.fleet.plugins.module_utils.host import command


def runner(timeout_s=20, env_update=None):
    with patch_module_args({}):
        module = AnsibleModule(argument_spec={})
    module.run_command_environ_update = env_update or {}
    return command.bounded(module, timeout_s)


def test_commands_do_not_go_through_run_command():
    # AnsibleModule.run_command sleeps a second when the command exits between its two looks
    # at the process (seen in node_probe under strace, one probe in three): never used.
    with mock.patch.object(AnsibleModule, "run_command", side_effect=AssertionError("used")):
        for _ in range(5):
            assert runner()(["true"]) == ("", None)


def test_stdin_the_modules_environment_and_argv_as_given():
    run = runner(env_update={"TORCHFLEET_PROBE_X": "7"})
    assert run(["cat"], data="table inet x {}\n") == ("table inet x {}\n", None)
    assert run(["sh", "-c", 'printf %s "$TORCHFLEET_PROBE_X"'])[0] == "7"
    # An argument is one argument, never expanded: no shell, no variables.
    assert run(["printf", "%s", "$HOME; rm -rf /"])[0] == "$HOME; rm -rf /"


def test_missing_failing_and_hung_commands_are_told_apart():
    run = runner()
    out, why = run(["torchfleet-no-such-command"])
    assert out is None and command.missing(why)
    out, why = run(["sh", "-c", "echo broken >&2; exit 3"])
    assert out is None and why == "broken" and why.rc == 3 and not command.missing(why)
    out, why = run(["sleep", "30"], timeout_s=0.5)
    assert out is None and why == "sleep did not answer within 0.5 s" and why.rc is None
