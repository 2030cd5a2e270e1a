"""The GPU watch (issue 57, items 3, 4 and 8): NVML in a thread of its own, never the agent's
loop; Xid events read within one wait and dated by it, sampled changes by the sampling
interval; a driver that stops answering a warning, then fatal; every binding's missing call
survived; nvidia-smi asked only for fields its driver has; the processes on each GPU.

No GPU and no pynvml here: `binding()` builds a stand-in pynvml module whose calls behave like
nvidia-ml-py's (they raise NVMLError subclasses, nvmlEventSetWait blocks for its timeout and
raises NVMLError_Timeout, a call can hang, an older binding lacks names), answering the values
recorded on the H200 host (tests/fixtures/h200-1gpu/: nvml-idle.json, nvml-load.json,
query-health.csv, nvidia-smi-q-load.txt's process) and, for 8 GPUs, the bus ids of the real
8x H100 `nvidia-smi -q` in tests/fixtures/health/nvidia-smi-q.h100x8.txt."""
from __future__ import annotations

import json
import queue
import re
import subprocess
import sys
import threading
import time
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.torchfleet.fleet.plugins.module_utils.host import gpuwatch, xid
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.command import Failed
from tests.conftest import FIXTURES, examples

H200 = FIXTURES / "h200-1gpu"
IDLE = json.loads((H200 / "nvml-idle.json").read_text())["gpus"][0]
LOAD = json.loads((H200 / "nvml-load.json").read_text())
# The matmul's process, as `nvidia-smi -q` showed it under load (nvidia-smi-q-load.txt).
LOAD_PID = int(re.search(r"Process ID\s+:\s+(\d+)", (H200 / "nvidia-smi-q-load.txt")
                         .read_text()).group(1))
H100X8_BUSES = re.findall(r"^GPU (\S+)", (FIXTURES / "health" / "nvidia-smi-q.h100x8.txt")
                          .read_text(), re.M)


