"""The one judge of a run's hardware (issue 57): no fatal event lost behind warnings, each
event dated with its source's uncertainty, the OOM killer's victim the run's whether or not a
rank is named, and the report's First failure showing the event, not the abort's tracebacks.

Every test drives the master's own RunState with events in the shape the agents send
(hwwatch.HostWatch.take: gpuwatch's NVML events, kmsg.parse's kernel lines); the kernel lines
are recorded real ones (tests/fixtures/kmsg/README.md names their sources)."""
from __future__ import annotations

import io
from pathlib import Path

import pytest
from ansible_collections.torchfleet.fleet.plugins.module_utils.host import kmsg
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import status
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.summary import (
    first_failure, hardware_checks)
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import runstate
from torchfleet.html_report import render
from torchfleet.progress import Progress
from torchfleet.results import from_report
from torchfleet.runner import Event
from tests.conftest import FIXTURES

# The kernel's own words (a Tesla under gpu-burn; the oom-kill line of a containerd pod).
XID79 = (FIXTURES / "kmsg" / "xid79-aer.gpu-burn.txt").read_text().splitlines()[-1] \
    .split("] ", 1)[1]
OOM_KILL = [line for line in (FIXTURES / "kmsg" / "oom.gpud-memory.txt").read_text()
            .splitlines() if "task_memcg=" in line][0].split("+00:00 ", 1)[1]
# A DGX H100's eight GPUs, as NVML names their PCI addresses.
BUSES = ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0", "0000:9a:00.0",
         "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"]


def clocks(gpu, code=0x40):
    """gpuwatch's warning for clocks held down (gpuwatch._event's shape)."""
    what = "clocks held down: HW thermal slowdown"
    return {"source": "nvml", "kind": "clocks", "code": code, "gpu": gpu, "pci_bus": BUSES[gpu],
            "pid": None, "fatal": False, "what": what, "age_s": 0.5, "age_err_s": 5.0,
            "line": "GPU %d (%s): %s" % (gpu, BUSES[gpu], what)}


def xid79(age_s=0.0, source="kmsg", age_err_s=0.0, gpu=None, rank=None, pid=None):
    return {"source": source, "kind": "xid", "code": 79, "gpu": gpu, "pci_bus": "0000:02:00.0",
            "rank": rank, "pid": pid, "fatal": True, "line": XID79, "age_s": age_s,
            "age_err_s": age_err_s, "what": "Xid 79, GPU has fallen off the bus"}


def running(hosts, nproc=8, now=1000.0):
    s = runstate.RunState("r", hosts, nproc, now=now, hang_timeout_s=600)
    for h in hosts:
        s.report(h, now + 1, {"t": runstate.BEAT, "alive": nproc, "idle_s": 0.0, "pid": 1})
    return s


def beat(s, host, now, hw, **extra):
    return s.report(host, now, dict({"t": runstate.BEAT, "alive": s.nproc, "idle_s": 0.0,
                                     "pid": 1, "hw": hw}, **extra))


def progress_line(record, now):
    p = Progress(io.StringIO())
    p(Event(kind="run", summary=runstate.summary(record, now), status="running"))
    return p.lines()[0]


# -- item 1: warnings never crowd out a fatal event ---------------------------------------------

