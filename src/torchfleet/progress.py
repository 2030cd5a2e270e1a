"""A line per host that updates in place on a terminal, fed by torchfleet events."""
from __future__ import annotations

import sys
from typing import TextIO

from torchfleet.runner import Event


class HostLines:
    """Redraws one status line per host (ANSI cursor moves); on a non-terminal, prints
    nothing until the end."""

    def __init__(self, stream: TextIO = sys.stderr):
        self.stream = stream
        self.tty = stream.isatty()
        self.lines: dict[str, str] = {}
        self.failed: dict[str, list[str]] = {}
        self._drawn = 0

    def __call__(self, event: Event) -> None:
        host = event.host
        if not host or host == "localhost":
            return
        if event.kind == "task":
            if event.status in ("failed", "unreachable"):
                self.lines[host] = "%s: %s" % (event.status, event.task)
            elif event.status == "ok" and host not in self.failed:
                self.lines[host] = "%s" % event.task
        elif event.kind == "check":
            if not event.check.ok and event.check.severity == "error":
                self.failed.setdefault(host, []).append(event.check.id)
            bad = self.failed.get(host)
            self.lines[host] = ("FAILED " + ", ".join(bad)) if bad else "checks passed"
        elif event.kind == "rank":
            alive = sum(1 for r in event.ranks if r.get("alive"))
            last = next((r.get("last_line") for r in event.ranks if r.get("last_line")), "")
            state = event.outcome or event.status
            self.lines[host] = "%-9s %6.1f s  ranks alive %d  %s" % (
                state, event.elapsed_s or 0.0, alive, (last or "")[-60:])
        else:
            return
        self.draw()

    def draw(self) -> None:
        if not self.tty:
            return
        out = []
        if self._drawn:
            out.append("\x1b[%dA" % self._drawn)
        width = max((len(h) for h in self.lines), default=0)
        for host, text in self.lines.items():
            out.append("\x1b[2K  %-*s  %s\n" % (width, host, text[:110]))
        self.stream.write("".join(out))
        self.stream.flush()
        self._drawn = len(self.lines)
