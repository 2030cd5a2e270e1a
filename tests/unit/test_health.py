"""Node health (issue 36): every parser against RECORDED real outputs of nvidia-smi, the kernel
log and amd-smi (tests/fixtures/health/README.md names where each was recorded: leptonai/gpud's
testdata from H100, A10, RTX 4090, TITAN V and A100 hosts; x7even/roctop's and a published
amd-smi session of Radeon GPUs), the rules that read them, and Hypothesis for any text.

Where no recording of a fault exists (an uncorrected ECC count, an inactive NVLink, a fabric
not ready, HW slowdown), the test changes one value of a recorded file and says which."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ansible_collections.torchfleet.fleet.plugins.module_utils.host import health, perf, smi, xid
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import health_checks
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import plan
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.connect import connect
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.listener import start_listener, stop_listener
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.records import ERROR, WARNING
from tests.conftest import FIXTURES, examples
from torchfleet import health_cli

REC = FIXTURES / "health"
LIMITS = {"health_ecc_corrected_max": 10000, "health_disk_min_gb": 10.0}


def text(name):
    return (REC / name).read_text()


def verdicts(files, window_s=7200, host="gpu7"):
    return health_checks.checks(host, health.facts(files, window_s), LIMITS)


def bad(records):
    return [(r["id"], r["severity"], r.get("gpu"), r["detail"]) for r in records if not r["ok"]]


# -- nvidia-smi -q, recorded ----------------------------------------------------------------------

def of(records, cid):
    return [r for r in bad(records) if r[0] == cid]


def test_a_recorded_h100_hgx_its_fields_and_the_faults_it_really_had():
    gpus = smi.parse_smi_q(text("nvidia-smi-q.h100x8.txt"))
    assert len(gpus) == 8 and gpus[0]["bus_id"] == "00000000:53:00.0"
    assert {(g["pcie_width"], g["pcie_width_max"], g["fabric_state"], g["fabric_status"],
             g["ecc_uncorrected"], g["remap_pending"]) for g in gpus} == \
        {(16, 16, "Completed", "Success", 0, False)}
    records = verdicts({"nvidia-smi-q.txt": text("nvidia-smi-q.h100x8.txt"),
                        "fabricmanager.txt": "active"})
    # Recorded as it was: GPU 2 held down by HW power brake and SW thermal slowdown, with a
    # python process on it.
    assert bad(records) == [
        ("gpu.throttle", WARNING, 2, "GPU 2 (00000000:75:00.0): clocks held down by HW Power "
                                     "Brake Slowdown, SW Thermal Slowdown"),
        ("gpu.busy", ERROR, 2, "GPU 2 (00000000:75:00.0) held by pid 1002127 (python, user ?, "
                               "9212 MiB)")]
    assert {r["id"] for r in records if r["ok"]} >= {"gpu.smi", "gpu.ecc", "gpu.remap", "gpu.pcie"}


def test_a_recorded_pending_row_remap_fails_naming_the_gpu():
    records = verdicts({"nvidia-smi-q.txt": text("nvidia-smi-q.a10-remap-pending.txt")})
    assert bad(records) == [("gpu.remap", ERROR, 0, "GPU 0 (00000000:07:00.0): row remapping "
                                                     "pending (4 uncorrectable)")]
    assert "nvidia-smi -r -i 0" in [r for r in records if r["id"] == "gpu.remap"][0]["hint"]


def test_recorded_processes_holding_gpus_fail_gpu_busy_with_pid_user_and_mib():
    facts = health.facts({"nvidia-smi-q.txt": text("nvidia-smi-q.rtx4090x8-process.txt")}, 7200,
                         users=lambda pids: {pid: "alice" for pid in pids})
    busy = [r for r in health_checks.checks("gpu7", facts, LIMITS) if r["id"] == "gpu.busy"]
    assert busy[0]["gpu"] == 0 and not busy[0]["ok"]
    assert "pid 58130 (python, user alice, 20322 MiB)" in busy[0]["detail"]


def test_sw_power_cap_and_idle_are_not_throttling():
    recorded = text("nvidia-smi-q.rtx4090x8-powercap.txt")
    gpus = smi.parse_smi_q(recorded)
    assert gpus[1]["clock_events"] == ["SW Power Cap"]
    assert of(verdicts({"nvidia-smi-q.txt": recorded}), "gpu.throttle") == []


def test_the_older_ecc_layout_and_graphics_processes():
    # TITAN V: Single Bit / Double Bit totals (N/A here), Remapped Rows N/A, persistence off,
    # Xorg and gnome-shell (graphics contexts) on the GPU.
    gpus = smi.parse_smi_q(text("nvidia-smi-q.titanv.txt"))
    assert (gpus[0]["ecc_uncorrected"], gpus[0]["remap_pending"]) == (None, None)
    assert [p["type"] for p in gpus[0]["processes"]] == ["G", "G", "G"]
    assert bad(verdicts({"nvidia-smi-q.txt": text("nvidia-smi-q.titanv.txt")})) == [
        ("gpu.persistence", WARNING, 0, "GPU 0 (00000000:01:00.0): persistence mode off (every "
                                        "start loads the driver's state again)")]


def test_uncorrected_ecc_fails_and_corrected_over_the_threshold_warns():
    # Changed from the recorded H100 output: GPU 0's volatile DRAM counts.
    recorded = text("nvidia-smi-q.h100x8.txt")
    edited = recorded.replace("            DRAM Uncorrectable            : 0",
                              "            DRAM Uncorrectable            : 2", 1)
    assert of(verdicts({"nvidia-smi-q.txt": edited}), "gpu.ecc")[0][:3] == ("gpu.ecc", ERROR, 0)
    edited = recorded.replace("            DRAM Correctable              : 0",
                              "            DRAM Correctable              : 20001", 1)
    assert of(verdicts({"nvidia-smi-q.txt": edited}), "gpu.ecc") == [
        ("gpu.ecc", WARNING, 0, "GPU 0 (00000000:53:00.0): 20001 corrected ECC errors "
                                "(threshold 10000)")]


def test_a_fabric_not_ready_or_a_stopped_fabric_manager_fails():
    recorded = text("nvidia-smi-q.h100x8.txt")
    edited = recorded.replace("State                             : Completed",
                              "State                             : In Progress", 1)
    assert of(verdicts({"nvidia-smi-q.txt": edited}), "gpu.fabric")[0][:3] == \
        ("gpu.fabric", ERROR, 0)
    stopped = of(verdicts({"nvidia-smi-q.txt": recorded, "fabricmanager.txt": "inactive"}),
                 "gpu.fabric")
    assert stopped == [("gpu.fabric", ERROR, None,
                        "nvidia-fabricmanager is inactive on an NVSwitch system")]
    # Without systemd the state is unknown: not a fault.
    assert of(verdicts({"nvidia-smi-q.txt": recorded, "fabricmanager.txt": "unknown"}),
              "gpu.fabric") == []


@pytest.mark.parametrize("rc, meaning", [("15", "fallen off the bus"), ("14", "infoROM"),
                                         ("9", "driver is not loaded"), ("12", "NVML"),
                                         ("timeout", "did not answer in time")])
def test_a_failing_nvidia_smi_is_named_with_what_its_exit_status_means(rc, meaning):
    records = verdicts({"nvidia-smi-rc.txt": rc, "nvidia-smi-error": "Unable to determine"})
    assert [r["id"] for r in records if not r["ok"]] == ["gpu.smi"]
    assert meaning in records[0]["detail"]


def test_nvlink_all_active_recorded_and_one_inactive_link_fails():
    recorded = text("nvidia-smi-nvlink.a100x8.txt")
    links = smi.parse_nvlink_status(recorded)
    assert sorted(links) == list(range(8)) and all(len(v) == 12 for v in links.values())
    smi_q = text("nvidia-smi-q.h100x8.txt")
    assert of(verdicts({"nvidia-smi-q.txt": smi_q, "nvidia-smi-nvlink.txt": recorded}),
              "gpu.nvlink") == []
    # Changed from the recording: GPU 2's link 3 down.
    lines = recorded.split("\n")
    gpu2 = lines.index(next(line for line in lines if line.startswith("GPU 2:")))
    lines[gpu2 + 4] = "\t Link 3: <inactive>"
    failed = of(verdicts({"nvidia-smi-q.txt": smi_q, "nvidia-smi-nvlink.txt": "\n".join(lines)}),
                "gpu.nvlink")
    assert failed == [("gpu.nvlink", ERROR, 2, "GPU 2 (00000000:75:00.0): NVLink 3 inactive")]


# -- the kernel log's Xids, recorded ---------------------------------------------------------------

def test_recorded_xid_119_drains_the_host_and_counts_each_time():
    records = verdicts({"dmesg.txt": text("dmesg-T.xid119.txt"),
                        "nvidia-smi-q.txt": text("nvidia-smi-q.h100x8.txt")})
    xids = [r for r in records if r["id"] == "gpu.xid"]
    assert len(xids) == 1 and not xids[0]["ok"] and xids[0]["severity"] == ERROR
    assert xids[0]["detail"].startswith("Xid 119 on PCI 0000:9b:00, 5 time(s) in the last 2 h: "
                                        "GSP RPC timeout")


def test_recorded_xid_13_is_an_application_error_a_warning():
    events = xid.parse_xids(text("dmesg-iso.xid13.txt"))
    assert {(e["code"], e["kind"], e["pci"], e["clock"]) for e in events} == \
        {(13, "application", "0000:38:00", "wall"), (43, "application", "0000:38:00", "wall")}
    records = verdicts({"dmesg.txt": text("dmesg-iso.xid13.txt"),
                        "nvidia-smi-q.txt": text("nvidia-smi-q.a10-remap-pending.txt")})
    assert [(r["severity"], r["ok"]) for r in records if r["id"] == "gpu.xid"] == \
        [(WARNING, False)] * 2


def test_xid_classes_follow_nvidias_catalog_in_preflight_too():
    # Issue 57: a row remap pending (63, recorded) and a high single-bit ECC rate (92) no longer
    # fail gpu.xid; an unrecovered ECC error (140) does, and so does an unknown code whose line
    # says the GPU must be reset. Raw dmesg lines; 63's is a recorded one.
    row_remap = (FIXTURES / "kmsg" / "xid63.ml-engineering.txt").read_text().strip()
    log = "\n".join("[ 1843.30814%d] %s" % (i, line) for i, line in enumerate([
        row_remap,
        "NVRM: Xid (PCI:0000:5d:00): 92, pid='<unknown>', name=<unknown>, made here",
        "NVRM: Xid (PCI:0000:b3:00): 140, pid='<unknown>', name=<unknown>, made here",
        "NVRM: Xid (PCI:0000:c3:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 "
        "(GPU Reset Required)"]))
    records = verdicts({"dmesg.txt": log, "uptime.txt": "1900.0 1.0",
                        "nvidia-smi-q.txt": text("nvidia-smi-q.h100x8.txt")})
    assert sorted((r["detail"].split(" on ")[0], r["severity"]) for r in records
                  if r["id"] == "gpu.xid") == [
        ("Xid 140", ERROR), ("Xid 154", ERROR), ("Xid 63", WARNING), ("Xid 92", WARNING)]


def test_the_window_keeps_recent_xids_only():
    # A raw dmesg line (seconds since boot) in the kernel's own form, and /proc/uptime.
    line = "[ 1843.308145] NVRM: Xid (PCI:0000:b3:00): 79, pid=1, GPU has fallen off the bus."
    assert [e["code"] for e in xid.within(xid.parse_xids(line), 7200, uptime_s=3000.0)] == [79]
    assert xid.within(xid.parse_xids(line), 7200, uptime_s=10000.0) == []
    # The recorded -T log: its last line stands for "now" without a reference.
    events = xid.parse_xids(text("dmesg-T.xid119.txt"))
    assert len(xid.within(events, 60)) == 1  # 16:30:13 only; the others are minutes earlier
    assert xid.within(events, 7200, now_wall=events[-1]["at"] + 3 * 3600) == []


def test_a_kernel_log_the_user_may_not_read_is_said_not_crashed():
    facts = health.facts({"nvidia-smi-q.txt": text("nvidia-smi-q.h100x8.txt"),
                          "dmesg-error": "dmesg: read kernel buffer failed: Operation not "
                                         "permitted; journalctl -k: nothing readable"}, 7200)
    xids = [r for r in health_checks.checks("gpu7", facts, LIMITS) if r["id"] == "gpu.xid"]
    assert [(r["ok"], r["severity"]) for r in xids] == [(False, WARNING)]
    assert "Operation not permitted" in xids[0]["detail"] and "dmesg_restrict" in xids[0]["hint"]


# -- amd-smi, recorded ------------------------------------------------------------------------------

def test_a_recorded_amd_link_at_x8_of_x16_fails_gpu_pcie():
    records = verdicts({"amd-smi-metric.json": text("amd-smi-metric.rx6600-x8.json"),
                        "amd-smi-static.json": text("amd-smi-static.rx6600.json")})
    assert bad(records) == [("gpu.pcie", ERROR, 0, "GPU 0 (0000:0b:00.0) at PCIe x8, capable of x16")]


def test_recorded_amd_ecc_and_processes():
    records = verdicts({"amd-smi-metric.json": text("amd-smi-metric-ecc.mi-x4.json"),
                        "amd-smi-static.json": text("amd-smi-static.x4.json"),
                        "amd-smi-process.json": text("amd-smi-process.x4.json")})
    assert [(r[0], r[2]) for r in bad(records)] == [("gpu.busy", n) for n in range(4)]
    assert "pid 1882331 (python3.12" in bad(records)[0][3]
    # Changed from the recording: GPU 3's uncorrectable count.
    data = json.loads(text("amd-smi-metric-ecc.mi-x4.json"))
    data["gpu_data"][3]["ecc"]["total_uncorrectable_count"] = 7
    failed = bad(verdicts({"amd-smi-metric.json": json.dumps(data)}))
    assert failed[0][:3] == ("gpu.ecc", ERROR, 3) and "7 uncorrected" in failed[0][3]


def test_amd_xgmi_errors_and_pending_bad_pages():
    metric = [{"gpu": 0, "xgmi_err": "XGMI_STATUS_ERROR", "ecc": {}},
              {"gpu": 1, "xgmi_err": "XGMI_STATUS_NO_ERRORS"}]
    pages = [{"gpu": 1, "retired": [{"page_address": "0x1", "status": "PENDING"}]}]
    failed = bad(verdicts({"amd-smi-metric.json": json.dumps(metric),
                           "amd-smi-bad-pages.json": json.dumps(pages)}))
    assert [(f[0], f[2]) for f in failed] == [("gpu.xgmi", 0), ("gpu.retired_pages", 1)]


# -- the host ---------------------------------------------------------------------------------------

def test_memlock_matters_with_rdma_only():
    files = {"ulimit-l.txt": "65536\n", "infiniband.txt": "mlx5_0\nmlx5_1"}
    assert bad(verdicts(files))[0][:2] == ("host.memlock", ERROR)
    assert bad(verdicts(dict(files, **{"ulimit-l.txt": "unlimited"}))) == []
    assert verdicts({"ulimit-l.txt": "65536"}) == []


def test_peermem_is_a_warning_on_nvidia_hosts_with_rdma():
    files = {"nvidia-smi-q.txt": text("nvidia-smi-q.h100x8.txt"), "infiniband.txt": "mlx5_0",
             "modules.txt": "nvidia_uvm 1 0 - Live 0x0\nnvidia 1 1 nvidia_uvm, Live 0x0\n",
             "ulimit-l.txt": "unlimited"}
    assert [(f[0], f[1]) for f in of(verdicts(files), "gpu.peermem")] == [("gpu.peermem", WARNING)]
    files["modules.txt"] += "nvidia_peermem 16384 0 - Live 0x0\n"
    assert of(verdicts(files), "gpu.peermem") == []


def test_disk_free_space_where_the_run_writes():
    df = ("Filesystem 1024-blocks Used Available Capacity Mounted on\n"
          "/scratch/ckpt 1000000000 999000000 1000000 99% /scratch\n")
    assert bad(verdicts({"df.txt": df})) == [
        ("host.disk", ERROR, None, "/scratch/ckpt: 1.0 GiB free on the filesystem of /scratch "
                                   "(need 10 GiB)")]


def test_the_clock_off_the_fleet_is_named_even_when_it_is_the_masters():
    def offsets(values):
        return {h: {"offset_s": v, "uncertainty_s": 0.01} for h, v in values.items()}

    records = health_checks.clock_checks(offsets({"m": 0.0, "a": 0.01, "b": -0.02, "c": 5.0}), "m", 2.0)
    assert [(r["host"], r["ok"]) for r in records] == [("m", True), ("a", True), ("b", True),
                                                       ("c", False)]
    # Every worker reads the same offset against the master: the master is the odd one.
    records = health_checks.clock_checks(offsets({"m": 0.0, "a": -10.0, "b": -10.1, "c": -9.9}), "m", 2.0)
    assert [r["host"] for r in records if not r["ok"]] == ["m"]
    # A reading whose uncertainty covers the gap names nobody.
    wide = {"m": {"offset_s": 0.0, "uncertainty_s": 0.0},
            "a": {"offset_s": 0.0, "uncertainty_s": 0.0},
            "b": {"offset_s": 2.5, "uncertainty_s": 1.0}}
    assert all(r["ok"] for r in health_checks.clock_checks(wide, "m", 2.0))


def test_the_listener_sends_its_clock_and_a_worker_measures_the_offset():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    listener = start_listener([port], expect=1, idle_s=10, address="127.0.0.1")
    try:
        result = connect("127.0.0.1", port, timeout_s=3, retry_s=3)
    finally:
        stop_listener(listener["pid"], 2)
    assert result["ok"] and result["clock"] is not None
    assert abs(result["clock"]["offset_s"]) <= result["clock"]["uncertainty_s"] + 0.05


@pytest.mark.parametrize("sent", [b"", b"SSH-2.0-OpenSSH_9.6\r\n", b"TFCLK nan\n",
                                  b"TFCLK 1e300\n", b"TFCLK \xff\xfe\n", b"x" * 4096])
def test_a_port_held_by_another_program_gives_no_clock_and_no_error(sent):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def answer():
        conn, _ = server.accept()
        if sent:
            conn.sendall(sent)
        conn.close()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    result = connect("127.0.0.1", server.getsockname()[1], timeout_s=3)
    thread.join(5)
    server.close()
    assert result["ok"] and result["clock"] is None


# -- input -------------------------------------------------------------------------------------------

def test_bad_levels_and_thresholds_are_one_sentence_each_before_any_host():
    params = {"health": "deep", "health_slow_pct": "fast", "health_xid_window_s": 1.5,
              "health_floors": {"H100": {"tflops": "lots"}}}
    errors = plan.health_errors(params)
    assert [e["id"] for e in errors] == ["input.health"] * 4
    assert errors[0]["detail"] == "health=deep is not a level"
    assert "health_slow_pct=fast is not a number >= 0" in errors[1]["detail"]
    assert plan.health_errors({"health": "full", "health_floors": {"H100": {"tflops": 600}}}) == []


# -- health=full ---------------------------------------------------------------------------------------

def device(value, gbps=100.0, name="NVIDIA H100 80GB HBM3", index="0"):
    return {"device": index, "name": name, "tflops": value, "gbps": gbps, "late_s": 0.0,
            "dtype": "bfloat16"}


def test_a_gpu_more_than_the_threshold_below_the_fleet_median_is_named():
    results = {"n%d" % h: {"devices": [device(746.0, index=str(g)) for g in range(8)]}
               for h in range(4)}
    results["n2"]["devices"][3] = device(612.0, index="3")
    records = perf.compare(results, 10.0)
    assert [(r["host"], r.get("gpu"), r["detail"]) for r in records if not r["ok"]] == [
        ("n2", 3, "GPU 3: 612 TFLOPS bfloat16, 18 % below the fleet median 746")]
    floors = perf.compare(results, 10.0, {"H100": {"tflops": 700}})
    assert sorted(r["host"] for r in floors if not r["ok"]) == ["n2"]
    assert perf.compare(results, 20.0) == [r for r in perf.compare(results, 20.0) if r["ok"]]


def test_two_devices_are_not_compared_and_models_are_not_mixed():
    results = {"a": {"devices": [device(700.0)]}, "b": {"devices": [device(300.0)]}}
    assert all(r["ok"] for r in perf.compare(results, 10.0))
    mixed = {h: {"devices": [device(700.0)]} for h in "abc"}
    mixed["d"] = {"devices": [device(300.0, name="NVIDIA A100-SXM4-80GB")]}
    assert all(r["ok"] for r in perf.compare(mixed, 10.0))


def test_a_failed_measurement_is_the_hosts_check():
    records = perf.compare({"a": {"devices": [], "gpus": 8, "error": "device 3: CUDA error"}}, 10)
    assert [(r["id"], r["ok"]) for r in records] == [("gpu.perf", False)]


@given(st.text(max_size=400))
@settings(max_examples=examples(200), deadline=None)
def test_the_measurements_answer_is_checked_before_use(garbage):
    parsed, error = perf.parse_lines(garbage)
    assert all(0 <= p[k] < 1e7 for p in parsed for k in ("tflops", "gbps"))
    assert error is None or isinstance(error, str)


def plain_run(argv):
    """command.bounded's contract, without a module: (stdout, None) or (None, why)."""
    env = dict(os.environ, **{perf.PROGRAM_ENV: perf.MEASURE})
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    return (proc.stdout, None) if proc.returncode == 0 else (None, proc.stderr[-300:])


