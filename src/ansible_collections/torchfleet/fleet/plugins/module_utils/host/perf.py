"""`health=full`: is every GPU as fast as its peers? (dcgmi diag's levels, compared across hosts)

Every host runs MEASURE in its torch interpreter at once: a matmul (TFLOPS: bf16 on a GPU,
fp32 on one CPU thread) and a device-memory copy (GB/s, bytes read plus written), on every GPU
in parallel, or on the CPU where there is none, so the lab can test it. Each measurement waits
for a wall-clock instant the controller chose, so the hosts run side by side (on a machine that
hosts several lab nodes they share its cores evenly), then counts the work done in a fixed
window. `compare` names every device more than `slow_pct` below the median of its model across
the fleet, and any below an absolute floor given for its model.
"""
from __future__ import annotations

import json

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.records import check, fmt_hosts

MATMUL_S = 2.0
COPY_S = 1.0

# argv: [start_at (epoch s), device ("cpu" or a CUDA index)]; prints one JSON line.
# argv: [start_at (epoch s), devices ("cpu", or CUDA indexes "0,1,..."), matmul_s, copy_s];
# prints one JSON line per device. With several GPUs it runs itself (its text is in the
# environment, PROGRAM_ENV) once per GPU, all at once: one process each, so no GPU's
# measurement waits on another's.
PROGRAM_ENV = "TORCHFLEET_PERF_PROGRAM"
MEASURE = r"""
import json, os, subprocess, sys, time
start_at, device = float(sys.argv[1]), sys.argv[2]
matmul_s, copy_s = float(sys.argv[3]), float(sys.argv[4])
if "," in device:
    program = os.environ["TORCHFLEET_PERF_PROGRAM"]
    procs = [(d, subprocess.Popen([sys.executable, "-c", program, sys.argv[1], d] + sys.argv[3:5],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True))
             for d in device.split(",")]
    for d, proc in procs:
        out, err = proc.communicate()
        line = (out.strip().splitlines() or [""])[-1]
        print(line if proc.returncode == 0 and line.startswith("{") else
              json.dumps({"device": d, "error": (err or out).strip()[-300:]
                          or "exit status %s" % proc.returncode}))
    sys.exit(0)
import torch
if device == "cpu":
    # One thread on the host's first CPU: a per-core figure, and hosts that share a machine
    # (the lab) share one run queue, which the kernel divides evenly; spread over several
    # CPUs, the one that got a CPU to itself would look faster.
    import os
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    torch.set_num_threads(1)
    dev, dtype, n, nbytes = torch.device("cpu"), torch.float32, 256, 32 << 20
    name = "CPU"
    try:
        with open("/proc/cpuinfo") as f:
            name = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), name)
    except OSError:
        pass
    sync = lambda: None
else:
    dev, dtype, n, nbytes = torch.device("cuda", int(device)), torch.bfloat16, 8192, 1 << 30
    name = torch.cuda.get_device_name(dev)
    sync = lambda: torch.cuda.synchronize(dev)
a = torch.randn(n, n, device=dev, dtype=dtype)
b = torch.randn(n, n, device=dev, dtype=dtype)
src = torch.empty(nbytes // 4, device=dev, dtype=torch.float32)
dst = torch.empty_like(src)
torch.mm(a, b); dst.copy_(src); sync()  # warm: kernels chosen, pages touched
late = time.time() - start_at
if late < 0:
    time.sleep(-late)

def rate(step, seconds, work):
    done, t0 = 0, time.perf_counter()
    while True:
        for _ in range(4):
            step()
        sync()
        done += 4
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return done * work / elapsed

tflops = rate(lambda: torch.mm(a, b), matmul_s, 2.0 * n ** 3) / 1e12
gbps = rate(lambda: dst.copy_(src), copy_s, 2.0 * nbytes) / 1e9
print(json.dumps({"device": device, "name": name, "tflops": tflops, "gbps": gbps,
                  "late_s": max(late, 0.0), "dtype": str(dtype).replace("torch.", "")}))
"""


def checked(data):
    """One measurement as a host reported it, verified: a dict with finite numbers and a
    device that is "cpu" or a GPU index; None otherwise (a host's answer is not trusted)."""
    if not isinstance(data, dict):
        return None
    try:
        out = {"device": str(data["device"])[:16], "name": str(data["name"])[:120],
               "tflops": float(data["tflops"]), "gbps": float(data["gbps"]),
               "late_s": float(data.get("late_s", 0.0)), "dtype": str(data.get("dtype", ""))[:16]}
    except (KeyError, TypeError, ValueError):
        return None
    if not all(0 <= out[k] < 1e7 for k in ("tflops", "gbps")):
        return None
    if out["device"] != "cpu" and not (out["device"].isascii() and out["device"].isdigit()):
        return None
    return out