def test_512_clock_warnings_then_an_xid_79_drain_its_host_and_the_rest_are_counted():
    """64 hosts send 8 "clocks held down" warnings each (the run's 512), then n100's Xid 79:
    it is the run's cause and n100 is drained. Warnings past the bounds are counted, the
    master's and the agents' own, and every output says "and N more warnings"."""
    hosts = ["n%d" % i for i in range(101)]
    s = running(hosts)
    for i in range(64):
        beat(s, "n%d" % i, 1010.0, [clocks(g) for g in range(8)])
    assert s.phase == runstate.RUNNING and len(s.events) == runstate.EVENTS_MAX
    beat(s, "n100", 1011.0, [xid79()])
    assert (s.phase, s.failure["host"], s.failure["reason"]) == ("hardware", "n100", "hardware")
    assert hardware_checks(s.record(), hosts)["drain"] == [
        {"host": "n100", "reason": "run.hardware", "evidence": XID79}]
    # n64's warnings are past the run's bound; n65's agent says it dropped 204 itself.
    beat(s, "n64", 1012.0, [clocks(g) for g in range(8)])
    beat(s, "n65", 1012.0, [], watch={"kmsg": "/dev/kmsg", "gpu": "nvml", "dropped": 204})
    record = s.record()
    assert runstate.dropped(record) == {"n64": 8, "n65": 204}
    assert runstate.summary(record, 1013.0)["warnings_dropped"] == 212
    assert "(and 212 more warnings)" in progress_line(record, 1013.0)
    rows = {h["host"]: h["hardware"] for h in status.view(record, 1013.0)["hosts"]}
    assert rows["n65"] == "and 204 more warnings"
    assert rows["n0"].startswith("8 events, last: clocks held down")
    checks = hardware_checks(record, hosts)
    assert checks["hardware_dropped"] == {"n64": 8, "n65": 204}
    assert [c["detail"] for c in checks["checks"] if c["host"] == "n64"] == [
        "and 8 more warnings"]


def test_a_fatal_event_behind_more_warnings_than_a_message_carries_is_judged():
    """One beat: 12 warnings (more than EVENTS_PER_MESSAGE), then the Xid: the Xid is the
    cause, the 4 warnings past the message's bound are counted."""
    s = running(["n0", "n1"])
    beat(s, "n1", 1010.0, [clocks(g % 8, code=0x40 if g < 8 else 0x8) for g in range(12)]
         + [xid79()])
    assert s.failure["reason"] == "hardware" and s.failure["event"]["code"] == 79
    assert runstate.dropped(s.record()) == {"n1": 4}


def test_a_repeat_is_a_count_and_a_warning_that_becomes_fatal_is_judged_then():
    """NVML not answering (kind nvml, code timeout): a warning, sent again with its count, then
    fatal once it lasted (gpuwatch's rule): one event throughout, judged when it turned."""
    s = running(["n0", "n1"])
    slow = {"source": "nvml", "kind": "nvml", "code": "timeout", "gpu": None, "pci_bus": None,
            "pid": None, "fatal": False, "what": "NVML did not answer in 2 s", "line": "",
            "age_s": 0.0, "age_err_s": 1.0, "count": 1}
    beat(s, "n1", 1010.0, [slow])
    beat(s, "n1", 1011.0, [dict(slow, count=4)])
    assert s.phase == runstate.RUNNING and [e["count"] for e in s.events] == [4]
    beat(s, "n1", 1040.0, [dict(slow, count=30, fatal=True, what="NVML silent for 30 s")])
    assert len(s.events) == 1 and s.events[0]["count"] == 30 and s.events[0]["fatal"]
    assert (s.failure["reason"], s.failure["at_s"]) == ("hardware", 40.0)
    # The same Xid again (the agent's next count), and from a second source: still one.
    beat(s, "n0", 1041.0, [xid79(), xid79(source="nvml", age_err_s=5.0)])
    beat(s, "n0", 1042.0, [dict(xid79(), count=3)])
    assert [e["count"] for e in s.events if e["host"] == "n0"] == [3]


def test_fatal_events_are_bounded_per_host_and_an_earlier_one_past_the_bound_is_kept():
    s = running(["n0", "n1"])
    beat(s, "n1", 1100.0, [xid79(gpu=g, age_s=10.0) for g in range(40)])
    mine = [e for e in s.events if e["host"] == "n1"]
    assert len(mine) == runstate.FATAL_PER_HOST
    assert s.record()["hosts"][1]["fatal_more"] == 40 - runstate.FATAL_PER_HOST
    beat(s, "n1", 1101.0, [xid79(gpu=99, age_s=60.0)])  # dated 1041: before every one kept
    assert len([e for e in s.events if e["host"] == "n1"]) == runstate.FATAL_PER_HOST
    assert s.failure["event"]["gpu"] == 99 and s.failure["at_s"] == 41.0
    assert len(s.failures) == runstate.FATAL_PER_HOST


