"""What NCCL really used, from recorded real NCCL INFO logs (tests/fixtures/nccl/README.md
names the public thread each came from), and nccl.transport in a run's report."""
from __future__ import annotations

import json
import shutil

import pytest
from ansible_collections.torchfleet.fleet.plugins.modules import run_summary
from ansible_collections.torchfleet.fleet.plugins.module_utils.host import nccl_log
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import fabric
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.runstate import RunState
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import FIXTURES, examples
from tests.unit.modules import run_module
from torchfleet import html_report
from torchfleet.results import load

NCCL = FIXTURES / "nccl"


def seen(name):
    return nccl_log.summarize(nccl_log.parse((NCCL / name).read_text()))


# file: (network, gdr, socket ranks, version)
RECORDED = {
    "ib-2.5.6-bare-version.log": ("IB", None, [], "2.5.6+cuda10.0"),
    "ib-2.5.6-mpi-prefix.log": ("IB", None, [], None),
    "ib-gdrdma-a100.log": ("IB", True, [], None),
    "gdrdma-2.2x-aks.log": ("IB", True, [], None),
    "ib-gdr-disabled.log": ("IB", False, [], None),
    "roce-2.18.5.log": ("IB", None, [], "2.18.5+cuda12.0"),
    "roce-2.19.3.log": ("IB", None, [], "2.19.3+cuda12.3"),
    "plugin-ibext-v8.log": ("IBext_v8", False, [], None),
    "plugin-ibext-v8-2.22.3.log": ("IBext_v8", None, [], "2.22.3+cuda12.6"),
    "socket-fallback.log": ("Socket", None, [15], None),
    "socket-ib-disabled.log": ("Socket", None, [None, None], None),
    "socket-2.4-shm.log": ("Socket", None, [0], None),
    "init-2.27.6.log": (None, None, [], "2.27.6+cuda13.0"),
}


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_recorded_logs(name):
    got = seen(name)
    assert (got["network"], got["gdr"], got["socket_ranks"], got["version"]) == RECORDED[name]


def test_every_recorded_log_is_in_the_table():
    assert {p.name for p in NCCL.glob("*.log")} == set(RECORDED)


def test_devices_channels_and_gpudirect_per_process():
    (proc,) = nccl_log.parse((NCCL / "plugin-ibext-v8.log").read_text())
    assert (proc["host"], proc["pid"], proc["rank"], proc["nranks"]) == ("bigo", 1884, 2, 3)
    assert proc["plugin"] == "IBext_v8" and proc["net"] == "IBext_v8"
    # The merged-device form ([0]={[0] mlx5_2:1/RoCE, ...}) still names each HCA.
    assert proc["ib_devices"] == ["mlx5_2:1/RoCE", "mlx5_3:1/RoCE", "mlx5_0:1/RoCE",
                                  "mlx5_1:1/RoCE"]
    assert proc["channels"] == {"NET/IBext_v8": 3}
    mixed = seen("ib-2.5.6-mpi-prefix.log")
    assert "mlx5_2:1/RoCE" in mixed["devices"] and mixed["transports"] == {"P2P/IPC": 3}
    disabled = seen("ib-gdr-disabled.log")
    assert disabled["gdr_disabled"] == ["mlx5_1 (no module)", "mlx5_2 (no module)",
                                        "mlx5_3 (no module)"]
    assert seen("socket-2.4-shm.log")["transports"] == {"NET/Socket": 1, "SHM": 2}
    assert nccl_log.describe(seen("ib-gdrdma-a100.log")) == "IB, GDRDMA; NET/IB 12"


def test_transport_of_each_channel_form():
    assert nccl_log.transport_of("NET/IB/0/GDRDMA") == ("NET/IB", True)
    assert nccl_log.transport_of("NET/IB/5") == ("NET/IB", False)
    assert nccl_log.transport_of("NET/IBext_v8/1") == ("NET/IBext_v8", False)
    assert nccl_log.transport_of("NET/Socket/3") == ("NET/Socket", False)
    assert nccl_log.transport_of("P2P/IPC/read") == ("P2P/IPC", None)
    assert nccl_log.transport_of("P2P/CUMEM") == ("P2P/CUMEM", None)
    assert nccl_log.transport_of("SHM/direct/direct") == ("SHM", None)
    assert nccl_log.transport_of("direct shared memory") == ("SHM", None)