def test_the_measurement_runs_for_real_on_this_cpu_once_per_device_at_once():
    from ansible_collections.torchfleet.fleet.plugins.modules.health_perf import measure

    # Several devices: one process each, started together; two CPU ones stand for two GPUs,
    # and a GPU index this machine does not have is that device's error.
    results, error = measure(plain_run, sys.executable, ["cpu", "cpu", "7"], time.time())
    assert [r["device"] for r in results] == ["cpu", "cpu"] and error.startswith("device 7: ")
    assert all(r["tflops"] > 0 and r["gbps"] > 0 and r["name"] for r in results)


# -- torchfleet health --from DIR -------------------------------------------------------------------

def bundle(tmp_path, **files):
    for name, source in files.items():
        shutil.copy(REC / source, tmp_path / name.replace("_", "-").replace("-txt", ".txt")
                    .replace("-json", ".json"))
    return tmp_path


def cli(*argv):
    return subprocess.run([sys.executable, "-m", "torchfleet.cli", "health", *argv],
                          capture_output=True, text=True, timeout=60)


def test_the_cli_reads_a_saved_bundle_and_exits_non_zero_on_a_failure(tmp_path):
    bundle(tmp_path, nvidia_smi_q_txt="nvidia-smi-q.a10-remap-pending.txt",
           dmesg_txt="dmesg-T.xid119.txt")
    out = cli("--from", str(tmp_path), "--host", "cqnode5")
    assert out.returncode == 1, out.stderr
    assert "cqnode5  gpu.remap" in out.stdout and "Xid 119" in out.stdout
    data = json.loads(cli("--from", str(tmp_path), "--json").stdout)
    assert {c["id"] for c in data["checks"] if not c["ok"]} == {"gpu.remap", "gpu.xid"}
    assert set(data["checks"][0]) >= {"id", "host", "ok", "severity", "detail", "hint"}