def test_fatal_events_of_one_message_are_capped_keeping_the_earliest_and_counted():
    """Review 57, finding 9: a broken or hostile agent's thousands of fatal events in one beat
    were all taken, each past FATAL_PER_HOST weighed against every kept event. One message
    gives FATAL_PER_MESSAGE, its earliest (the first cause among them), and counts the rest."""
    flood = [xid79(gpu=g, age_s=1.0 + g % 7) for g in range(2000)]
    flood.insert(1500, xid79(gpu=9999, age_s=90.0))         # dated first, deep in the list
    flood.append(xid79(gpu=8888, age_s=50.0, age_err_s=30.0))  # dated second (its slack)
    msg = runstate.message({"t": runstate.BEAT, "alive": 8, "hw": flood + [clocks(0)]})
    taken = [e for e in msg["hw"] if e["fatal"]]
    assert len(taken) == runstate.FATAL_PER_MESSAGE
    assert msg["hw_fatal_more"] == len(flood) - runstate.FATAL_PER_MESSAGE
    assert {9999, 8888} <= {e["gpu"] for e in taken} and len(msg["hw"]) == len(taken) + 1
    assert [e["gpu"] for e in taken] == sorted(
        (e["gpu"] for e in taken), key=[e["gpu"] for e in flood].index)  # the message's order
    s = running(["n0", "n1"])
    beat(s, "n1", 1100.0, flood)
    assert s.failure["event"]["gpu"] == 9999 and s.failure["at_s"] == 10.0
    assert s.record()["hosts"][1]["fatal_more"] == len(flood) - runstate.FATAL_PER_HOST


def test_the_watchs_partial_reads_and_the_fatal_events_not_kept_are_shown():
    """Review 57, findings 8 and 4: the watch's gpu_error (why NVML or nvidia-smi is not read)
    and hosts[].fatal_more were kept in the record and shown nowhere; a kernel log whose ring
    overran (records lost unread) is said too. All warnings but the fatal event's own check."""
    s = running(["n0", "n1"])
    watch = {"kmsg": "/dev/kmsg (the kernel log overran: 39 records were lost before they "
                     "were read)", "kmsg_error": None, "gpu": None, "dropped": 0,
             "gpu_error": "nvml: nvmlDeviceGetTotalEccErrors: Timeout",
             "watch_error": "the hardware watch failed: boom (2 times)"}
    beat(s, "n1", 1100.0, [xid79(gpu=g, age_s=1.0) for g in range(40)], watch=watch)
    checks = hardware_checks(s.record(), ["n0", "n1"])["checks"]
    assert [(c["id"], c["severity"]) for c in checks] == [
        ("run.hardware", "error"), ("host.kmsg", "warning"), ("run.hardware", "warning"),
        ("run.hardware", "warning")]
    assert checks[0]["detail"].endswith("; and 36 more fatal events")  # 4 shown, 28 + 8
    assert checks[1]["detail"] == ("/dev/kmsg: the kernel log overran: 39 records were lost "
                                   "before they were read")
    assert checks[2]["detail"] == ("the GPUs were not wholly watched: nvml: "
                                   "nvmlDeviceGetTotalEccErrors: Timeout")
    assert checks[3]["detail"] == "the hardware watch failed: boom (2 times)"


# -- item 3: each event's own slack --------------------------------------------------------------

def test_an_xid_seen_through_nvml_after_its_rank_died_is_the_cause_a_kernel_line_is_late():
    """Rank 9 on n1 dies at 1020; its GPU's Xid is seen 4 s later. Through NVML (sampled every
    5 s: age_err_s 5) it may have happened before the death: the cause, the death its
    consequence. As a calibrated kernel line (age_err_s 0) it is dated after: late."""
    for err, cause in ((5.0, True), (0.0, False)):
        s = running(["n0", "n1"])
        s.exited("n1", 1020.0, 1, root_cause={"rank": 9, "local_rank": 1, "exitcode": -6})
        beat(s, "n1", 1024.0, [xid79(source="nvml" if err else "kmsg", age_err_s=err, gpu=1)])
        assert (s.failure["reason"] == "hardware") is cause, err
        assert bool(s.failures[-1].get("late")) is not cause
        assert [f["consequence"] for f in s.failures if f["reason"] == "failed"] == [cause]
        if cause:
            assert s.failure["died"] == 9
            assert "; rank 9 stopped there;" in runstate.failure_text(s.failure)