def test_nccl_transport_fails_sockets_where_ib_was_expected_and_warns_without_gpudirect():
    per_host = {"a": seen("ib-gdrdma-a100.log"), "b": seen("socket-fallback.log"),
                "c": seen("ib-gdr-disabled.log"), "d": None}
    checks = {c["host"]: c for c in fabric.transport_checks(["a", "b", "c", "d"], per_host,
                                                            "ib", True)}
    assert checks["a"]["ok"]
    assert (checks["b"]["ok"], checks["b"]["severity"]) == (False, "error")
    assert checks["b"]["detail"].startswith("rank(s) 15 used sockets (NET/Socket)")
    assert (checks["c"]["ok"], checks["c"]["severity"]) == (False, "warning")
    assert "mlx5_1 (no module)" in checks["c"]["detail"]
    assert checks["d"]["detail"].startswith("unknown: ")
    # Sockets asked for (ethernet) are what was expected; GPUDirect not wanted is not warned.
    plain = fabric.transport_checks(["b", "c"], per_host, "ethernet", True)
    assert all(c["ok"] for c in plain)
    assert fabric.transport_checks(["c"], per_host, "ib", False)[0]["ok"]


def test_a_runs_report_names_the_host_whose_ranks_fell_back_to_sockets(tmp_path, capsys):
    """A 2-host run's gathered logs: node0's ranks used IB with GPUDirect, node1's sockets."""
    for host, log in (("node0", "ib-gdrdma-a100.log"), ("node1", "socket-fallback.log")):
        dest = tmp_path / "logs" / host / "attempt_0" / "0"
        dest.mkdir(parents=True)
        shutil.copy(NCCL / log, dest / "stdout.log")
    state = RunState("r1", ["node0", "node1"], 1, now=100.0)
    for host in ("node0", "node1"):
        state.beat(host, 101.0)
        state.exited(host, 102.0, 0)
    (tmp_path / "run_state.json").write_text(json.dumps(state.record()))
    summary = run_module(run_summary, {
        "kind": "train", "run_id": "r1", "hosts": ["node0", "node1"], "ranks": {},
        "world_size": 2, "settings": {"nproc_per_node": 1, "network": "ib",
                                      "transport_check": "True", "expect_gdr": True},
        "run_dir": str(tmp_path), "expect_results": False}, capsys)
    assert [(c["id"], c["host"]) for c in summary["failures"]] == [("nccl.transport", "node1")]
    report = json.loads((tmp_path / "train.json").read_text())
    assert [h["transport"]["network"] for h in report["hosts"]] == ["IB", "Socket"]
    assert "NCCL TRANSPORT" in summary["table"] and "IB, GDRDMA; NET/IB 12" in summary["table"]
    assert "nccl.transport" in summary["verdict"]
    page = html_report.render(load(tmp_path))  # the HTML report reads the same record
    assert "<th>NCCL transport</th>" in page and "Socket; NET/Socket 2, P2P/IPC 5" in page
    assert load(tmp_path).hosts[1].transport["socket_ranks"] == [15]  # and the API's Result


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.one_of(
    st.text(max_size=200),
    st.builds(lambda host, pid, msg: "%s:%d:%d [0] NCCL INFO %s" % (host, pid, pid, msg),
              st.text(alphabet="abc-0", max_size=8), st.integers(0, 1 << 40),
              st.one_of(st.text(max_size=120),
                        st.sampled_from(["Channel 00/0 : 0[0] -> 1[0] via NET/IB/0/GDRDMA",
                                         "Using network IB", "NET/IB : Using [0]mlx5_0:1/IB",
                                         "comm 0x1 rank 3 nranks 4", "P2P plugin v8 IBext_v8",
                                         "NCCL version 2.28.3+cuda12.9",
                                         "Channel 00 : 1 -> 0 via NET/",
                                         "GPU Direct RDMA Disabled for HCA 0 'x' (y"])))),
    max_size=30))
def test_any_text_parses_without_raising(lines):
    procs = nccl_log.parse("\n".join(lines))
    nccl_log.describe(nccl_log.summarize(procs))
