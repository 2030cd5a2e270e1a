"""Plain-text tables for the end-of-play summaries."""
from __future__ import annotations


def render(headers, rows, max_width=70):
    """Left-aligned columns; cells longer than max_width wrap onto continuation lines."""
    wrapped = []
    for row in rows:
        cells = [str(c) for c in row]
        chunks = [[c[i:i + max_width] for i in range(0, len(c), max_width)] or [""] for c in cells]
        height = max(len(ch) for ch in chunks)
        for line in range(height):
            wrapped.append([ch[line] if line < len(ch) else "" for ch in chunks])
    widths = [max([len(h)] + [len(r[i]) for r in wrapped]) for i, h in enumerate(headers)]
    fmt = "  ".join("%%-%ds" % w for w in widths)
    lines = [fmt % tuple(headers), fmt % tuple("-" * w for w in widths)]
    lines += [(fmt % tuple(r)).rstrip() for r in wrapped]
    return "\n".join(line.rstrip() for line in lines)
