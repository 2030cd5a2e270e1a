"""The CLI's progress: one live line per phase and the failing hosts under them, fed by
torchfleet events.

On a terminal rich redraws the whole block in place; the block never grows past the terminal's
height (the failing hosts are cut to what fits, "… and N more"), because a block taller than the
screen cannot be redrawn in place and every redraw would land in the scrollback. Off a terminal
(a log, CI) it prints one summary line every `every_s` seconds instead.
"""
from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from ansible_collections.torchfleet.fleet.plugins.module_utils.run.runstate import more_warnings
from torchfleet.runner import Event

# The phase each host task belongs to, by its module; other tasks change no phase's counts.
PHASE_OF_ACTION = {"node_probe": "preflight", "torchrun_job": "launch",
                   "rank_results": "gather"}
PHASES = ("preflight", "launch", "run", "gather")
VERBS = {"preflight": "checked", "launch": "started", "gather": "gathered"}


@dataclass
class Phase:
    name: str
    started: float
    hosts: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    run: dict = field(default_factory=dict)  # the run's latest summary (phase "run")
    status: str = ""
    ended: float | None = None  # when the next phase began

    def line(self, total: int, now: float) -> str:
        elapsed = "%5.1f s" % (self.run.get("elapsed_s") or 0.0 if self.name == "run"
                               else (self.ended or now) - self.started)
        if self.name == "run":
            s, slow = self.run, self.run.get("slowest") or {}
            text = "ranks alive %s of %s" % (s.get("ranks_alive", "?"), s.get("nranks", "?"))
            if slow.get("host") and slow.get("idle_s") is not None:
                text += " · quietest %s (no log line for %.0f s)" % (slow["host"], slow["idle_s"])
            warned, more = s.get("warnings") or [], s.get("warnings_dropped") or 0
            if warned:  # hardware warnings (never a failure), and those not kept
                text += " · warnings on %s%s%s" % (
                    ", ".join(warned[:3]), " +%d hosts" % (len(warned) - 3)
                    if len(warned) > 3 else "", " (%s)" % more_warnings(more) if more else "")
            elif more:
                text += " · %d hardware warning%s" % (more, "" if more == 1 else "s")
            failure = s.get("failure") or {}
            if failure.get("host"):
                text += " · first failure: %s %s" % (failure["host"], failure.get("reason"))
            return "%-9s %s  %-9s %s" % (self.name, elapsed, self.status, text)
        text = "%d of %s hosts %s" % (len(self.hosts), total or "?", VERBS[self.name])
        if self.failed:
            text += " · %d failing" % len(self.failed)
        return "%-9s %s  %s" % (self.name, elapsed, text)