def test_a_kernel_log_saved_alone_with_an_xid_79_is_judged_not_ok(tmp_path):
    """Issue 65, item 16: dmesg.txt and uptime.txt, no nvidia-smi output: a7e0410 said "ok":
    true with no check at all. An Xid line is itself proof of an NVIDIA GPU."""
    # A raw dmesg line in the kernel's own form (xid79-aer.gpu-burn.txt's message), 57 s
    # before /proc/uptime.
    (tmp_path / "dmesg.txt").write_text(
        "[ 1843.308145] NVRM: Xid (PCI:0000:b3:00): 79, pid=1, GPU has fallen off the bus.\n")
    (tmp_path / "uptime.txt").write_text("1900.31 3021.55\n")
    out = cli("--from", str(tmp_path), "--json")
    assert out.returncode == 1, out.stdout + out.stderr
    data = json.loads(out.stdout)
    assert data["ok"] is False
    (xid79,) = [c for c in data["checks"] if c["id"] == "gpu.xid"]
    assert (xid79["ok"], xid79["severity"]) == (False, ERROR)
    assert xid79["detail"].startswith("Xid 79 on PCI 0000:b3:00, 1 time(s) in the last 2 h")
    # An Xid older than the window, and a log without one (a host without GPUs), say nothing.
    (tmp_path / "uptime.txt").write_text("9400.31 3021.55\n")
    assert health_cli.health_view(str(tmp_path))["checks"] == []
    (tmp_path / "dmesg.txt").write_text("[    0.000000] Linux version 6.8.0-51-generic\n")
    assert health_cli.health_view(str(tmp_path))["ok"] is True


