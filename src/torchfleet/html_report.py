"""`torchfleet report RUN_DIR`: one self-contained HTML file (inline CSS and SVG, no script,
nothing fetched) with the preflight matrix, every rank's end and, for the collective test, a
busbw-versus-message-size chart per op with the min-max band across ranks."""
from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from html import escape
from typing import Any
from pathlib import Path

# The tables' rendering of a min / median / max spread, shared with the plays' summaries.
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports import table
from ansible_collections.torchfleet.fleet.plugins.module_utils.host.nccl_log import describe
from ansible_collections.torchfleet.fleet.plugins.module_utils.run import straggle
from ansible_collections.torchfleet.fleet.plugins.module_utils.run.runstate import (
    evidence, more_warnings)

from torchfleet.results import (BusbwRow, Collective, Failure, Goodput, GoodputBuckets,
                                Isolation, Pair, Result, load)


CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1b1f24; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
.ok { color: #1a7f37; } .bad { color: #cf222e; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; text-align: left; vertical-align: top; }
td.cell { width: 18px; text-align: center; }
table.matrix th span { writing-mode: vertical-rl; transform: rotate(180deg); white-space: nowrap; }
td.pass { background: #aceebb; } td.fail { background: #ff8182; } td.none { background: #eaeef2; }
td.warn { background: #fff1b8; } table.health td { padding: 2px 8px; } tr.gpu td { font-size: 90%; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; }
figure { margin: 0; } figcaption { font-weight: 600; }
svg text { font: 11px system-ui, sans-serif; fill: #57606a; }
table.heat td { width: 44px; height: 26px; text-align: center; font-size: 11px; }
table.heat td.pair.slow, table.heat th.slow-node { outline: 3px solid #cf222e; outline-offset: -3px; }
table.heat th.slow-node { color: #cf222e; }
.legend span { display: inline-block; margin-right: 12px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: -1px; }
"""

W, H, LEFT, RIGHT, TOP, BOTTOM = 460, 260, 56, 16, 14, 40


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return "%g %s" % (n / scale, unit)
    return "%d B" % n


def chart(op: str, rows: list[BusbwRow]) -> str:
    """Inline SVG: median busbw line, min-max band across ranks, one point per size whose
    tooltip names the slowest rank."""
    rows = sorted((r for r in rows if r.size_bytes > 0), key=lambda r: r.size_bytes)
    if not rows:
        return ""
    xs = [math.log2(r.size_bytes) for r in rows]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    top = max(r.busbw_max for r in rows) or 1.0
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        return TOP + ph - y / top * ph

    band = " ".join("%.1f,%.1f" % (px(x), py(r.busbw_max)) for x, r in zip(xs, rows, strict=True))
    band += " " + " ".join("%.1f,%.1f" % (px(x), py(r.busbw_min))
                           for x, r in reversed(list(zip(xs, rows, strict=True))))
    line = " ".join("%.1f,%.1f" % (px(x), py(r.busbw_median)) for x, r in zip(xs, rows, strict=True))
    parts = ['<svg class="busbw-chart" data-op="%s" width="%d" height="%d" viewBox="0 0 %d %d" '
             'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="busbw of %s">'
             % (escape(op), W, H, W, H, escape(op)),
             '<rect x="%d" y="%d" width="%d" height="%d" fill="#fff" stroke="#d0d7de"/>'
             % (LEFT, TOP, pw, ph)]
    for i in range(5):  # y grid and labels
        y = top * i / 4
        parts.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#eaeef2"/>'
                     '<text x="%d" y="%.1f" text-anchor="end">%.3g</text>'
                     % (LEFT, LEFT + pw, py(y), py(y), LEFT - 4, py(y) + 4, y))
    for x, r in zip(xs, rows, strict=True):
        parts.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>'
                     % (px(x), TOP + ph + 14, _size(r.size_bytes)))
    parts.append('<text x="%d" y="%d" text-anchor="middle">message size</text>'
                 % (LEFT + pw // 2, H - 6))
    parts.append('<text x="12" y="%d" transform="rotate(-90 12 %d)" text-anchor="middle">'
                 'busbw (GB/s)</text>' % (TOP + ph // 2, TOP + ph // 2))
    parts.append('<polygon class="band" points="%s" fill="#54aeff" fill-opacity="0.3" '
                 'stroke="none"/>' % band)
    parts.append('<polyline class="median" points="%s" fill="none" stroke="#0969da" '
                 'stroke-width="2"/>' % line)
    for x, r in zip(xs, rows, strict=True):
        spread = r.busbw_min < 0.8 * r.busbw_median
        parts.append('<circle class="point%s" cx="%.1f" cy="%.1f" r="3.5" fill="%s">'
                     '<title>%s: busbw %s GB/s (min/median/max); slowest %s '
                     '(rank %s)</title></circle>'
                     % (" slow" if spread else "", px(x), py(r.busbw_median),
                        "#cf222e" if spread else "#0969da", _size(r.size_bytes),
                        table.spread(r.busbw_min, r.busbw_median, r.busbw_max),
                        escape(str(r.slowest_host)), r.slowest_rank))
    parts.append("</svg>")
    return "".join(parts)


# Above this many rows of a kind, the rows that are fine fold into one row per outcome: at 512
# hosts a page lists the hosts to go and fix, not 500 green rows.
FOLD_ABOVE = 16


def _names(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(escape(n) for n in names[:limit])
    return shown + (" and %d more" % (len(names) - limit) if len(names) > limit else "")


def _matrix(result: Result) -> str:
    checks = result.checks
    ids = sorted({c.id for c in checks})
    hosts = list(dict.fromkeys(c.host for c in checks))
    by = {(c.host, c.id): c for c in checks}
    head = "".join('<th title="%s"><span>%s</span></th>' % (escape(i), escape(i)) for i in ids)
    def warned(host: str) -> tuple[str, ...]:
        return tuple(i for i in ids if (host, i) in by and not by[(host, i)].ok)

    # The controller's row and every host with a failed check, each on its own row; the others
    # (passed, or the same warnings) fold into one row per set of warnings.
    failing = [h for h in hosts if h == "controller" or any(
        not by[(h, i)].ok and by[(h, i)].severity == "error" for i in ids if (h, i) in by)]
    passing = [h for h in hosts if h not in failing]
    folded = len(passing) > FOLD_ABOVE
    groups: dict[tuple[str, ...], list[str]] = {}
    for host in passing:
        groups.setdefault(warned(host), []).append(host)
    rows = []
    for host in failing + ([] if folded else passing):
        cells = []
        for cid in ids:
            c = by.get((host, cid))
            if c is None:
                cells.append('<td class="cell none"></td>')
            else:
                cells.append('<td class="cell %s" title="%s">%s</td>' % (
                    "pass" if c.ok else "fail", escape(c.detail), "&#10003;" if c.ok else "&#10007;"))
        rows.append("<tr><th>%s</th>%s</tr>" % (escape(host), "".join(cells)))
    for warnings, members in sorted(groups.items(), key=lambda kv: len(kv[1])) if folded else ():
        rows.append('<tr class="folded"><th>%d host%s</th><td class="%s" colspan="%d">%s: %s'
                    '</td></tr>' % (len(members), "" if len(members) == 1 else "s",
                                    "fail" if warnings else "pass", len(ids),
                                    "warning: " + escape(", ".join(warnings)) if warnings
                                    else "every check passed", _names(members)))
    failures = "".join("<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>" % (
        escape(c.host), escape(c.id), escape(c.detail), escape(c.fix))
        for c in checks if not c.ok)
    out = '<table class="matrix"><tr><th>host</th>%s</tr>%s</table>' % (head, "".join(rows))
    if failures:
        out += ('<table class="failures"><tr><th>host</th><th>check</th><th>detail</th>'
                '<th>fix</th></tr>%s</table>' % failures)
    return out


def _heat(ratio: float) -> str:
    """White-to-green for a pair at or above the reference, to red at zero."""
    r = max(0.0, min(1.0, ratio))
    return "rgb(%d,%d,%d)" % (255 - int(83 * r), 130 + int(108 * r), 130 + int(57 * r))


# Above this many hosts the heat map is drawn (SVG, one square per measured pair) instead of a
# table cell per pair: 512 hosts would be 262,144 cells.
HEAT_TABLE_MAX = 32
HEAT_SVG_PX = 768


def _pair_title(iso: Isolation, p: Pair) -> str:
    return "%s &harr; %s: %s" % (escape(p.a), escape(p.b), escape(
        p.error or "busbw %.3g GB/s, latency %.0f us" % (p.busbw_gbs or 0.0, p.latency_us or 0.0)))


def heat_svg(iso: Isolation, order: list[str]) -> str:
    """The pair matrix as one SVG: a square per measured pair (both halves), coloured against
    the reference, slow pairs outlined; slow hosts' rows and columns marked in red."""
    n = len(order)
    cell = max(1.0, HEAT_SVG_PX / n)
    at = {h: i for i, h in enumerate(order)}
    size = cell * n
    parts = ['<svg class="heat-svg" width="%d" height="%d" viewBox="0 0 %.0f %.0f" '
             'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="pair busbw">'
             '<rect width="%.0f" height="%.0f" fill="#eaeef2"/>' % (size, size, size, size,
                                                                    size, size)]
    for h in iso.slow_nodes:
        if h in at:
            parts.append('<rect class="slow-node" x="0" y="%.1f" width="%.1f" height="%.1f" '
                         'fill="#cf222e" fill-opacity="0.25"><title>node.slow: %s</title></rect>'
                         '<rect x="%.1f" y="0" width="%.1f" height="%.1f" fill="#cf222e" '
                         'fill-opacity="0.25"/>' % (at[h] * cell, size, cell, escape(h),
                                                    at[h] * cell, cell, size))
    for p in iso.pairs:
        if p.a not in at or p.b not in at:
            continue
        ratio = (p.busbw_gbs or 0.0) / iso.reference_gbs if iso.reference_gbs else 0.0
        for x, y in ((at[p.a], at[p.b]), (at[p.b], at[p.a])):
            parts.append('<rect class="pair%s" x="%.1f" y="%.1f" width="%.1f" height="%.1f" '
                         'fill="%s"%s><title>%s</title></rect>' % (
                             " slow" if p.slow else "", x * cell, y * cell, cell, cell,
                             "#cf222e" if p.error else _heat(ratio),
                             ' stroke="#cf222e" stroke-width="%.1f"' % max(1.0, cell / 4)
                             if p.slow else "", _pair_title(iso, p)))
    parts.append("</svg>")
    return ('<p>%d hosts in inventory order along both axes (hover a square for the pair)</p>'
            % n + "".join(parts))


def heat_map(iso: Isolation, hosts: list[str]) -> str:
    """Host x host table of the pairs measured: busbw against the reference, slow pairs and
    slow hosts outlined in red; a pair not measured (ring schedule) is left grey. Above
    HEAT_TABLE_MAX hosts, the same as one SVG."""
    pairs: dict[tuple[str, str], Pair] = {}
    for measured in iso.pairs:
        pairs[(measured.a, measured.b)] = pairs[(measured.b, measured.a)] = measured
    order = hosts or sorted({h for p in iso.pairs for h in (p.a, p.b)})
    if len(order) > HEAT_TABLE_MAX:
        return _heat_caption(iso) + heat_svg(iso, order)
    head = "".join('<th class="%s">%s</th>' % ("slow-node" if h in iso.slow_nodes else "",
                                              escape(h)) for h in order)
    rows = []
    for a in order:
        cells = []
        for b in order:
            p = pairs.get((a, b))
            if p is None:
                cells.append('<td class="none"></td>')
                continue
            ratio = (p.busbw_gbs or 0.0) / iso.reference_gbs if iso.reference_gbs else 0.0
            cells.append('<td class="pair%s" data-a="%s" data-b="%s" style="background:%s" '
                         'title="%s">%s</td>' % (
                             " slow" if p.slow else "", escape(a), escape(b), _heat(ratio),
                             _pair_title(iso, p),
                             "&#10007;" if p.error else "%.2g" % (p.busbw_gbs or 0.0)))
        rows.append('<tr><th class="%s">%s</th>%s</tr>' % (
            "slow-node" if a in iso.slow_nodes else "", escape(a), "".join(cells)))
    return (_heat_caption(iso) + '<table class="heat"><tr><th></th>%s</tr>%s</table>'
            % (head, "".join(rows)))


def _heat_caption(iso: Isolation) -> str:
    named = []
    if iso.slow_nodes:
        named.append("node.slow: " + escape(", ".join(iso.slow_nodes)))
    if iso.slow_links:
        named.append("link.slow: " + ", ".join("%s &harr; %s" % (escape(a), escape(b))
                                               for a, b in iso.slow_links))
    verdict = "; ".join(named) or "no slow host or link"
    return ('<p>%s schedule, %d rounds, %.1f s; cell: pair busbw in GB/s, colour against the '
            'reference %s GB/s (the median of each host&rsquo;s best pair); outlined: slow '
            '(below %.2g &times; reference). <span class="%s">%s</span></p>' % (
                escape(iso.schedule), iso.rounds, iso.time_s,
                "-" if iso.reference_gbs is None else "%.3g" % iso.reference_gbs, iso.threshold,
                "bad" if iso.slow_nodes or iso.slow_links else "ok", verdict))


def fleet_history(run_dir: str | Path) -> dict[str, dict[str, Any]]:
    """preflight.json's `fleet`: what the fleet's ledger held of each candidate at preflight
    ({host: {score, history, quarantined_until}}, only hosts with a history); {} without."""
    try:
        data = json.loads((Path(run_dir) / "preflight.json").read_text())
    except (OSError, ValueError):
        return {}
    fleet = data.get("fleet") if isinstance(data, dict) else None
    return {str(h): v for h, v in fleet.items() if isinstance(v, dict)} \
        if isinstance(fleet, dict) else {}


def _history(entry: dict[str, Any] | None) -> str:
    """A host's history cell: its incidents, and its quarantine."""
    if not entry:
        return ""
    text = str(entry.get("history") or "")
    if entry.get("quarantined_until"):
        text += "%squarantined until %s" % ("; " if text else "", entry["quarantined_until"])
    return text


def _fleet(fleet: dict[str, dict[str, Any]]) -> str:
    """The preflight's hosts with a history in the fleet's ledger, worst first."""
    rows = "".join('<tr><td>%s</td><td class="%s">%s</td><td>%s</td></tr>' % (
        escape(h), "bad" if e.get("quarantined_until") else "warn", escape(_history(e)),
        escape(str(e.get("score", "")))) for h, e in sorted(
            fleet.items(), key=lambda he: -float(he[1].get("score") or 0)))
    return '<table class="fleet"><tr><th>host</th><th>history (the fleet&rsquo;s ledger, at ' \
        'preflight)</th><th>score</th></tr>%s</table>' % rows


def _ranks(result: Result) -> str:
    bad = [r for r in result.ranks if not r.ok]
    good = [r for r in result.ranks if r.ok]
    listed = bad + ([] if len(good) > FOLD_ABOVE else good)
    rows = "".join(
        '<tr class="rank %s"><td>%s</td><td>%s</td><td>%s</td><td class="%s">%s</td><td>%s</td></tr>'
        % ("ok" if r.ok else "bad", "-" if r.rank is None else r.rank, escape(r.host),
           r.local_rank, "ok" if r.ok else "bad", escape(r.state),
           "-" if r.exit_code is None else r.exit_code) for r in listed)
    if len(listed) < len(result.ranks):
        for state in dict.fromkeys(r.state for r in good):
            these = [r for r in good if r.state == state]
            rows += ('<tr class="rank ok folded"><td colspan="3">%d ranks</td><td class="ok">%s'
                     '</td><td>0</td></tr>' % (len(these), escape(state)))
    nccl = any(h.transport for h in result.hosts)  # NCCL's INFO lines were read
    # The fleet's ledger's history of each host, as preflight read it (a column only when some
    # host has one); a host with one is listed, never folded.
    fleet = fleet_history(result.run_dir)
    worst = [h for h in result.hosts if h.outcome != "succeeded" or h.host in fleet]
    fine = [h for h in result.hosts if h.outcome == "succeeded" and h.host not in fleet]
    shown = worst + ([] if len(fine) > FOLD_ABOVE else fine)
    hosts = "".join("<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td>%s%s</tr>" % (
        escape(h.host), escape(str(h.outcome)), "-" if h.rc is None else h.rc,
        "-" if h.duration_s is None else "%.1f s" % h.duration_s, table.spread_of(h.busbw_gbs),
        "<td>%s</td>" % escape(describe(h.transport)) if nccl else "",
        "<td>%s</td>" % escape(_history(fleet.get(h.host))) if fleet else "")
        for h in shown)
    if len(shown) < len(result.hosts):  # one row for the hosts that succeeded
        durations = [h.duration_s for h in fine if h.duration_s is not None]
        hosts += ('<tr class="folded"><td>%d hosts: %s</td><td>succeeded</td><td>0</td>'
                  '<td>%s</td><td colspan="%d"></td></tr>' % (
                      len(fine), _names([h.host for h in fine], 3),
                      "%.1f&ndash;%.1f s" % (min(durations), max(durations)) if durations
                      else "-", 1 + bool(nccl) + bool(fleet)))
    return ('<table class="hosts"><tr><th>host</th><th>outcome</th><th>exit</th>'
            '<th>duration</th><th>busbw GB/s min / median / max (its ranks, all_reduce at the '
            'largest size)</th>%s%s</tr>%s</table>'
            '<table class="ranks"><tr><th>rank</th><th>host</th><th>local rank</th><th>state</th>'
            '<th>exit code</th></tr>%s</table>' % (
                "<th>NCCL transport</th>" if nccl else "",
                "<th>history (the fleet&rsquo;s ledger)</th>" if fleet else "", hosts, rows))


def _attempts(result: Result) -> str:
    """Every attempt of a run with max_restarts, as train.json records it."""
    rows = "".join(
        '<tr><td>%d</td><td>%s</td><td class="%s">%s</td><td>%s</td><td>%s</td></tr>' % (
            a.attempt, escape(_names(a.hosts)), "ok" if a.ok else "bad", escape(a.phase),
            escape(a.first_failure or "-"), escape(a.restart or a.not_restarted or "-"))
        for a in result.attempts)
    return ('<table class="attempts"><tr><th>attempt</th><th>hosts</th><th>phase</th>'
            '<th>first failure</th><th>then</th></tr>%s</table>' % rows)


# Goodput's buckets in the order an attempt goes through them, with their colours.
BUCKET_COLOURS = (("preflight", "#8c959f"), ("launch", "#54aeff"), ("init", "#b6e3ff"),
                  ("kept_training", "#2da44e"), ("checkpoint_stall", "#d4a72c"),
                  ("lost_work", "#cf222e"), ("detection", "#fb8f44"), ("teardown", "#d0d7de"),
                  ("restart", "#8250df"))


def _duration(seconds: float) -> str:
    return "%.1f s" % seconds if seconds < 600 else "%.1f min" % (seconds / 60)


def goodput_bars(g: Goodput) -> str:
    """Inline SVG: one bar per attempt on the run's time axis (each starts where the one before
    ended), its buckets in the order the attempt went through them, coloured as the legend."""
    total = g.wall_s or sum(v or 0.0 for v in vars(g.buckets).values()) or 1.0
    label, width, row = 90, 620, 26
    rows: list[str] = []
    at = 0.0
    for a in g.attempts:
        x = at
        parts = []
        for name, colour in BUCKET_COLOURS:
            value = getattr(a.buckets, name) or 0.0
            if value <= 0:
                continue
            parts.append('<rect class="bucket" data-bucket="%s" x="%.1f" y="%d" width="%.1f" '
                         'height="18" fill="%s"><title>attempt %d: %s %s</title></rect>' % (
                             name, label + x / total * width, 4 + len(rows) * row,
                             max(value / total * width, 0.5), colour, a.attempt,
                             name.replace("_", " "), _duration(value)))
            x += value
        rows.append('<text x="0" y="%d">attempt %d</text>%s' % (
            17 + len(rows) * row, a.attempt, "".join(parts)))
        at = x
    axis = '<text x="%d" y="%d">0</text><text x="%d" y="%d" text-anchor="end">%s</text>' % (
        label, len(rows) * row + 18, label + width, len(rows) * row + 18, _duration(total))
    return ('<svg class="goodput-bars" width="%d" height="%d" xmlns="http://www.w3.org/2000/svg" '
            'role="img" aria-label="goodput timeline">%s%s</svg>' % (
                label + width + 10, len(rows) * row + 24, "".join(rows), axis))


def _goodput(g: Goodput) -> str:
    """The run's goodput: its line, a bar per attempt with the legend, the buckets' table,
    what is unknown, each failure's cost and the checkpoint advice."""
    legend = '<p class="legend">%s</p>' % "".join(
        '<span><i style="background:%s"></i>%s</span>' % (colour, name.replace("_", " "))
        for name, colour in BUCKET_COLOURS)
    wall = g.wall_s or 1.0
    cells = "".join('<tr><td>%s</td><td>%s</td><td>%s</td></tr>' % (
        name.replace("_", " "), "unknown" if getattr(g.buckets, name) is None
        else _duration(getattr(g.buckets, name)), "-" if getattr(g.buckets, name) is None
        else "%.1f %%" % (100.0 * getattr(g.buckets, name) / wall))
        for name in GoodputBuckets.__dataclass_fields__)
    out = ['<p class="goodput-line">%s</p>' % escape(g.line), legend, goodput_bars(g),
           '<table class="goodput"><tr><th>bucket</th><th>time</th><th>share</th></tr>%s'
           '</table>' % cells]
    out += ['<p class="unknown">%s</p>' % escape(u) for u in g.unknown]
    if g.failures:
        out.append('<table class="failures"><tr><th>attempt</th><th>check</th><th>host</th>'
                   '<th>cost</th></tr>%s</table>' % "".join(
                       "<tr><td>%d</td><td>%s</td><td>%s</td><td>%s</td></tr>" % (
                           f.attempt, escape(f.check), escape(f.host), _duration(f.cost_s))
                       for f in g.failures))
    if g.advice:
        out.append('<p class="advice">%s</p>' % escape(g.advice))
    return "".join(out)


HEALTH = ("gpu.", "cpu.perf", "host.memlock", "host.disk", "host.clock")


def _health(result: Result) -> str:
    """A row per host with its node health verdict, and a row per GPU (or host fact) that
    failed or warned, with the detail and the fix."""
    checks = [c for c in result.checks if c.id.startswith(HEALTH) and c.id != "gpu.count"]
    rows = []
    for host in dict.fromkeys(c.host for c in checks):
        mine = [c for c in checks if c.host == host]
        errors = sorted({c.id for c in mine if not c.ok and c.severity == "error"})
        warnings = sorted({c.id for c in mine if not c.ok and c.severity != "error"})
        verdict = ("FAIL: " + ", ".join(errors) if errors else
                   "warning: " + ", ".join(warnings) if warnings else
                   "healthy (%d checks)" % len(mine))
        rows.append('<tr><th>%s</th><td class="%s" colspan="3">%s</td></tr>' % (
            escape(host), "fail" if errors else "warn" if warnings else "pass", escape(verdict)))
        for c in mine:
            if not c.ok:
                rows.append('<tr class="gpu"><td></td><td>%s%s</td><td>%s</td><td>%s</td></tr>' % (
                    escape(c.id), " &middot; GPU %d" % c.gpu if c.gpu is not None else "",
                    escape(c.detail), escape(c.fix)))
    return '<table class="health">%s</table>' % "".join(rows) if rows else ""


def _collective(found: Collective | None) -> str:
    """The ranks the Flight Recorder names at the collective where the ranks diverge."""
    if found is None:
        return ""
    if found.seq is None or not (found.missing or found.mismatch):
        return '<p class="note">collectives: %s</p>' % escape(found.others or found.note or
                                                              "nobody named")
    rows = ["<tr><th>host</th><th>rank</th><th>at collective #%d (%s, group %s)</th></tr>" % (
        found.seq, escape(found.op or "op unknown"), escape(found.group or "-"))]
    rows += ['<tr class="bad"><td>%s</td><td>%d</td><td>never joined</td></tr>' % (
        escape(m.host), m.rank) for m in found.missing]
    rows += ['<tr class="bad"><td>%s</td><td>%d</td><td>called %s</td></tr>' % (
        escape(m.host), m.rank, escape(m.op)) for m in found.mismatch]
    return '<table class="collective">%s</table>' % "".join(rows)


def _first_failure(failure: Failure) -> str:
    """The first failure: under a hardware or OOM cause the event's own line, the device and
    the rank it hit (the record's evidence; the abort's tracebacks and where the other ranks
    were are its consequences), else where the ranks diverged and the failing rank's log."""
    if failure.event is None:
        return _collective(failure.collective) + '<pre>%s</pre>' % escape(failure.tail)
    rows = "".join('<tr><th>%s</th><td>%s</td></tr>' % (escape(label), escape(words))
                   for label, words in evidence(failure.event, failure.rank,
                                                failure.event.get("died")))
    found = failure.collective  # (a hang's finding that names ranks is kept, as the record's)
    return '<p class="bad">%s</p><table class="event">%s</table>%s' % (
        escape(failure.reason), rows,
        _collective(found) if found is not None and (found.missing or found.mismatch) else "")


def _hardware(result: Result) -> str:
    """The hosts to drain with their evidence, then every event the hosts reported and how
    many more warnings there were than the record holds."""
    rows = ['<tr class="bad"><td>%s</td><td>drain (%s)</td><td>%s</td></tr>' % (
        escape(d.get("host", "")), escape(d.get("reason", "")), escape(d.get("evidence", "")))
        for d in result.drain]
    rows += ['<tr class="%s"><td>%s</td><td>%s%s</td><td>%s</td></tr>' % (
        "bad" if e.get("fatal") else "warn", escape(str(e.get("host", ""))),
        "fatal " if e.get("fatal") else "warning ", escape(str(e.get("kind", ""))),
        escape(str(e.get("what") or e.get("line") or "") + (
            " (%d times)" % e["count"] if isinstance(e.get("count"), int)
            and e["count"] > 1 else ""))) for e in result.hardware]
    more = result.hardware_dropped
    rows += ['<tr class="warn"><td>%s</td><td colspan="2">%s</td></tr>' % (
        escape(str(host)), escape(more_warnings(n))) for host, n in sorted(
        (more if isinstance(more, dict) else {}).items())
        if isinstance(n, int) and not isinstance(n, bool) and n > 0]
    return '<table class="hardware"><tr><th>host</th><th>what</th><th>evidence</th></tr>%s' \
        '</table>' % "".join(rows)


def _actions(result: Result) -> str:
    """The audit: what torchfleet did on its own, or would have (done false: actions=observe,
    the circuit breaker, or a refusal such as Slurm's)."""
    rows = "".join(
        '<tr class="%s"><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>'
        % ("ok" if a.get("done") is True else "warn", escape(str(a.get("action") or "")),
           escape(str(a.get("host") or "the run")), escape(str(a.get("check") or "")),
           escape(str(a.get("at") or "")), escape(str(a.get("why") or "")),
           "done" if a.get("done") is True else "would have")
        for a in result.actions)
    return ('<table class="actions"><tr><th>action</th><th>host</th><th>check</th><th>at</th>'
            '<th>why</th><th>done</th></tr>%s</table>' % rows)


def _seconds(iso: Any) -> float | None:
    try:
        return datetime.strptime(str(iso), "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def _stragglers(result: Result) -> str:
    """A timeline of the run: one bar per straggler, from when the master first named it to
    when it last did."""
    if result.straggle.get("watched") is False:
        return "<p>Stragglers were %s.</p>" % escape(str(result.straggle.get("why") or
                                                        "not watched"))
    if not result.stragglers:
        return ""
    start, end = _seconds(result.straggle.get("started")), _seconds(result.straggle.get("ended"))
    width, row = 600.0, 22
    rows = []
    for i, s in enumerate(result.stragglers[:16]):
        first, last = _seconds(s.get("first_seen")), _seconds(s.get("last_seen"))
        ranks = s.get("ranks") or [0]
        label = "%s (%s)" % (s.get("host", ""), "rank %s" % ranks[0] if len(ranks) == 1
                             else "ranks %s-%s" % (ranks[0], ranks[-1]))
        title = "%s, %s to %s" % (straggle.words(dict(
            s, host=s.get("host", ""), ranks=ranks, share_last=float(s.get("share_last") or 0),
            late_ms_median=float(s.get("late_ms_median") or 0))), s.get("first_seen"),
            s.get("last_seen"))
        bar = ""
        if start is not None and end is not None and first is not None and last is not None \
                and end > start:
            x0 = width * max(0.0, (first - start) / (end - start))
            x1 = width * min(1.0, (last - start) / (end - start))
            bar = '<rect x="%.1f" y="%d" width="%.1f" height="14" fill="#c0392b"><title>%s' \
                  '</title></rect>' % (200 + x0, i * row + 4, max(2.0, x1 - x0), escape(title))
        rows.append('<text x="0" y="%d" font-size="12">%s</text>%s' % (
            i * row + 15, escape(label), bar))
    axis = '<line x1="200" x2="%d" y1="%d" y2="%d" stroke="#888"/>' % (
        200 + width, len(rows) * row + 4, len(rows) * row + 4)
    svg = '<svg class="timeline" width="%d" height="%d">%s%s</svg>' % (
        220 + width, len(rows) * row + 24, "".join(rows), axis)
    return "<p>Bars: from the run's start (left) to its end (right), when the master named " \
        "each straggler.</p>" + svg + "<ul>%s</ul>" % "".join(
            "<li>%s</li>" % escape(c.detail) for c in result.checks if c.id == "run.straggler")


def render(result: Result) -> str:
    pre = result if result.kind == "preflight" else result.preflight
    body = ['<h1>torchfleet %s <span class="%s">%s</span></h1>' % (
        escape(result.kind), "ok" if result.ok else "bad", "ok" if result.ok else "FAILED"),
        "<p>run %s &middot; %s</p>" % (escape(result.run_id), escape(str(result.run_dir)))]
    body.append('<p class="%s verdict">%s</p>' % ("ok" if result.ok else "bad",
                                                   escape(result.verdict)))
    if result.first_failure:
        body.append('<h2>First failure</h2>' + _first_failure(result.first_failure))
    if result.drain or result.hardware or result.hardware_dropped:
        body.append("<h2>Hardware during the run</h2>" + _hardware(result))
    if result.actions:
        body.append("<h2>Actions</h2>" + _actions(result))
    if result.kind == "train" and _stragglers(result):
        body.append("<h2>Stragglers</h2>" + _stragglers(result))
    if result.goodput:
        body.append("<h2>Goodput</h2>" + _goodput(result.goodput))
    if result.attempts:
        body.append("<h2>Attempts</h2>" + _attempts(result))
    if pre is not None:
        body.append("<h2>Preflight</h2>" + _matrix(pre))
        fleet = fleet_history(pre.run_dir)
        if fleet and result.kind == "preflight":  # a run's host table has it as a column
            body.append("<h2>Host history</h2>" + _fleet(fleet))
        if _health(pre):
            body.append("<h2>Node health</h2>" + _health(pre))
    if result.kind in ("train", "collective"):
        body.append("<h2>Ranks</h2>" + _ranks(result))
        body.append('<h2>Run checks</h2>' + _matrix(result))
    if result.busbw:
        charts = "".join("<figure><figcaption>%s</figcaption>%s</figure>" % (escape(op), chart(op, rows))
                         for op, rows in result.busbw_by_op().items() if chart(op, rows))
        body.append('<h2>Bus bandwidth by message size</h2><p>line: median across ranks; '
                    'band: min&ndash;max across ranks; red points: a rank below 80%% of the '
                    'median (hover for the slowest host)</p><div class="charts">%s</div>' % charts)
    if result.isolation:
        body.append("<h2>Pair rounds: slow hosts and links</h2>"
                    + heat_map(result.isolation, [h.host for h in result.hosts]))
    return ('<!doctype html><html lang="en"><head><meta charset="utf-8"><title>torchfleet %s %s'
            '</title><style>%s</style></head><body>%s</body></html>'
            % (escape(result.kind), escape(result.run_id), CSS, "\n".join(body)))


def write(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Write the report of the run in run_dir; returns its path (RUN_DIR/report.html)."""
    run_dir = Path(run_dir)
    result = load(run_dir)
    if result is None:
        raise ValueError("%s holds no preflight.json, train.json or collective.json; pass the "
                         "directory of a torchfleet run" % run_dir)
    path = Path(output) if output else run_dir / "report.html"
    path.write_text(render(result))
    return path
