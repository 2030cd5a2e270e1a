"""The HTML report at 512 hosts, from a record built from a real run's shape: the 2-host
collective run's preflight.json and collective.json, each host's entries repeated for 512
hosts in inventory order, two hosts broken, and a ring schedule's pair rounds with one slow
host. Failing hosts come first, the others fold into one row per outcome, the heat map is one
SVG; the page stays under 2 MB and headless chromium draws it (a screenshot at 128 hosts)."""
from __future__ import annotations

import copy
import json

import pytest

from tests.api.test_report_browser import chromium, png_pixels
from torchfleet import html_report

pytestmark = pytest.mark.integration
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


def test_512_hosts_fit_in_one_page_failing_hosts_first(tmp_path, collective_run):
    result, _ = collective_run
    page = html_report.write(scaled(result.run_dir, tmp_path / "r512", 512))
    html = page.read_text()
    assert len(html.encode()) < 2 << 20, "%d bytes" % len(html.encode())
    # Preflight: the failed host has its row; the other 511 fold into one row (the real run's
    # hosts all passed, or all had the same warning, such as hang.stacks without py-spy).
    matrix = html.split('<table class="matrix">', 1)[1].split("</table>", 1)[0]
    assert "<tr><th>%s</th>" % BROKEN_PREFLIGHT in matrix
    assert matrix.count('<tr class="folded"><th>511 hosts</th>') == 1
    # The run: the failed host and rank listed, the others folded per outcome.
    hosts_table = html.split('<table class="hosts">', 1)[1].split("</table>", 1)[0]
    assert hosts_table.index(">%s<" % BROKEN_RUN) < hosts_table.index("511 hosts")
    assert hosts_table.count("<tr") == 1 + 1 + 1  # header, the failed host, the folded row
    assert '<tr class="rank bad"><td>300</td>' in html and "511 ranks" in html
    # The heat map: one SVG, a square per measured pair and direction, the slow host marked.
    assert html.count('<rect class="pair') == 2 * 2 * 512
    assert 'class="slow-node"' in html and "node.slow: %s" % SLOW in html
    assert '<table class="heat">' not in html


def test_128_hosts_render_in_headless_chromium(tmp_path, collective_run):
    result, _ = collective_run
    page = html_report.write(scaled(result.run_dir, tmp_path / "r128", 128))
    dom = chromium(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count('<rect class="pair') == 2 * 2 * 128
    shot = tmp_path / "report.png"
    done = chromium(tmp_path, "--screenshot=%s" % shot, "--window-size=1100,3000", page.as_uri())
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    width, height, rows = png_pixels(shot)
    colours = {px for row in rows[::7] for px in row[::7]}
    # The heat map's red marks (the slow host, #cf222e at 25 % over grey and its red pairs)
    # are drawn: some strongly red pixels.
    assert any(r > 180 and g < 140 and b < 140 for r, g, b in colours), sorted(colours)[:20]
