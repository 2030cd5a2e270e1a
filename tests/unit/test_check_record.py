"""One Check record: the Python API's fields are the JSON reports' keys, read by one function
from preflight.json and from the runner's events alike."""
from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path

from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.preflight import check
from torchfleet.results import Check, Result


def test_the_api_check_has_the_json_fields_and_round_trips():
    raw = check("port.blocked", "node1", False, "dropped", "allow TCP 29500")
    assert {f.name for f in fields(Check)} == set(raw)  # id, host, ok, severity, detail, hint, gpu
    c = Check.from_json(raw)
    assert asdict(c) == raw and c.fix == raw["hint"]
    data = Result(kind="preflight", ok=False, run_id="r", run_dir=Path("/tmp/r"),
                  checks=[c]).to_dict()
    assert data["checks"] == [raw] and data["failures"] == [raw]


def test_one_verdict_sentence_for_the_play_the_json_and_the_api(tmp_path):
    from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.report import verdict
    from torchfleet.results import Failure, from_report

    checks = [check("port.blocked", "node1", False, "dropped", "allow TCP 29500"),
              check("code.sync", "node2", False, "differs", "sync it"),
              check("port.blocked", "node2", False, "dropped", "allow TCP 29500"),
              check("nic.route", "node0", True)]
    sentence = verdict("preflight", checks)
    assert sentence == "preflight failed: 3 problem(s) on node1, node2 (port.blocked, code.sync)"
    result = from_report("preflight", {"ok": False, "checks": checks, "verdict": sentence},
                         tmp_path)
    assert result.verdict == sentence and result.to_dict()["verdict"] == sentence
    failure = {"host": "node1", "rank": 3, "reason": "rank 3 exited with 1", "tail": "..."}
    run = Result(kind="train", ok=False, run_id="r", run_dir=tmp_path,
                 first_failure=Failure(**failure))
    assert run.verdict == verdict("train", [], failure) == (
        "train failed: first failure on node1, rank 3: rank 3 exited with 1")
    assert verdict("collective", checks[3:]) == "collective ok: 1 check(s) passed on 1 host(s)"