def test_the_cli_on_a_clean_bundle_and_on_bad_input(tmp_path):
    bundle(tmp_path, nvidia_smi_q_txt="nvidia-smi-q.titanv.txt")
    out = cli("--from", str(tmp_path))
    assert out.returncode == 0 and "gpu.persistence" in out.stdout  # a warning only
    empty = tmp_path / "empty"
    empty.mkdir()
    out = cli("--from", str(empty))
    assert out.returncode == 2 and "holds none of the files" in out.stderr
    assert cli("--from", str(tmp_path / "nope")).returncode == 2
    help_text = cli("--help").stdout
    assert all(name in help_text for name in health.FILES)


# -- any text -----------------------------------------------------------------------------------------

LINES = st.lists(st.sampled_from(text("nvidia-smi-q.h100x8.txt").split("\n")[:220])
                 | st.text(max_size=80), max_size=60).map("\n".join)


@given(LINES, st.text(max_size=300), st.text(max_size=300), st.text(max_size=300))
@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_no_text_makes_a_parser_or_a_rule_raise(smi_text, dmesg, amd, other):
    files = {"nvidia-smi-q.txt": smi_text, "dmesg.txt": dmesg, "nvidia-smi-nvlink.txt": other,
             "uptime.txt": other, "ulimit-l.txt": other, "df.txt": other, "modules.txt": other,
             "infiniband.txt": other, "fabricmanager.txt": other}
    health_checks.checks("h", health.facts(files, 7200), LIMITS)
    amd_files = {"amd-smi-metric.json": amd, "amd-smi-static.json": other,
                 "amd-smi-process.json": amd, "amd-smi-bad-pages.json": other}
    health_checks.checks("h", health.facts(amd_files, 7200), LIMITS)