class Progress:
    """Use as a context manager around an API call; pass the instance as its on_event."""

    def __init__(self, stream: TextIO = sys.stderr, *, every_s: float = 10.0,
                 height: int | None = None):
        self.stream, self.every_s = stream, every_s
        self.tty = stream.isatty()
        self.console = Console(file=stream, force_terminal=self.tty or None, height=height,
                               highlight=False)
        self.total = 0
        self.phases: dict[str, Phase] = {}
        self.failing: dict[str, list[str]] = {}  # host -> what failed there, in order
        self.restart = ""  # "attempt N: why" of the latest restart
        self.goodput = ""  # the run's goodput so far in one line (the watch's, once a minute)
        self._lock = threading.Lock()
        self._live: Live | None = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # -- events -----------------------------------------------------------------------------

    def __call__(self, event: Event) -> None:
        with self._lock:
            self._take(event)
        if self._live is not None:
            self._live.refresh()

    def _phase(self, name: str) -> Phase:
        if name not in self.phases:
            now = time.monotonic()
            for phase in self.phases.values():
                phase.ended = phase.ended or now
            self.phases[name] = Phase(name, now)
        return self.phases[name]

    def _fail(self, host: str, what: str) -> None:
        seen = self.failing.setdefault(host, [])
        if what not in seen:
            seen.append(what)

    def _take(self, event: Event) -> None:
        if event.kind == "attempt":
            # A restart (decided after its re-check): from here the block counts the new
            # attempt only (its launch, run and gather), under one line that says why.
            self.restart = "attempt %s: %s" % (event.summary.get("attempt"),
                                               event.summary.get("why") or "restarted")
            self.phases, self.failing = {}, {}
        elif event.kind == "plan":
            self.total = int(event.summary.get("candidates") or 0)
        elif event.kind == "run":
            phase = self._phase("run")
            phase.run, phase.status = event.summary, event.status or ""
            self.goodput = str(event.summary.get("goodput") or "") or self.goodput
            failure = event.summary.get("failure") or {}
            if failure.get("host"):
                self._fail(failure["host"], failure.get("reason") or "failed")
        elif event.kind == "check" and event.check is not None:
            c = event.check
            if not c.ok and c.severity == "error":
                self._fail(c.host, c.id)
                if "preflight" in self.phases:
                    self.phases["preflight"].failed.add(c.host)
        elif event.kind == "task" and event.host and event.host != "localhost":
            name = PHASE_OF_ACTION.get(event.action or "")
            if event.status == "unreachable":
                self._fail(event.host, "unreachable")
            elif event.status == "failed":
                self._fail(event.host, "failed: %s" % event.task)
            if name is None:
                return
            phase = self._phase(name)
            phase.hosts.add(event.host)
            if event.status in ("failed", "unreachable"):
                phase.failed.add(event.host)

    # -- drawing ----------------------------------------------------------------------------

    def _snapshot(self) -> tuple[list[str], list[tuple[str, list[str]]]]:
        """(one line per phase begun, the failing hosts with what failed), taken together."""
        with self._lock:
            now = time.monotonic()
            head = ["restart   %s" % self.restart] if self.restart else []
            tail = [self.goodput] if self.goodput else []  # "goodput 91 % so far; ..."
            return (head + [self.phases[p].line(self.total, now) for p in PHASES
                            if p in self.phases] + tail,
                    [(host, list(what)) for host, what in self.failing.items()])

    def lines(self, height: int | None = None) -> list[str]:
        """The block as plain lines: the phases, then the failing hosts cut to `height`."""
        out, failing = self._snapshot()
        room = len(failing) if height is None else max(height - len(out) - 1, 0)
        if len(failing) > room:
            shown, more = failing[:max(room - 1, 0)], len(failing) - max(room - 1, 0)
        else:
            shown, more = failing, 0
        out += ["  %s  %s" % (host, ", ".join(what)) for host, what in shown]
        if more and room:
            out.append("  … and %d more failing host(s)" % more)
        return out

    def render(self) -> Group:
        rows = self.lines(self.console.size.height)
        return Group(*(Text(r, no_wrap=True, overflow="ellipsis") for r in rows))

    def summary_line(self) -> str:
        parts, failures = self._snapshot()
        failing = sorted(host for host, _ in failures)
        text = " | ".join(" ".join(p.split()) for p in parts) or "starting"
        if failing:
            text += " | failing: %s" % ", ".join(failing[:10])
            if len(failing) > 10:
                text += " and %d more" % (len(failing) - 10)
        return "torchfleet: " + text

    # -- life -------------------------------------------------------------------------------

    def __enter__(self) -> "Progress":
        if self.tty:
            self._live = Live(console=self.console, get_renderable=self.render,
                              refresh_per_second=4, redirect_stdout=False,
                              redirect_stderr=False)
            self._live.start()
        else:
            self._ticker = threading.Thread(target=self._tick, name="torchfleet-progress",
                                            daemon=True)
            self._ticker.start()
        return self

    def _tick(self) -> None:
        while not self._stop.wait(self.every_s):
            if self.phases:
                print(self.summary_line(), file=self.stream, flush=True)

    def __exit__(self, *exc) -> None:
        with self._lock:
            for phase in self.phases.values():
                phase.ended = phase.ended or time.monotonic()
        self._stop.set()
        if self._live is not None:
            self._live.stop()  # leaves the last frame on the screen
            self._live = None
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
