"""One Check record: the Python API's fields are the JSON reports' keys, read by one function
from preflight.json and from the runner's events alike."""
from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path

from ansible.module_utils.torchfleet.preflight import check
from torchfleet.results import Check, Result


def test_the_api_check_has_the_json_fields_and_round_trips():
    raw = check("port.blocked", "node1", False, "dropped", "allow TCP 29500")
    assert {f.name for f in fields(Check)} == set(raw)  # id, host, ok, severity, detail, hint
    c = Check.from_json(raw)
    assert asdict(c) == raw and c.fix == raw["hint"]
    data = Result(kind="preflight", ok=False, run_id="r", run_dir=Path("/tmp/r"),
                  checks=[c]).to_dict()
    assert data["checks"] == [raw] and data["failures"] == [raw]