JSONS = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.sampled_from(["gpu", "ecc", "pcie", "bus", "asic",
                                                        "gpu_data", "process_list", "process_info",
                                                        "retired", "width", "max_pcie_width",
                                                        "total_uncorrectable_count", "pid",
                                                        "memory_usage", "vram_mem", "status",
                                                        "xgmi_err", "value"]), inner, max_size=5),
                     max_leaves=30)


@given(JSONS)
@settings(max_examples=examples(300), deadline=None)
def test_no_json_shape_makes_the_amd_parsers_raise(data):
    raw = json.dumps(data)
    gpus = smi.amd_gpus(raw, raw, raw, raw)
    health_checks.checks("h", {"vendor": "amd", "gpus": gpus}, LIMITS)


@given(st.dictionaries(st.sampled_from(["vendor", "gpus", "xids", "kernel_log", "disk", "rdma",
                                        "memlock_kib", "smi_failed", "fabricmanager", "peermem"]),
                       JSONS, max_size=6))
@settings(max_examples=examples(300), deadline=None)
def test_a_host_that_answers_garbage_facts_is_said_never_raised(facts):
    from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.preflight import health_records

    probe = {"health": facts or {"gpus": [{"index": "x"}]}, "versions": {"torch": "2.13.0"},
             "gpus": [], "connect": {"ports": [{"clock": facts}]}}
    records = health_records({"h": probe, "m": dict(probe)}, {}, "m", {"health": "full",
                                                                      "perf": {"h": facts, "m": 3}})
    assert all(r["host"] in ("h", "m") for r in records)