def test_the_slack_is_the_fixed_one_and_the_events_own_uncertainty_bounded():
    assert runstate.slack({"event": {"age_err_s": 5.0}}) == runstate.defaults.HW_SLACK_S + 5
    assert runstate.slack({"event": None}) == runstate.defaults.HW_SLACK_S
    s = running(["n0"])
    beat(s, "n0", 1010.0, [clocks(0) | {"age_err_s": 1e9}, clocks(1) | {"age_err_s": "x"},
                           clocks(2) | {"count": -3}, clocks(3) | {"count": 1 << 80}])
    assert [e["age_err_s"] for e in s.events] == [runstate.AGE_ERR_MAX_S, 0.0, 5.0, 5.0]
    assert [e["count"] for e in s.events] == [1, 1, 1, runstate.COUNT_MAX]


# -- item 7: the OOM killer ------------------------------------------------------------------------

def test_a_fatal_oom_kill_without_a_rank_is_the_runs_and_one_outside_the_run_a_warning():
    """The agent tied the victim to the run (a DataLoader worker, a rank in a container's own
    PID namespace) but could not name its rank: run.oom all the same. An OOM kill outside
    the run comes as a warning: it never fails the run."""
    s = running(["n0", "n1"], nproc=2)
    beat(s, "n1", 1010.0, [{"source": "kmsg", "kind": "oom", "code": "global", "gpu": None,
                            "pci_bus": None, "rank": 1, "pid": 123, "fatal": False,
                            "what": "killed by the kernel's OOM killer", "line": OOM_KILL}])
    assert s.phase == runstate.RUNNING
    checks = hardware_checks(s.record(), ["n0", "n1"])["checks"]
    assert [(c["id"], c["severity"]) for c in checks] == [("run.hardware", "warning")]
    beat(s, "n1", 1020.0, [{"source": "kmsg", "kind": "oom", "code": "memcg", "gpu": None,
                            "pci_bus": None, "rank": None, "pid": 863987, "fatal": True,
                            "what": "killed by the kernel's OOM killer (memory cgroup)",
                            "line": OOM_KILL, "age_s": 1.0}])
    assert (s.phase, s.failure["host"], s.failure["rank"]) == ("oom", "n1", None)
    assert runstate.failure_text(s.failure).startswith(
        "n1 a process of the run (pid 863987) was killed by the kernel's OOM killer (memory "
        "cgroup) at ")
    checks = hardware_checks(s.record(), ["n0", "n1"])
    assert checks["drain"] == []  # the workload's memory, not the host's hardware
    assert [c["detail"] for c in checks["checks"] if c["id"] == "run.oom"] == [
        "a process of the run (pid 863987) was killed by the kernel's OOM killer (memory "
        "cgroup)"]


# -- item 17: the report shows the event, not the abort ------------------------------------------

TORCHRUN_SIGTERM = """\
W1128 04:10:31.002000 4242 torch/distributed/elastic/agent/server/api.py:719] Received 15 \
death signal, shutting down workers
W1128 04:10:31.003000 4242 torch/distributed/elastic/multiprocessing/api.py:897] Sending \
process 4250 closing signal SIGTERM
Traceback (most recent call last):
  File "/usr/lib/python3.12/site-packages/torch/distributed/run.py", line 909, in run
    elastic_launch(
torch.distributed.elastic.multiprocessing.api.SignalException: Process 4242 got signal: 15
"""


