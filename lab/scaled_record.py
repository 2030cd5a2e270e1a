"""A record of any number of hosts built from a real run's shape, for the HTML report's tests
and the report_scale benchmark: the 2-host collective run's preflight.json and
collective.json, each host's entries repeated for n hosts in inventory order, two hosts broken,
and a ring schedule's pair rounds with one slow host."""
from __future__ import annotations

import copy
import json

BROKEN_PREFLIGHT, BROKEN_RUN, SLOW = "node17", "node300", "node400"


def scaled(src, dest, n):
    """dest/ holds src's reports with n hosts in place of the real run's two."""
    names = ["node%d" % i for i in range(n)]
    pre = json.loads((src / "preflight.json").read_text())
    template = [c for c in pre["checks"] if c["host"] == "node0"]
    host0 = next(h for h in pre["hosts"] if h["host"] == "node0")
    pre["checks"] = [c for c in pre["checks"] if c["host"] == "controller"]
    pre["hosts"] = []
    for i, name in enumerate(names):
        for c in template:
            c = dict(c, host=name)
            if name == BROKEN_PREFLIGHT and c["id"] == "port.blocked":
                c.update(ok=False, severity="error", detail="cannot open TCP 10.0.0.1:29500 "
                         "(dropped: no answer in 3 s, a firewall?)")
            pre["checks"].append(c)
        pre["hosts"].append(dict(host0, host=name, node_rank=i))
    run = json.loads((src / "collective.json").read_text())
    row0 = next(h for h in run["hosts"] if h["host"] == "node0")
    rank0 = next(r for r in run["ranks"] if r["host"] == "node0")
    exit0 = [c for c in run["checks"] if c["host"] == "node0"]
    run["hosts"], run["ranks"] = [], []
    run["checks"] = [c for c in run["checks"] if c["host"] == "controller"]
    for i, name in enumerate(names):
        broken = name == BROKEN_RUN
        run["hosts"].append(dict(copy.deepcopy(row0), host=name, node_rank=i, ranks=[i],
                                 outcome="failed" if broken else row0["outcome"],
                                 rc=1 if broken else row0["rc"]))
        run["ranks"].append(dict(rank0, rank=i, host=name, ok=not broken,
                                 state="failed" if broken else rank0["state"],
                                 exit_code=1 if broken else rank0["exit_code"]))
        run["checks"] += [dict(c, host=name, ok=not broken) for c in exit0]
    # Ring schedule: each host with its next and the one after (about 2 pairs a host).
    pairs = []
    for i, name in enumerate(names):
        for step in (1, 2):
            other = names[(i + step) % n]
            slow = SLOW in (name, other)
            pairs.append({"a": name, "b": other, "busbw_gbs": 0.2 if slow else 1.0,
                          "latency_us": 80.0, "error": None, "slow": slow})
    run["isolate"] = {"schedule": "ring", "rounds": 4, "time_s": 12.5, "threshold": 0.5,
                      "reference_gbs": 1.0, "pairs": pairs, "slow_nodes": [SLOW],
                      "slow_links": []}
    run["ok"] = False
    dest.mkdir()
    (dest / "preflight.json").write_text(json.dumps(pre))
    (dest / "collective.json").write_text(json.dumps(run))
    return dest
