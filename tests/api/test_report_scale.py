"""The HTML report at 512 hosts, from a record built from a real run's shape: the 2-host
collective run's preflight.json and collective.json, each host's entries repeated for 512
hosts in inventory order, two hosts broken, and a ring schedule's pair rounds with one slow
host. Failing hosts come first, the others fold into one row per outcome, the heat map is one
SVG; the page stays under 2 MB and headless chromium draws it (a screenshot at 128 hosts)."""
from __future__ import annotations


import pytest

from tests.api.test_report_browser import chromium, png_pixels
from lab.scaled_record import BROKEN_PREFLIGHT, BROKEN_RUN, SLOW, scaled
from torchfleet import html_report

pytestmark = pytest.mark.integration


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
