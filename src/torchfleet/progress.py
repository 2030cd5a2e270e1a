"""A line per host (and one for the run once it is launched) that updates in place on a
terminal, fed by torchfleet events."""
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
        if event.kind == "run":
            s = event.summary
            self.lines["run"] = "%-9s %6.1f s  ranks alive %s of %s  hosts running %s of %s  %s" % (
                event.status, event.elapsed_s or 0.0, s.get("ranks_alive"), s.get("nranks"),
                s.get("hosts_running"), s.get("nnodes"), (s.get("last_line") or "")[-50:])
            self.draw()
            return
        if not host or host == "localhost":
            return
        if event.kind == "task":
            if event.status in ("failed", "unreachable"):
                self.lines[host] = "%s: %s" % (event.status, event.task)
            elif event.status == "ok" and host not in self.failed:
                self.lines[host] = "%s" % event.task
        elif event.kind == "check" and event.check is not None:
            if not event.check.ok and event.check.severity == "error":
                self.failed.setdefault(host, []).append(event.check.id)
            bad = self.failed.get(host)
            self.lines[host] = ("FAILED " + ", ".join(bad)) if bad else "checks passed"
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
