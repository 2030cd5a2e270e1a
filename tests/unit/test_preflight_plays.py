"""preflight.yml's plays run on their hosts in inventory order: with more hosts than forks the
master's listener is up only if the master's probe runs in the first fork batch. A play not
needed matches no host (a task ending it would cost a play's setup and a task)."""
from __future__ import annotations

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from tests.conftest import COLLECTION

PLAYS = {play["name"]: play["hosts"]
         for play in yaml.safe_load((COLLECTION / "playbooks" / "preflight.yml").read_text())}
# 40 hosts: a set's order (Ansible's `difference` filter) is the inventory's by chance only.
NODES = ["node%d" % i for i in range(40)]


def play_hosts(name, groups, hostvars=None):
    variables = {"groups": groups, "hostvars": hostvars or {"localhost": {}}}
    return Templar(loader=DataLoader(), variables=variables).template(
        trust_as_template(PLAYS[name]))


def test_the_probing_plays_keep_the_inventory_order_less_the_hosts_not_reached():
    groups = {"nodes": NODES, "torchfleet_selected": NODES, "torchfleet_second_round": NODES,
              "torchfleet_perf": NODES, "torchfleet_unreached": ["node0"]}
    probing = [name for name, hosts in PLAYS.items() if "torchfleet_unreached" in str(hosts)]
    assert len(probing) == 3, PLAYS
    for name in probing:
        assert play_hosts(name, groups) == NODES[1:], name
    # Without spares nothing is left out (no group torchfleet_unreached), and the order holds.
    del groups["torchfleet_unreached"]
    for name in probing:
        assert play_hosts(name, groups) == NODES, name


def test_the_plays_of_a_new_master_run_only_when_the_first_decision_asks_for_them():
    retest, decide = ("Preflight | test the chosen hosts against the new master",
                      "Preflight | decide with the new master")
    for facts in ({}, {"preflight_retest_hosts": []}):
        assert play_hosts(retest, {}, {"localhost": facts}) == []
        assert play_hosts(decide, {}, {"localhost": facts}) == []
    # The new master first: its listener is up before the others dial it.
    facts = {"preflight_retest_hosts": NODES[1:5]}
    assert play_hosts(retest, {}, {"localhost": facts}) == NODES[1:5]
    assert play_hosts(decide, {}, {"localhost": facts}) == ["localhost"]
