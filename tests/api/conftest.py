"""Shared runs for the API, CLI and report tests: each costs a real ansible-runner run of the
embedded default inventory, so the ones several tests read are made once."""
from __future__ import annotations

from lab.ports import free_port

import pytest

import torchfleet



@pytest.fixture(scope="session")
def runs_root(tmp_path_factory):
    return tmp_path_factory.mktemp("api-runs")


@pytest.fixture(scope="session")
def collective_run(runs_root):
    events = []
    result = torchfleet.collective(on_event=events.append, runs_root=runs_root,
                                   master_port=free_port())
    return result, events