def test_cpus_that_started_late_are_held_to_the_on_time_hosts_reference():
    def cpu(value, late):
        return {"device": "cpu", "name": "Xeon", "tflops": value, "gbps": 10.0, "late_s": late,
                "dtype": "float32"}

    # d started late and ran partly alone: faster, left out of the reference, not named.
    results = {"a": {"devices": [cpu(0.030, 0.0)]}, "b": {"devices": [cpu(0.030, 0.0)]},
               "c": {"devices": [cpu(0.029, 0.0)]}, "d": {"devices": [cpu(0.045, 2.5)]}}
    assert all(r["ok"] for r in perf.compare(results, 10.0))
    # A late host that is slower still (a capped CPU imports torch late too) is named.
    results["d"]["devices"][0]["tflops"] = 0.008
    assert [r["host"] for r in perf.compare(results, 10.0) if not r["ok"]] == ["d"]
    # Fewer than three on time: nothing to compare with, said so.
    results["c"]["devices"][0]["late_s"] = 3.0
    records = perf.compare(results, 10.0)
    assert all(r["ok"] for r in records)
    assert "not compared: fewer than 3 hosts started on time (c, d late)" in records[0]["detail"]


def test_memlock_is_not_asked_for_when_the_run_uses_ethernet():
    files = {"ulimit-l.txt": "65536", "infiniband.txt": "mlx5_0"}
    facts = health.facts(files, 7200)
    assert health_checks.checks("h", facts, dict(LIMITS, rdma_in_use=False)) == []
    assert [r["id"] for r in health_checks.checks("h", facts, LIMITS)] == ["host.memlock"]


