"""The lookup torchfleet.fleet.default, the one reader of public variables in the plays: the
play's value, else the default; in a play that continues a detached run from its record
(attach.yml's restart), the recorded value first, whatever the play's inventory says."""
from __future__ import annotations

import pytest
from ansible.errors import AnsibleError
from ansible.template import Templar
from ansible.parsing.dataloader import DataLoader

from ansible_collections.torchfleet.fleet.plugins.lookup.default import LookupModule
from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.detach import SETTINGS


def lookup(names, variables, **kwargs):
    return LookupModule(templar=Templar(loader=DataLoader())).run(names, variables, **kwargs)


def test_the_plays_value_else_the_one_default():
    assert lookup(["lease_s", "master_port"], {"lease_s": 60}) == [60, defaults.default(
        "master_port")]
    assert lookup(["poll_s"], {}) == [defaults.TIMINGS["poll_s"]]


def test_a_default_computed_where_used_comes_from_the_caller():
    assert lookup(["nnodes"], {}, default=4) == [4]
    assert lookup(["nnodes"], {"nnodes": 2}, default=4) == [2]


def test_a_runs_recorded_settings_come_before_the_plays_inventory():
    # ansible.cfg's default inventory (inventory/local.yml) sets master_addr for hosts that
    # may bear the run's hosts' names: a restart must not take it.
    recorded = {"master_addr": "", "max_restarts": 2, "control_port": None}
    variables = {SETTINGS: recorded, "master_addr": "127.0.0.1", "max_restarts": 0}
    assert lookup(["master_addr", "max_restarts", "lease_s"], variables) == [
        "", 2, defaults.default("lease_s")]
    assert lookup(["control_port"], variables, default=29501) == [29501]
    # A record's settings that are no mapping are ignored.
    assert lookup(["max_restarts"], {SETTINGS: "junk", "max_restarts": 1}) == [1]


def test_an_unknown_name_is_an_error_that_names_it():
    with pytest.raises(AnsibleError, match="nosuch is neither a public variable"):
        lookup(["nosuch"], {})
