"""The HTML report's render time and size at 16 / 128 / 512 hosts."""
from __future__ import annotations

import time

from bench.harness import stats
from lab.ports import free_port


def run(args, tmp):
    """The HTML report of a record built from a real 2-host collective run's shape, repeated
    for 16 / 128 / 512 hosts (lab/scaled_record.py builds it): render time and
    size, each size against the 16-host page rendered in the same process."""
    import torchfleet
    from torchfleet import html_report

    from lab.scaled_record import scaled

    real = torchfleet.collective(runs_root=tmp / "report-runs", master_port=free_port())
    out = {}
    for n in args.report_sizes:
        run_dir = scaled(real.run_dir, tmp / ("report%d" % n), n)
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            page = html_report.write(run_dir)
            times.append(time.perf_counter() - start)
        out["hosts%d" % n] = {"hosts": n, "render_s": stats(times),
                              "bytes": page.stat().st_size}
    return out
