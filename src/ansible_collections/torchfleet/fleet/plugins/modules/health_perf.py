#!/usr/bin/python
# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
module: health_perf
short_description: Measure every GPU's matmul and memory-copy speed (or the CPU's), for preflight's health=full
description:
  - Runs a short matmul (TFLOPS, bf16 on a GPU) and a device-memory copy (GB/s) on every GPU
    of the host at once, one process each, in the interpreter that has torch; on a host
    without GPUs, on one CPU thread (GFLOPS fp32).
  - Every measurement waits for O(start_at), a wall-clock instant the controller chose, so
    every host measures at the same time; preflight then compares each device with the
    fleet's median (M(torchfleet.fleet.preflight_checks)).
  - Changes nothing on the host; each process is bounded by O(timeout_s).
version_added: "0.1.0"
author: torchfleet developers (@torchfleet)
options:
  python:
    description: Interpreter that has torch. Defaults to the interpreter running this module.
    type: str
  gpus:
    description: Number of GPUs to measure (node_probe's count); 0 measures the CPU. AMD GPUs
      are measured through torch's HIP build, which names them C(cuda) too.
    type: int
    default: 0
  start_at:
    description: Epoch seconds at which every measurement starts; a process that is ready
      later starts at once (its lateness is returned).
    type: float
    required: true
  timeout_s:
    description: Longest the measurement may take on this host, torch's import included.
    type: float
    default: 120
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: linux
"""

EXAMPLES = r"""
- name: Measure every GPU of the host, starting in 20 s
  torchfleet.fleet.health_perf:
    python: /opt/venv/bin/python
    gpus: 8
    start_at: "{{ now(utc=true).timestamp() + 20 }}"
"""

RETURN = r"""
devices:
  description: One entry per GPU (or the CPU) measured.
  returned: always
  type: list
  elements: dict
  sample: [{"device": "0", "name": "NVIDIA H100 80GB HBM3", "tflops": 702.3, "gbps": 2710.4,
            "late_s": 0.0, "dtype": "bfloat16"}]
gpus:
  description: Number of GPUs measured (0 for the CPU).
  returned: always
  type: int
error:
  description: Why a measurement failed (the first one); null when every one answered.
  returned: always
  type: str
"""

import sys

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.torchfleet.fleet.plugins.module_utils.host import perf
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.command import bounded


def measure(run, python, devices, start_at):
    """(results, first error): MEASURE over every device at once (one process per GPU)."""
    out, why = run([python, "-c", perf.MEASURE, repr(start_at), ",".join(devices),
                    repr(perf.MATMUL_S), repr(perf.COPY_S)])
    if out is None:
        return [], str(why)
    results, error = perf.parse_lines(out)
    missing = [d for d in devices if d not in {r["device"] for r in results}]
    if missing and not error:
        error = "device %s: no measurement in its answer" % ", ".join(missing)
    return results, error


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type="str"),
            gpus=dict(type="int", default=0),
            start_at=dict(type="float", required=True),
            timeout_s=dict(type="float", default=120),
        ),
        supports_check_mode=True,
    )
    params = module.params
    devices = [str(i) for i in range(params["gpus"])] or ["cpu"]
    # The program is handed to the per-GPU processes it starts through the environment.
    module.run_command_environ_update = {perf.PROGRAM_ENV: perf.MEASURE}
    run = bounded(module, params["timeout_s"])
    results, error = measure(run, params["python"] or sys.executable, devices,
                             params["start_at"])
    module.exit_json(changed=False, devices=results, gpus=params["gpus"], error=error)


if __name__ == "__main__":
    main()
