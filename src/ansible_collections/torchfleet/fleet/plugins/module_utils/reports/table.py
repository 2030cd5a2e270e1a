"""Plain-text tables for the end-of-play summaries, and the one rendering of a min / median /
max spread that the tables and the HTML report both show (the package loads this file by
path: it imports nothing of Ansible's)."""
from __future__ import annotations

import textwrap


def render(headers, rows, max_width=70):
    """Left-aligned columns; long cells wrap between words onto continuation lines.

    Words (paths, commands) are never split, so what the table says can be copied.
    """
    wrapped = []
    for row in rows:
        cells = [str(c) for c in row]
        chunks = [textwrap.wrap(c, max_width, break_long_words=False, break_on_hyphens=False)
                  or [""] for c in cells]
        height = max(len(ch) for ch in chunks)
        for line in range(height):
            wrapped.append([ch[line] if line < len(ch) else "" for ch in chunks])
    widths = [max([len(h)] + [len(r[i]) for r in wrapped]) for i, h in enumerate(headers)]
    fmt = "  ".join("%%-%ds" % w for w in widths)
    lines = [fmt % tuple(headers), fmt % tuple("-" * w for w in widths)]
    lines += [(fmt % tuple(r)).rstrip() for r in wrapped]
    return "\n".join(line.rstrip() for line in lines)


def spread(low, mid, high):
    """'min / median / max' of a measured figure (busbw in GB/s), as every report writes it;
    '-' when there is none."""
    if low is None:
        return "-"
    return "%.4g / %.4g / %.4g" % (low, mid, high)


def spread_of(figures):
    """spread() of {"min", "median", "max"} (a host's busbw row); '-' for none."""
    return spread(*(figures[k] for k in ("min", "median", "max"))) if figures else "-"