@given(st.binary(max_size=200))
@settings(max_examples=examples(200), deadline=None)
def test_any_bytes_on_the_port_give_a_finite_clock_or_none(sent):
    from ansible_collections.torchfleet.fleet.plugins.module_utils.host.connect import read_clock

    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(sent)
        theirs.close()
        clock = read_clock(ours, time.time(), time.monotonic(), wait_s=0.2)
    assert clock is None or all(abs(v) < 1e11 for v in clock.values())


# What users save by hand on hosts without the command (recorded: the H200 host had no
# systemctl, so its saved fabricmanager.txt is a shell's error; tests/fixtures/h200-1gpu/).
NO_RDMA = "ls: cannot access '/sys/class/infiniband': No such file or directory\n"
NO_SMI = "bash: nvidia-smi: command not found\n"
FABRIC_GREP = ("    Fabric\n        State                                          : In Progress\n"
               "        Status                                         : N/A\n")


@pytest.mark.parametrize("files, status, words", [
    ({"infiniband.txt": NO_RDMA, "ulimit-l.txt": "64\n"}, 2, "infiniband.txt could not be read"),
    ({"nvidia-smi-q.txt": NO_SMI}, 2, "nvidia-smi-q.txt could not be read"),
    ({"nvidia-smi-q.txt": FABRIC_GREP}, 1,
     "gpu.fabric GPU 0 (unknown): NVSwitch fabric In Progress"),
])
def test_a_saved_file_that_is_not_its_commands_output_is_named_never_judged(
        tmp_path, files, status, words):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    view = health_cli.health_view(str(tmp_path))
    assert health_cli.exit_status(view) == status
    text = health_cli.health_text(view)
    assert words in text and "health ok" not in text
    bundle = [c for c in view["checks"] if c["id"] == "input.bundle"]
    assert [c["detail"].split(" ", 1)[0] for c in bundle] == [
        n for n in files if n != "ulimit-l.txt"]
    # A saved error message is never the host's failure: no memlock verdict from it.
    assert not [c for c in view["checks"] if c["id"] == "host.memlock" and not c["ok"]]


def test_the_recorded_h200_bundle_is_read_and_its_saved_error_named():
    view = health_cli.health_view(str(FIXTURES / "h200-1gpu"))
    assert view["ok"] and view["incomplete"] == ["fabricmanager.txt"]
    assert health_cli.exit_status(view) == 2
    assert {c["id"] for c in view["checks"] if c["ok"]} >= {"gpu.smi", "gpu.ecc", "gpu.xid"}


@given(st.text(max_size=400))
def test_any_saved_text_is_sorted_without_raising(text):
    fit, problems = health.bundle_problems({name: text for name in health.FILES})
    assert set(fit) | {p["name"] for p in problems} == set(health.FILES)
