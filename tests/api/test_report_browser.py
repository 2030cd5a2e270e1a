"""The HTML report of a real collective run, rendered by a real browser (Debian's chromium,
headless): the DOM it builds holds a chart per op, and the screenshot shows them."""
from __future__ import annotations

import shutil
import struct
import subprocess
import zlib

import pytest

from torchfleet import html_report

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]


def chromium(tmp_path, *args):
    assert CHROMIUM, "chromium is not installed: .ci/run installs Debian's chromium"
    return subprocess.run([CHROMIUM, *FLAGS, "--user-data-dir=%s" % (tmp_path / "profile"), *args],
                          capture_output=True, text=True, timeout=120)


def png_pixels(path):
    """(width, height, rows of RGB tuples) of an 8-bit RGB/RGBA PNG, without an image library."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8 and color in (2, 6)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[i:i + 3]) for i in range(0, stride, bpp)])
        prev = line
    return width, height, rows


def test_report_renders_a_busbw_chart_per_op_in_headless_chromium(tmp_path, collective_run):
    result, _ = collective_run
    page = html_report.write(result.run_dir, tmp_path / "report.html")
    dom = chromium(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    ops = [op for op, rows in result.busbw_by_op().items() if any(r.size_bytes for r in rows)]
    assert len(ops) == 5  # barrier moves no bytes: no chart
    for op in ops:
        assert 'class="busbw-chart" data-op="%s"' % op in html
    assert html.count('class="band"') == len(ops) and html.count('class="median"') == len(ops)
    assert html.count("<circle") >= 3 * len(ops)
    assert html.count('class="rank ok"') == 2  # both ranks' rows
    assert 'class="cell pass"' in html and 'class="matrix"' in html

    shot = tmp_path / "report.png"
    done = chromium(tmp_path, "--screenshot=%s" % shot, "--window-size=1100,1800", page.as_uri())
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    width, height, rows = png_pixels(shot)
    assert (width, height) == (1100, 1800)
    colours = {px for row in rows for px in row}
    median_blue, band_blue = (0x09, 0x69, 0xDA), (204, 231, 255)  # #54aeff at 30% on white
    assert median_blue in colours, "no median line in the screenshot"
    assert any(abs(r - band_blue[0]) < 12 and abs(g - band_blue[1]) < 12 and abs(b - band_blue[2]) < 12
               for r, g, b in colours), "no min-max band in the screenshot"
    assert (0xAC, 0xEE, 0xBB) in colours  # the preflight matrix's passed cells