def until(cond, timeout_s=20.0):
    """cond()'s first true value, polled; fails after timeout_s (a loaded 2-core machine)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(0.005)
    raise AssertionError("not within %g s" % timeout_s)


# -- a stand-in pynvml --------------------------------------------------------------------------

class NVMLError(Exception):
    value = 999
    text = "Unknown Error"

    def __str__(self):
        return self.text


def _error(name, value, text):
    return type(name, (NVMLError,), {"value": value, "text": text})


class Gpu:
    """One GPU's answers, from the H200's idle recording."""

    def __init__(self, bus=IDLE["pci"]):
        self.bus = bus
        self.ecc = IDLE["ecc_uncorrected_volatile"]
        self.rows = tuple(IDLE["remapped_rows"])
        self.reasons = IDLE["clocks_event_reasons"]
        self.recovery = LOAD["fields"]["NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"]["ull"]
        self.pids = list(IDLE["procs"])


def binding(gpus, old=False):
    """A pynvml module over gpus. old: nvidia-ml-py 11.x's names (clocks "throttle" reasons,
    nvmlEventSetWait without _v2, no _v3 processes, no recovery action field)."""
    nv = types.ModuleType("pynvml")
    nv.NVMLError = NVMLError
    nv.NVMLError_NotSupported = _error("NVMLError_NotSupported", 3, "Not Supported")
    nv.NVMLError_Timeout = _error("NVMLError_Timeout", 10, "Timeout")
    nv.NVMLError_FunctionNotFound = _error("NVMLError_FunctionNotFound", 13,
                                           "Function Not Found")
    nv.NVMLError_Unknown = _error("NVMLError_Unknown", 999, "Unknown Error")
    nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC = 1, 0
    nv.nvmlEventTypeXidCriticalError = 0x8
    nv.gpus, nv.xids, nv.calls = gpus, queue.Queue(), []
    nv.hang = {}       # call name -> (gpu index or None, threading.Event that releases it)
    nv.entered = threading.Event()
    nv.fail = {}       # call name -> exception to raise

    def call(name, gpu=None):
        nv.calls.append(name)
        if name in nv.hang and nv.hang[name][0] in (None, gpu):
            nv.entered.set()
            nv.hang[name][1].wait()
        if name in nv.fail:
            raise nv.fail[name]

    def define(name, fn, per_gpu=True):
        def wrapper(*args):
            call(name, args[0].index if per_gpu and args and isinstance(args[0], Handle)
                 else None)
            return fn(*args)
        setattr(nv, name, wrapper)

    class Handle:
        def __init__(self, index):
            self.index = index

    def wait(_set, ms):
        try:
            gpu, code = nv.xids.get(timeout=ms / 1000.0)
        except queue.Empty:
            raise nv.NVMLError_Timeout() from None
        return types.SimpleNamespace(device=Handle(gpu), eventType=0x8, eventData=code,
                                     gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)

    def procs(h):
        return [types.SimpleNamespace(pid=p, usedGpuMemory=874 << 20) for p in gpus[h.index].pids]

    def fields(h, ids):
        return [types.SimpleNamespace(fieldId=ids[0], nvmlReturn=0, valueType=1,
                                      value=types.SimpleNamespace(uiVal=gpus[h.index].recovery,
                                                                  ullVal=gpus[h.index].recovery))]

    define("nvmlInit", lambda: None)
    define("nvmlShutdown", lambda: None)
    define("nvmlDeviceGetCount", lambda: len(gpus))
    define("nvmlDeviceGetHandleByIndex", Handle)
    define("nvmlDeviceGetIndex", lambda h: h.index)
    define("nvmlDeviceGetPciInfo",
           lambda h: types.SimpleNamespace(busId=gpus[h.index].bus.encode()))
    define("nvmlDeviceGetTotalEccErrors", lambda h, kind, counter: gpus[h.index].ecc)
    define("nvmlEventSetCreate", lambda: object())
    define("nvmlDeviceRegisterEvents", lambda h, types_, event_set: None)
    if old:
        define("nvmlDeviceGetCurrentClocksThrottleReasons", lambda h: gpus[h.index].reasons)
        define("nvmlEventSetWait", wait)
        define("nvmlDeviceGetComputeRunningProcesses", procs)
    else:
        nv.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 180
        define("nvmlDeviceGetRemappedRows", lambda h: gpus[h.index].rows)
        define("nvmlDeviceGetCurrentClocksEventReasons", lambda h: gpus[h.index].reasons)
        define("nvmlDeviceGetCurrentClocksThrottleReasons", lambda h: gpus[h.index].reasons)
        define("nvmlEventSetWait_v2", wait)
        define("nvmlEventSetWait", wait)
        define("nvmlDeviceGetFieldValues", fields)
        for suffix in ("", "_v2", "_v3"):
            define("nvmlDeviceGetComputeRunningProcesses" + suffix, procs)
    return nv


@pytest.fixture
def watches():
    made = []

    def make(*args, **kw):
        kw.setdefault("present", True)
        watch = gpuwatch.GpuWatch(*args, **kw)
        made.append(watch)
        return watch
    yield make
    for watch in made:
        if watch.nv is not None:
            for _gpu, release in watch.nv.hang.values():
                release.set()
        watch.close()


def sampled(watch, n=1):
    """Waits for n more samples than now; returns the newest."""
    first = until(lambda: watch.last is not None and watch.last_m)
    seen = [first]
    for _ in range(n - 1):
        seen.append(until(lambda: watch.last_m != seen[-1] and watch.last_m))
    return watch.last


def collect(watch, pred, timeout_s=20.0):
    got = []

    def found():
        got.extend(watch.look(time.monotonic()))
        return [e for e in got if pred(e)]
    return until(found, timeout_s)


# -- item 8: the processes on each GPU ----------------------------------------------------------

def test_the_h200_idle_then_under_its_matmul_names_its_process_and_says_nothing(watches):
    gpu = Gpu()
    nv = binding([gpu])
    watch = watches(pynvml=nv, every_s=0.02, wait_s=0.02)
    sampled(watch)
    assert watch.how == "nvml" and watch.error() is None
    assert watch.buses() == ["0000:00:06.0"]
    assert watch.processes() == {"0000:00:06.0": set()}            # idle: "procs": []
    gpu.reasons, gpu.pids = LOAD["samples"][-1]["reasons"], [LOAD_PID]  # 4: SW power cap
    until(lambda: watch.processes() == {"0000:00:06.0": {LOAD_PID}})
    sampled(watch, 3)
    assert watch.look(time.monotonic()) == []      # reason 4 all the time is no warning
    assert watch.how == "nvml" and watch.error() is None


@pytest.mark.parametrize("case", ["one each", "stray contexts on GPU 0", "driver before _v3"])
def test_eight_gpus_each_names_its_own_rank_of_eight(watches, case):
    # 8 stand-in ranks: real processes, as torchrun's would be (each has every /dev/nvidiaN
    # open; NVML lists a process on the GPUs where it has a context).
    ranks = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
             for _ in range(8)]
    try:
        gpus = [Gpu(bus) for bus in H100X8_BUSES]
        for gpu, rank in zip(gpus, ranks, strict=True):
            gpu.pids = [rank.pid]
        if case == "stray contexts on GPU 0":   # every rank touched cuda:0 before set_device
            gpus[0].pids = [r.pid for r in ranks]
        nv = binding(gpus)
        if case == "driver before _v3":   # the binding has _v3, the driver's library not
            nv.fail["nvmlDeviceGetComputeRunningProcesses_v3"] = nv.NVMLError_FunctionNotFound()
        watch = watches(pynvml=nv, every_s=0.02, wait_s=0.02)
        sampled(watch)
        want = {bus.lower()[4:]: {rank.pid} for bus, rank in zip(H100X8_BUSES, ranks,
                                                                  strict=True)}
        if case == "stray contexts on GPU 0":
            want["0000:53:00.0"] = {r.pid for r in ranks}
        assert watch.processes() == want
        assert watch.buses() == [bus.lower()[4:] for bus in H100X8_BUSES]
        assert watch.error() is None and watch.how == "nvml"
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()


@pytest.mark.parametrize("call", ["nvmlDeviceGetPciInfo", "nvmlDeviceGetHandleByIndex"])
def test_a_gpu_nvml_cannot_name_keeps_its_index_slot(watches, call):
    """Issue 65, item 10: GPU 3 of 8 whose address (or handle) NVML cannot read keeps its slot
    as unknown; a7e0410 listed 7 GPUs without a handle (and the host watch dropped the
    unknown address), so CUDA_VISIBLE_DEVICES=4 named the GPU at index 5."""
    nv = binding([Gpu(bus) for bus in H100X8_BUSES])
    answer = getattr(nv, call)

    def fails_on_gpu_3(arg):
        if getattr(arg, "index", arg) == 3:
            raise nv.NVMLError_Unknown()
        return answer(arg)
    setattr(nv, call, fails_on_gpu_3)
    watch = watches(pynvml=nv, every_s=0.02, wait_s=0.02)
    sampled(watch, 2)
    buses = [bus.lower()[4:] for bus in H100X8_BUSES]
    assert watch.buses() == buses[:3] + [None] + buses[4:]


def test_processes_are_unknown_not_empty_when_nvml_cannot_list_them(watches):
    nv = binding([Gpu()])
    for suffix in ("", "_v2", "_v3"):
        nv.fail["nvmlDeviceGetComputeRunningProcesses" + suffix] = nv.NVMLError_Unknown()
    watch = watches(pynvml=nv, every_s=0.02, wait_s=0.02)
    sampled(watch, 2)
    assert watch.processes() is None and watch.how == "nvml"
    assert "nvmlDeviceGetComputeRunningProcesses" in watch.error()


def test_no_nvidia_gpu_no_thread_nothing_known():
    watch = gpuwatch.GpuWatch(lambda argv, timeout_s: ("", None), present=False)
    assert watch.thread is None and watch.how is None and watch.error() is None
    assert watch.look(time.monotonic()) == [] and watch.processes() is None
    assert watch.buses() is None
    watch.close()


# -- item 3: each event dated with its source's uncertainty ------------------------------------

def test_an_xid_from_the_event_set_comes_within_a_wait_not_at_the_next_sample(watches):
    nv = binding([Gpu(bus) for bus in H100X8_BUSES])
    watch = watches(pynvml=nv, every_s=3600.0, wait_s=0.05)   # no second sample in this test
    sampled(watch)
    until(lambda: nv.calls.count("nvmlEventSetWait_v2") >= 2)
    nv.xids.put((3, 79))
    (event,) = collect(watch, lambda e: e["kind"] == "xid")
    assert (event["code"], event["gpu"], event["pci_bus"], event["fatal"], event["count"]) == (
        79, 3, "0000:86:00.0", True, 1)
    # The set was seen empty at most one wait (and the time to hand it over) before.
    assert 0.0 <= event["age_err_s"] < 2.0 < gpuwatch.NVML_EVERY_S
    assert 0.0 <= event["age_s"] < 20.0


def test_the_same_xid_twice_before_a_look_is_one_event_with_a_count(watches):
    nv = binding([Gpu()])
    watch = watches(pynvml=nv, every_s=3600.0, wait_s=0.05)
    sampled(watch)
    nv.xids.put((0, 48))
    nv.xids.put((0, 48))
    until(lambda: nv.xids.empty() and nv.calls.count("nvmlDeviceGetIndex") >= 2)
    (event,) = watch.look(time.monotonic())
    assert (event["kind"], event["code"], event["count"]) == ("xid", 48, 2)


@pytest.mark.parametrize("every_s", [0.2, 0.5])
def test_a_sampled_change_is_uncertain_by_the_sampling_interval(watches, every_s):
    gpu = Gpu()
    nv = binding([gpu])
    watch = watches(pynvml=nv, every_s=every_s, wait_s=0.02)
    sampled(watch)
    gpu.ecc, gpu.recovery = 2, 4     # the H200's values with two changed
    got = []
    until(lambda: got.extend(watch.look(time.monotonic())) or len(got) >= 2)
    events = [e for e in got if e["kind"] in ("ecc", "recovery")]
    assert sorted((e["kind"], e["fatal"]) for e in events) == [("ecc", True), ("recovery", True)]
    for event in events:
        assert every_s <= event["age_err_s"] < every_s + 15.0
        assert event["age_s"] >= 0.0 and event["source"] == "nvml"


# -- issue 65, item 14: a row remapping that failed ---------------------------------------------

def test_a_failed_row_remapping_is_fatal_naming_the_gpu_and_a_pending_one_a_warning(watches):
    """nvmlDeviceGetRemappedRows answers (corrRows, uncRows, isPending, failureOccurred);
    a7e0410 read isPending only: a GPU that could not remap a row went unsaid."""
    gpus = [Gpu(bus) for bus in H100X8_BUSES]
    watch = watches(pynvml=binding(gpus), every_s=0.02, wait_s=0.02)
    sampled(watch)
    gpus[2].rows = (0, 1, 1, 0)   # a row marked for remapping: a reset applies it
    (pending,) = collect(watch, lambda e: e["kind"] == "remap")
    assert (pending["code"], pending["fatal"], pending["gpu"]) == ("pending", False, 2)
    gpus[6].rows = (0, 512, 0, 1)  # its bank's spare rows used up: the remapping failed
    (failed,) = collect(watch, lambda e: e["kind"] == "remap")
    assert (failed["code"], failed["fatal"], failed["gpu"], failed["pci_bus"]) == (
        "failed", True, 6, H100X8_BUSES[6].lower()[4:])
    assert failed["line"].startswith("GPU 6 (%s): row remapping failed" % failed["pci_bus"])
    sampled(watch, 3)
    assert [e for e in watch.look(time.monotonic()) if e["kind"] == "remap"] == []  # once
    # nvidia-smi's remapped_rows.failure (the field query-health.csv asked the H200's driver).
    csv = (H200 / "query-health.csv").read_text()
    before = gpuwatch.parse_smi(csv)
    after = gpuwatch.parse_smi(csv.replace(", No, No, 16", ", No, Yes, 16"))
    assert (before[0]["remap_failed"], after[0]["remap_failed"]) == (False, True)
    assert [(e["kind"], e["code"], e["fatal"]) for e in gpuwatch.changes(before, after)] == [
        ("remap", "failed", True)]
    # The flag is sticky: set long ago, then one unread sample (None), then read again is no
    # new fault (the review's repro: it killed the run and drained the host).
    unread = {0: dict(after[0], remap_failed=None, remap_pending=None)}
    assert gpuwatch.changes(after, unread) == [] and gpuwatch.changes(unread, after) == []


# -- item 4: NVML never blocks the loop; a stuck driver is an event -----------------------------

def test_a_gpu_that_stops_answering_blocks_only_the_watch_a_warning_then_fatal(watches):
    gpus = [Gpu(bus) for bus in H100X8_BUSES]
    nv = binding(gpus)
    # No event set (as where registering fails): only the sampling thread's calls are in
    # flight, so the looks below may pretend to be later than they are.
    nv.fail["nvmlDeviceRegisterEvents"] = nv.NVMLError_NotSupported()
    watch = watches(pynvml=nv, every_s=0.05, wait_s=0.02)
    sampled(watch)
    release = threading.Event()
    nv.hang["nvmlDeviceGetTotalEccErrors"] = (3, release)    # GPU 3's firmware (Xid 119)
    assert nv.entered.wait(20.0)
    began = time.monotonic()
    assert watch.look(began) == []                 # not yet late
    assert time.monotonic() - began < 0.5          # and it did not wait for the driver
    assert watch.how == "nvml" and watch.processes() is not None
    (warning,) = watch.look(time.monotonic() + gpuwatch.NVML_DEADLINE_S + 0.1)
    assert (warning["kind"], warning["code"], warning["fatal"], warning["gpu"],
            warning["pci_bus"]) == ("nvml", "timeout", False, 3, "0000:86:00.0")
    assert "NVML did not answer in 2 s" in warning["what"]
    assert warning["age_s"] >= gpuwatch.NVML_DEADLINE_S and warning["age_err_s"] >= 0.0
    assert watch.look(time.monotonic() + gpuwatch.NVML_DEADLINE_S + 0.2) == []   # once
    (fatal,) = watch.look(time.monotonic() + gpuwatch.NVML_FATAL_S + 0.1)
    assert (fatal["kind"], fatal["code"], fatal["fatal"], fatal["gpu"]) == (
        "nvml", "timeout", True, 3)
    assert watch.look(time.monotonic() + gpuwatch.NVML_FATAL_S + 1.0) == []
    release.set()       # the driver answers again: sampling goes on, no more stall events
    del nv.hang["nvmlDeviceGetTotalEccErrors"]
    sampled(watch, 2)
    assert [e for e in watch.look(time.monotonic()) if e["kind"] == "nvml"] == []
    assert watch.stall_sent == 0


def test_while_one_gpus_calls_hang_the_other_gpus_xids_are_read(watches):
    nv = binding([Gpu(bus) for bus in H100X8_BUSES])
    watch = watches(pynvml=nv, every_s=0.05, wait_s=0.02)
    sampled(watch)
    nv.hang["nvmlDeviceGetTotalEccErrors"] = (3, threading.Event())
    assert nv.entered.wait(20.0)
    nv.xids.put((5, 79))
    (event,) = collect(watch, lambda e: e["kind"] == "xid")
    assert (event["gpu"], event["pci_bus"], event["fatal"]) == (5, "0000:a8:00.0", True)
    assert event["age_err_s"] < 2.0


def test_nvml_init_that_hangs_is_said_without_blocking_construction(watches):
    nv = binding([Gpu()])
    nv.hang["nvmlInit"] = (None, threading.Event())
    began = time.monotonic()
    watch = watches(pynvml=nv)
    assert nv.entered.wait(20.0)
    assert time.monotonic() - began < 5.0 and watch.how is None
    assert watch.look(time.monotonic() + 1.0) == []   # init has NVML_INIT_S of its own
    (event,) = watch.look(time.monotonic() + gpuwatch.NVML_INIT_S + gpuwatch.NVML_DEADLINE_S
                          + 0.1)
    assert (event["kind"], event["fatal"], event["gpu"]) == ("nvml", False, None)


def test_pynvml_11_is_read_through_the_names_it_has(watches):
    gpu = Gpu()
    nv = binding([gpu], old=True)
    assert not hasattr(nv, "nvmlDeviceGetCurrentClocksEventReasons")
    watch = watches(pynvml=nv, every_s=0.02, wait_s=0.02)
    sample = sampled(watch)
    assert sample[0]["reasons"] == 1 and sample[0]["ecc_uncorrected"] == 0
    assert sample[0]["recovery"] is None      # no field id: not asked (0 is another field)
    assert "nvmlDeviceGetFieldValues" not in nv.calls
    assert watch.how == "nvml" and watch.processes() == {"0000:00:06.0": set()}
    assert "nvmlDeviceGetRemappedRows" in watch.error()   # said, not fatal to the rest
    gpu.reasons = 4 | 0x40
    (event,) = collect(watch, lambda e: e["kind"] == "clocks")
    assert event["what"] == "clocks held down: HW thermal slowdown" and not event["fatal"]
    nv.xids.put((0, 79))
    collect(watch, lambda e: e["kind"] == "xid" and e["fatal"])


@pytest.mark.parametrize("exc", ["NVMLError_Unknown", "RuntimeError", "AttributeError"])
def test_every_call_failing_is_not_said_to_be_nvml_and_the_watch_goes_on(watches, exc):
    nv = binding([Gpu()])
    error = getattr(nv, exc)() if exc.startswith("NVML") else {
        "RuntimeError": RuntimeError("ctypes: argument 1: wrong type"),
        "AttributeError": AttributeError("function 'nvmlDeviceGetRemappedRows' not found")}[exc]
    names = ["nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows",
             "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons",
             "nvmlDeviceGetFieldValues", "nvmlDeviceGetComputeRunningProcesses",
             "nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses_v3",
             "nvmlEventSetWait_v2", "nvmlEventSetWait"]
    for name in names:
        nv.fail[name] = error
    watch = watches(pynvml=nv, every_s=0.02, wait_s=0.02)
    sampled(watch, 2)
    assert watch.how is None
    assert watch.error().startswith("nvml: ") and "nvmlDeviceGetTotalEccErrors" in watch.error()
    assert "Xid events" in watch.error()
    assert watch.thread.is_alive()
    nv.fail.clear()                       # the driver answers again
    until(lambda: watch.how == "nvml" and watch.error() is None)


def test_nvml_that_cannot_start_falls_back_to_nvidia_smi(watches):
    nv = binding([Gpu()])
    nv.fail["nvmlInit"] = _error("NVMLError_DriverNotLoaded", 9, "Driver Not Loaded")()
    smi = Smi(HELP_R535)
    watch = watches(smi, pynvml=nv, every_s=0.02)
    until(lambda: watch.how == "nvidia-smi")
    assert watch.buses() == ["0000:00:06.0"]


# -- item 4: nvidia-smi, asked for the fields its driver has, in the thread --------------------

# `nvidia-smi --help-query-gpu`, the lines this watch reads, as the drivers print them: R535
# and later list the new name with the old as an alias; before R535 only the old one (the
# rename: telegraf PR #19455, netdata issue #15755; the H200's 580 driver answers
# query-health.csv's clocks_event_reasons.active).
HELP_HEAD = '''List of valid properties to query for the switch "--query-gpu":

"index"
Zero based index of the GPU. Can change at each boot.

"pci.bus_id" or "gpu_bus_id"
PCI bus id as "domain:bus:device.function", in hex.

"ecc.errors.uncorrected.volatile.total"
Total errors detected across entire chip.
'''
HELP_R535 = HELP_HEAD + '''
"remapped_rows.pending"
Indicates whether or not remapped rows are pending.

"remapped_rows.failure"
Indicates whether or not a row remapping has failed.

"clocks_event_reasons.active" or "clocks_throttle_reasons.active"
Bitmask of active clock event reasons. See nvml.h for more details.
'''
HELP_R470 = HELP_HEAD + '''
"remapped_rows.pending"
Indicates whether or not remapped rows are pending.

"clocks_throttle_reasons.active"
Bitmask of active clock throttle reasons. See nvml.h for more details.
'''
HELP_R418 = HELP_HEAD + '''
"clocks_throttle_reasons.active"
Bitmask of active clock throttle reasons. See nvml.h for more details.
'''
# query-health.csv's values, by field.
HEALTH = dict(zip(*[[c.strip() for c in line.split(",")] for line in
                    (H200 / "query-health.csv").read_text().splitlines()], strict=True))
HEALTH.update({"pci.bus_id": IDLE["pci"],
               "clocks_throttle_reasons.active": HEALTH["clocks_event_reasons.active"]})


class Smi:
    """A stand-in `command` runner for nvidia-smi: a driver whose help lists `help_text`,
    which fails a query naming a field it does not list, as nvidia-smi does."""

    def __init__(self, help_text, apps=""):
        self.help, self.apps, self.argv = help_text, apps, []
        self.hang = None
        self.entered = threading.Event()

    def __call__(self, argv, timeout_s):
        self.argv.append(argv)
        assert timeout_s <= gpuwatch.SMI_TIMEOUT_S
        if self.hang is not None:
            self.entered.set()
            self.hang.wait()
            return None, Failed("nvidia-smi did not answer within %g s" % timeout_s)
        if argv[1] == "--help-query-gpu":
            return self.help, None
        if argv[1].startswith("--query-compute-apps="):
            return "gpu_bus_id, pid\n" + self.apps, None
        fields = argv[1].split("=", 1)[1].split(",")
        known = gpuwatch.parse_help(self.help)
        bad = [f for f in fields if f not in known]
        if bad:
            return None, Failed('Field "%s" is not a valid field to query.' % bad[0], 2)
        return ", ".join(fields) + "\n" + ", ".join(HEALTH[f] for f in fields) + "\n", None


@pytest.mark.parametrize("help_text, reasons", [
    (HELP_R535, "clocks_event_reasons.active"),
    (HELP_R470, "clocks_throttle_reasons.active"),
    (HELP_R418, "clocks_throttle_reasons.active")])
def test_nvidia_smi_is_asked_for_the_fields_its_driver_lists(watches, help_text, reasons):
    smi = Smi(help_text, apps="%s, %d\n" % (IDLE["pci"], LOAD_PID))
    watch = watches(smi, pynvml=False, every_s=0.02)
    sample = sampled(watch, 3)
    query = [a[1] for a in smi.argv if a[1].startswith("--query-gpu=")]
    assert all(reasons in q and q.startswith("--query-gpu=index,pci.bus_id,") for q in query)
    assert sample == {0: {"pci_bus": "0000:00:06.0", "ecc_uncorrected": 0,
                          "remap_pending": None if help_text is HELP_R418 else False,
                          "remap_failed": False if help_text is HELP_R535 else None,
                          "reasons": 1}}
    assert [a[1] for a in smi.argv].count("--help-query-gpu") == 1
    assert watch.how == "nvidia-smi" and watch.error() is None
    assert watch.processes() == {"0000:00:06.0": {LOAD_PID}}
    # Compute processes once known: every SMI_APPS_EVERY_S, not every sample.
    assert [a[1] for a in smi.argv].count(gpuwatch.SMI_APPS[1]) == 1


def test_a_driver_whose_query_fails_is_said_and_not_called_nvidia_smi(watches):
    smi = Smi(HELP_R535)
    smi.help = smi.help.replace('"index"', '"idx"')      # no index: nothing to ask
    watch = watches(smi, pynvml=False, every_s=0.02)
    until(lambda: len(smi.argv) >= 2)
    assert watch.how is None and "--help-query-gpu" in watch.error()


def test_nvidia_smi_that_hangs_blocks_only_the_watch(watches):
    smi = Smi(HELP_R535)
    watch = watches(smi, pynvml=False, every_s=0.02)
    sampled(watch)
    smi.hang = threading.Event()
    assert smi.entered.wait(20.0)
    began = time.monotonic()
    assert watch.look(began) == [] and time.monotonic() - began < 0.5
    smi.hang.set()            # it returns: "did not answer within 10 s"
    (event,) = collect(watch, lambda e: e["kind"] == "nvml")
    assert (event["code"], event["fatal"]) == ("timeout", False)
    assert event["what"].startswith("nvidia-smi did not answer")


def test_a_stalled_nvidia_smi_stays_a_warning_however_long(watches):
    # Another nvidia-smi or DCGM holding the driver lock stalls every call of this one, on no
    # GPU it names: a host without pynvml is not drained for it (review 57, finding 7).
    smi = Smi(HELP_R535)
    watch = watches(smi, pynvml=False, every_s=0.02)
    sampled(watch)
    smi.hang = threading.Event()
    assert smi.entered.wait(20.0)
    late = time.monotonic() + gpuwatch.SMI_TIMEOUT_S + gpuwatch.NVML_FATAL_S * 10
    (event,) = watch.look(late)
    assert (event["kind"], event["code"], event["fatal"]) == ("nvml", "timeout", False)
    assert watch.look(late + 1.0) == []      # once
    smi.hang.set()


# -- the pure parts -----------------------------------------------------------------------------

def test_parsers_on_recorded_and_stated_outputs():
    assert gpuwatch.smi_fields(gpuwatch.parse_help(HELP_R535)) == (
        "index,pci.bus_id,ecc.errors.uncorrected.volatile.total,remapped_rows.pending,"
        "remapped_rows.failure,clocks_event_reasons.active")
    assert gpuwatch.smi_fields(set()) is None
    assert gpuwatch.parse_apps("gpu_bus_id, pid\n") == {}
    assert gpuwatch.parse_apps("No running processes found\n") is None
    assert gpuwatch.parse_apps("gpu_bus_id, pid\n00000000:53:00.0, 11\n00000000:53:00.0, 12\n"
                               "00000000:64:00.0, 13\n") == {"0000:53:00.0": {11, 12},
                                                             "0000:64:00.0": {13}}
    assert gpuwatch.parse_smi((H200 / "query-health.csv").read_text())[0]["reasons"] == 1


@settings(max_examples=examples(200), deadline=None)
@given(st.text(max_size=400))
def test_parsers_never_raise(text):
    assert isinstance(gpuwatch.parse_smi(text), dict)
    assert isinstance(gpuwatch.parse_help(text), set)
    apps = gpuwatch.parse_apps(text)
    assert apps is None or all(isinstance(p, int) for pids in apps.values() for p in pids)


# Xid codes of each class of NVIDIA's catalog (xid.py): 79, 48, 119 drain; 13, 43 are the
# program's; 63, 92 warn; 999 is no code the catalog has.
XIDS = st.lists(st.sampled_from([79, 48, 119, 13, 43, 63, 92, 999]), max_size=3)
SAMPLES = st.dictionaries(st.integers(0, 7), st.fixed_dictionaries({
    "pci_bus": st.sampled_from([None, "0000:00:06.0"]),
    "ecc_uncorrected": st.one_of(st.none(), st.integers(0, 10)),
    "remap_pending": st.one_of(st.none(), st.booleans()),
    "remap_failed": st.one_of(st.none(), st.booleans()),
    "reasons": st.one_of(st.none(), st.integers(0, 0x1FF)),
    "recovery": st.one_of(st.none(), st.integers(0, 5)),
    "xids": XIDS}), max_size=8)


@settings(max_examples=examples(100), deadline=None)
@given(SAMPLES, SAMPLES)
def test_changes_is_pure_and_fatal_only_for_ecc_remap_failure_recovery_and_xid(before, after):
    """Issue 65: the samples carry Xids (a7e0410's had none, so the Xid rule was never
    reached here) and remap failures."""
    frozen = json.dumps([before, after], sort_keys=True)
    events = gpuwatch.changes(before, after)
    assert json.dumps([before, after], sort_keys=True) == frozen
    assert events == gpuwatch.changes(before, after)
    assert all(e["kind"] in ("ecc", "recovery") or (e["kind"], e["code"]) == ("remap", "failed")
               or e["kind"] == "xid" and xid.classify(e["code"])[0] == "drain"
               for e in events if e["fatal"])
    # Each Xid a sample carries is one event on its GPU, fatal where the catalog drains.
    assert sorted((e["gpu"], e["code"], e["fatal"]) for e in events if e["kind"] == "xid") == \
        sorted((gpu, code, xid.classify(code)[0] == "drain") for gpu, now in after.items()
               for code in now["xids"])
    # The sampled values say nothing twice; the Xids are events each time they are read.
    assert [e for e in gpuwatch.changes(after, after) if e["kind"] != "xid"] == []