def parse_lines(text):
    """(measurements, first error) of MEASURE's output: one JSON line per device, each checked
    (a line that says a device failed is that device's error)."""
    found, error = [], None
    for line in str(text)[-(1 << 20):].splitlines():
        try:
            data = json.loads(line)
        except ValueError:
            continue
        one = checked(data)
        if one is not None:
            found.append(one)
        elif isinstance(data, dict) and data.get("error"):
            error = error or "device %s: %s" % (str(data.get("device"))[:16],
                                                str(data["error"])[-300:])
    return found, error


def _label(device):
    return "CPU" if device["device"] == "cpu" else "GPU %s" % device["device"]


def _unit(device):
    # A CPU thread does GFLOPS; TFLOPS would print 0.05.
    if device["device"] == "cpu":
        return device["tflops"] * 1e3, "GFLOPS %s" % device["dtype"]
    return device["tflops"], "TFLOPS %s" % device["dtype"]


def _median(values):
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def compare(results, slow_pct, floors=None, late_s=defaults.PERF_LATE_S):
    """gpu.perf / cpu.perf records: `results` {host: {"devices": [...], "error": str|None}}."""
    floors = floors or {}
    records, by_model = [], {}
    for host, result in results.items():
        if result.get("error"):
            cid = "gpu.perf" if result.get("gpus") else "cpu.perf"
            records.append(check(cid, host, False, "the measurement failed: %s"
                                 % str(result["error"])[:300],
                                 "run the matmul on %s by hand (python -c 'import torch; ...') "
                                 "and fix what it says" % host))
            continue
        for device in result.get("devices") or []:
            by_model.setdefault(device["name"], []).append((host, device))
    for model, entries in by_model.items():
        # CPUs of hosts that share a machine (the lab) share its cores, so the hosts that
        # started on time, side by side, are the reference. One that started late ran part of
        # its window with fewer beside it: it can only look faster than it is, so it is held
        # to that reference too, and named only when it is slower still. GPUs are measured
        # each on its own: every one counts.
        reference = [d for _h, d in entries if d["device"] != "cpu" or d["late_s"] <= late_s]
        if len(reference) < 3 <= len(entries):
            late = [h for h, d in entries if d not in reference]
            for host, device in entries:
                records.append(check("cpu.perf", host, True, "CPU: %.3g %s, not compared: "
                                     "fewer than 3 hosts started on time (%s late)" % (
                                         _unit(device)[0], _unit(device)[1], fmt_hosts(late))))
            continue
        medians = {k: _median([d[k] for d in reference] or [0.0]) for k in ("tflops", "gbps")}
        floor = next((v for key, v in floors.items() if key.lower() in model.lower()), {})
        for host, device in entries:
            cid = "cpu.perf" if device["device"] == "cpu" else "gpu.perf"
            problems = []
            for key in ("tflops", "gbps"):
                value, median = device[key], medians[key]
                shown = _unit(device) if key == "tflops" else (value, "GB/s copy")
                ref = _unit(dict(device, tflops=median))[0] if key == "tflops" else median
                if len(reference) > 2 and median > 0 and value < median * (1 - slow_pct / 100.0):
                    problems.append("%.3g %s, %.0f %% below the fleet median %.3g" % (
                        shown[0], shown[1], 100 * (1 - value / median), ref))
                if key in floor and value < float(floor[key]):
                    problems.append("%.3g %s, below the floor %g for %s" % (
                        shown[0], shown[1], float(floor[key]), model))
            label = _label(device)
            record = check(cid, host, not problems,
                           "%s: %s" % (label, "; ".join(problems)) if problems else
                           "%s: %.3g %s, %.3g GB/s copy (fleet median %.3g, %.3g)" % (
                               label, _unit(device)[0], _unit(device)[1], device["gbps"],
                               _unit(dict(device, tflops=medians["tflops"]))[0],
                               medians["gbps"]),
                           "check %s's cooling, power cap and clocks (nvidia-smi -q -d "
                           "PERFORMANCE), or what else runs there; drain it if it stays slow"
                           % host if device["device"] != "cpu" else
                           "check what else runs on %s and its CPU limits (cgroup quota, "
                           "frequency governor)" % host,
                           gpu=None if device["device"] == "cpu" else int(device["device"]))
            records.append(record)
    return records