def test_the_first_failure_of_an_xid_79_run_is_the_event_its_device_and_rank(tmp_path):
    """Built like the Slurm lab's Xid 79 run (tests/lab/test_slurm_lab.py): the kernel line on
    node2's GPU at 0000:02:00.0, the other ranks still moving through their collectives when
    it was judged, the abort's SIGTERM ending node2's torchrun (its log ends in torch's
    SignalException, the lines in torch's own words). The report's First failure shows the
    line, the device and the rank; not the SIGTERM, not where the other ranks were."""
    hosts = ["node1", "node2", "node3"]
    s = running(hosts, nproc=1)
    for i, h in enumerate(hosts):
        beat(s, h, 1030.0, [], coll={str(i): {"0": [40 + i, 39, "nccl:all_reduce", "", ""]}},
             steady={str(i): [0.5, True]})
    beat(s, "node2", 1031.0, [xid79(age_s=1.0)])
    for h in hosts:
        s.exited(h, 1033.0, 0, stopped=True)
    record = s.record()
    assert "still moving" in (record["failure"]["collective"] or {}).get("note", "")
    logs = tmp_path / "logs" / "node2"
    logs.mkdir(parents=True)
    (logs / "torchrun.log").write_text(TORCHRUN_SIGTERM)
    failure = first_failure(record, str(tmp_path), 20)
    assert "SignalException" not in failure["tail"]
    assert failure["tail"].splitlines()[:3] == [
        "line: " + XID79, "device: PCI 0000:02:00.0 (GPU index unknown)",
        "rank: none named by the event, and no rank died of it before the run stopped"]
    checks = hardware_checks(record, hosts)
    report = {"ok": False, "run_id": "xid", "first_failure": failure, "drain": checks["drain"],
              "hardware": checks["hardware"], "hardware_dropped": checks["hardware_dropped"]}
    page = render(from_report("train", report, Path(tmp_path)))
    section = page[page.index("<h2>First failure</h2>"):page.index("<h2>Hardware")]
    assert "NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus." in section
    assert "PCI 0000:02:00.0" in section and "<th>rank</th>" in section
    assert "node2" in section and "drain node2" in section
    assert "SignalException" not in page and "still moving" not in page


def test_the_report_names_the_gpu_and_the_rank_an_event_hit_and_the_warnings_not_kept(
        tmp_path):
    s = running(["n0", "n1"], nproc=8)
    beat(s, "n1", 1010.0, [xid79(gpu=3, rank=11, source="nvml", age_err_s=5.0)],
         watch={"dropped": 212})
    record = s.record()
    failure = first_failure(record, str(tmp_path), 20)
    checks = hardware_checks(record, ["n0", "n1"])
    page = render(from_report("train", {
        "ok": False, "run_id": "r", "first_failure": failure, "drain": checks["drain"],
        "hardware": checks["hardware"]}, Path(tmp_path)))
    section = page[page.index("<h2>First failure</h2>"):page.index("<h2>Hardware")]
    assert "GPU 3, PCI 0000:02:00.0" in section and "<td>rank 11</td>" in section
    assert "up to 5 s before: its source is sampled" in section
    result = from_report("train", {"ok": False, "run_id": "r", "first_failure": failure,
                                   "hardware": checks["hardware"]}, Path(tmp_path))
    result.hardware_dropped = checks["hardware_dropped"]  # (train.json's, once results.py reads it)
    assert "and 212 more warnings" in render(result)


# -- issue 65, item 9: a fatal NVSwitch SXid is the host's -----------------------------------------

def test_a_fatal_nvswitch_sxid_drains_its_host_and_names_the_switch_not_a_ranks_gpu(tmp_path):
    """On a7e0410 the SXid line was never parsed: the rank whose GPU lost its NVLink died and
    its exit was the run's failure. Now the agent's watch (test_host_watch's HGX sysfs, all 8
    GPUs the run's) sends it fatal with no device, no GPU and no rank, and the master drains
    the host with the switch named."""
    from tests.unit.test_host_watch import GPUS, Gpus, sent, watch, write
    line = (FIXTURES / "kmsg" / "sxid20034-xid79.gpud.txt").read_text().splitlines()[5] \
        .split("] ", 1)[1]  # "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, ..."
    w, log = watch(tmp_path, gpu=Gpus(buses=GPUS))
    write(log, line)
    (event,) = sent(w, 10.0, {4242: (3, 3)})
    assert (event["kind"], event["code"], event["fatal"]) == ("nvswitch", 20034, True)
    assert (event["pci_bus"], event["gpu"], event["rank"]) == (None, None, None)
    s = running(["n0", "n1"])
    s.exited("n1", 1020.0, 1, root_cause={"rank": 11, "local_rank": 3, "exitcode": -6})
    beat(s, "n1", 1020.5, [event])
    assert (s.failure["reason"], s.failure["host"]) == ("hardware", "n1")
    words = runstate.failure_text(s.failure)
    assert words.startswith("n1: NVSwitch nvidia-nvswitch1 (PCI 0000:06:00.0) SXid 20034, "
                            "fatal (link 48): judged host-wide: every GPU's NVLink fabric, a "
                            "run on some of the host's GPUs too, at ")
    assert "GPU" not in words.split(", fatal")[0] and "drain n1" in words
    assert hardware_checks(s.record(), ["n0", "n1"])["drain"] == [
        {"host": "n1", "reason": "run.hardware", "evidence": line}]


