"""preflight.yml's plays run on their hosts in inventory order: with more hosts than forks the
master's listener is up only if the master's probe runs in the first fork batch."""
from __future__ import annotations

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from tests.conftest import COLLECTION

PLAYBOOK = COLLECTION / "playbooks" / "preflight.yml"


def play_hosts(pattern, groups):
    return Templar(loader=DataLoader(), variables={"groups": groups}).template(
        trust_as_template(pattern))


def test_every_templated_play_keeps_the_inventory_order_less_the_hosts_not_reached():
    # 40 hosts: a set's order (a `difference` filter) is the inventory's by chance only.
    nodes = ["node%d" % i for i in range(40)]
    groups = {"nodes": nodes, "torchfleet_selected": nodes, "torchfleet_second_round": nodes,
              "torchfleet_perf": nodes, "torchfleet_master_candidates": nodes[:3],
              "torchfleet_unreached": ["node0"]}
    templated = [play["hosts"] for play in yaml.safe_load(PLAYBOOK.read_text())
                 if "{{" in str(play["hosts"])]
    assert len(templated) >= 4, templated
    for pattern in templated:
        hosts = play_hosts(pattern, groups)
        if hosts != nodes[:3]:  # the reach play: every host that may be the master
            assert hosts == nodes[1:], (pattern, hosts)
    # Without spares nothing is left out (no group torchfleet_unreached), and the order holds.
    del groups["torchfleet_unreached"]
    for pattern in templated[1:]:
        assert play_hosts(pattern, groups) == nodes, pattern
