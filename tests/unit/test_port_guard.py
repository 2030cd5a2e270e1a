"""port_guard and its ruleset: values checked before nft sees them; as root, a real table in a
network namespace of its own (so no rule of the test touches this machine's traffic)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from ansible_collections.torchfleet.fleet.plugins.modules import port_guard
import pytest
from ansible_collections.torchfleet.fleet.plugins.module_utils.host import net
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import guard

from tests.unit.modules import run_module

RUN_ID = "20261124-103000-abcd"


def test_the_ruleset_lets_only_the_runs_hosts_in_and_names_its_table_by_the_run():
    text = guard.ruleset(RUN_ID, [29500, 51234], ["10.77.0.1", "10.77.0.2", "fd00::2"])
    assert "table inet torchfleet_guard_20261124_103000_abcd {" in text
    assert "elements = { 10.77.0.1, 10.77.0.2, 127.0.0.0/8 }" in text
    assert "elements = { ::1, fd00::2 }" in text
    assert "tcp dport { 29500, 51234 } reject with tcp reset" in text
    listing = ("table inet filter\ntable inet torchfleet_guard_20261124_103000_abcd\n"
               "table inet torchfleet_guard_other\n")
    assert guard.ours(listing, RUN_ID) == ["torchfleet_guard_20261124_103000_abcd"]
    assert guard.ours(listing) == ["torchfleet_guard_20261124_103000_abcd",
                                   "torchfleet_guard_other"]


def test_the_ephemeral_range_is_guarded_for_new_connections_only():
    """A worker's guard: no port of the master, its ephemeral range for new connections only
    (a reply to a connection this host opened comes to a port of that range, and passes)."""
    text = guard.ruleset(RUN_ID, [], ["10.77.0.1"], (32768, 60999))
    assert "tcp dport 32768-60999 ct state new ip saddr @run_hosts_v4 accept" in text
    assert "tcp dport 32768-60999 ct state new reject with tcp reset" in text
    assert "tcp dport {" not in text
    with pytest.raises(ValueError, match="no port to guard"):
        guard.ruleset(RUN_ID, [], ["10.77.0.1"])
    assert net.ephemeral_range() is None or net.ephemeral_range()[0] > 1023
    assert net.ephemeral_range("/nonexistent") is None


@pytest.mark.parametrize("run_id, ports, allow, says", [
    ("x; flush ruleset", [29500], ["10.0.0.1"], "cannot name a guard table"),
    (RUN_ID, [0], ["10.0.0.1"], "is not a TCP port"),
    (RUN_ID, [29500], ["10.0.0.1 } ; flush ruleset"], "is not an IP address"),
])
def test_a_value_that_could_reach_nft_as_syntax_is_refused(run_id, ports, allow, says):
    with pytest.raises(ValueError, match=says):
        guard.ruleset(run_id, ports, allow)


def _in_netns(ns, argv, **kw):
    return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True,
                          **kw)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("nft") or not shutil.which("ip"),
                    reason="needs root, nft and ip (CI has them)")
def test_present_then_absent_in_a_namespace_of_its_own(tmp_path):
    ns = "tfunitguard%d" % os.getpid()
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        # The module runs inside the namespace, as it runs on the master over SSH.
        boot = tmp_path / "boot.py"
        boot.write_text(
            "import json, sys\n"
            "from ansible.module_utils.testing import patch_module_args\n"
            "from ansible_collections.torchfleet.fleet.plugins.modules import port_guard\n"
            "with patch_module_args(json.loads(sys.argv[1])):\n"
            "    port_guard.main()\n")

        def module(args):
            out = _in_netns(ns, [sys.executable, str(boot), __import__("json").dumps(args)])
            return __import__("json").loads(out.stdout)

        first = module({"run_id": RUN_ID, "ports": [29500], "allow": ["10.77.0.2"]})
        assert first["changed"] and first["table"] == guard.table_name(RUN_ID), first
        again = module({"run_id": RUN_ID, "ports": [29500], "allow": ["10.77.0.2"]})
        assert not again["changed"]
        listed = _in_netns(ns, ["nft", "list", "table", "inet", first["table"]]).stdout
        assert "tcp dport 29500 reject with tcp reset" in listed
        gone = module({"state": "absent", "run_id": RUN_ID})
        assert gone["removed"] == [first["table"]] and gone["changed"]
        assert "torchfleet_guard" not in _in_netns(ns, ["nft", "list", "tables"]).stdout
    finally:
        subprocess.run(["ip", "netns", "delete", ns], check=False)


def test_a_bad_value_fails_in_one_sentence_and_changes_nothing(capsys):
    res = run_module(port_guard, {"run_id": RUN_ID, "ports": [70000], "allow": []}, capsys)
    assert res["failed"] and res["msg"] == ("guard_ports: port 70000 is not a TCP port; nothing "
                                            "was changed")