# -- a fatal SXid after a fatal Xid on a GPU outside the run ---------------------------------------

SXID_XID79 = (FIXTURES / "kmsg" / "sxid20034-xid79.gpud.txt").read_text().splitlines()


def test_a_fatal_sxid_after_another_gpus_xid_79_is_that_gpus_not_the_runs(tmp_path):
    """The recorded HGX log: GPU 0000:91:00's Xid 79, then 12 s later 20034 LTSSM Fault on
    three switches (the fallen GPU's links). Moved onto GPU 5 of a run on GPUs 0-3, the Xid
    was "not a device of the run" and on c4710eb the SXids after it stopped the healthy run
    and drained its host. Now they are warnings naming GPU 5; the run goes on."""
    from tests.unit.test_host_watch import GPUS, Gpus, sent, watch, write
    xid_lines = [x.replace("0000:91:00", GPUS[5][:-2]) for x in SXID_XID79[:5]]
    w, log = watch(tmp_path, env={"CUDA_VISIBLE_DEVICES": "0,1,2,3",
                                  "NCCL_SOCKET_IFNAME": "eth0"}, gpu=Gpus(buses=GPUS))
    write(log, *xid_lines)
    (xid,) = sent(w, 10.0)
    assert (xid["kind"], xid["gpu"], xid["fatal"]) == ("xid", 5, False)
    write(log, *SXID_XID79[5:])
    (sxid,) = sent(w, 22.0)
    assert (sxid["kind"], sxid["code"], sxid["fatal"], sxid["count"]) == ("nvswitch", 20034,
                                                                           False, 4)
    assert sxid["what"] == ("NVSwitch nvidia-nvswitch1 (PCI 0000:06:00.0) SXid 20034, fatal "
                            "(link 48): 12 s after Xid 79 on GPU 5 (0000:ab:00.0), that GPU's "
                            "links: not a device of the run")
    s = running(["n0", "n1"])
    beat(s, "n1", 1020.0, [xid, sxid])
    assert s.phase == runstate.RUNNING and s.failure is None
    assert hardware_checks(s.record(), ["n0", "n1"])["drain"] == []


@pytest.mark.parametrize("xid_on, gap_s", [
    (0, 12.0),      # the fallen GPU is the run's: its Xid and the SXids are fatal
    (None, 12.0),   # no Xid before it: a fabric fault of its own, host-wide
    (5, 120.0),     # another GPU's Xid, long before: not its links' fault
    ("both", 12.0),  # another GPU's and one of the run's: the run's fabric may be hit
])
def test_a_fatal_sxid_stays_the_runs_without_another_gpus_xid_just_before(tmp_path, xid_on,
                                                                          gap_s):
    from tests.unit.test_host_watch import GPUS, Gpus, sent, watch, write
    w, log = watch(tmp_path, env={"CUDA_VISIBLE_DEVICES": "0,1,2,3",
                                  "NCCL_SOCKET_IFNAME": "eth0"}, gpu=Gpus(buses=GPUS))
    on = [] if xid_on is None else [0, 5] if xid_on == "both" else [xid_on]
    write(log, *[SXID_XID79[2].replace("0000:91:00", GPUS[g][:-2]) for g in on])
    assert sorted((e["gpu"], e["fatal"]) for e in sent(w, 10.0)) == [(g, g < 4) for g in on]
    write(log, *SXID_XID79[5:])
    (sxid,) = sent(w, 10.0 + gap_s)
    assert (sxid["kind"], sxid["fatal"]) == ("nvswitch", True)
    assert sxid["what"].endswith(kmsg.SXID_HOST_WIDE)
