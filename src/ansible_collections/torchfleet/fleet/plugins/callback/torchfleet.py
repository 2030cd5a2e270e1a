# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
name: torchfleet
type: stdout
short_description: What a run says on purpose, every failure in full, the tasks in the run's log
description:
  - Ansible's default output prints a line per host per task, thousands of lines for a preflight
    of a hundred hosts before the table that matters. This callback prints what a task prints on
    purpose (debug messages such as torchfleet's summary tables, the message alone) and the
    watch's progress, and every failure or unreachable host in full, with the same text as the
    default callback, under its play's and task's banners.
  - Every task's line - how many hosts were ok, changed, skipped, failed and unreachable - goes
    to the run's log, C(play.log) in the run's directory (its path is printed at the end); with
    C(-v) they are printed too. The recap lists the hosts that failed or were unreachable and
    counts the rest.
  - While preflight's probes pull C(container_image), a line every 30 s (C(CONTAINER_PULL_SAY_S)
    in the collection's C(plugins/module_utils/defaults.py)) says how many hosts' probes
    returned (how many pulled), which it still waits on and how many wait for a fork.
  - C(ANSIBLE_STDOUT_CALLBACK=default) gives Ansible's own output back.
version_added: "0.1.0"
author: torchfleet developers (@torchfleet)
extends_documentation_fragment:
  - default_callback
  - result_format_callback
"""

import os
import threading
import time

from ansible import context
from ansible.plugins.callback.default import CallbackModule as Default

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults

COUNTS = ("ok", "changed", "skipped", "failed", "unreachable", "ignored")
# The run's log of every task's line, in its run directory (the one its report is in).
PLAY_LOG = "play.log"
PLAY_LOG_LINES = 200000  # a bound: a play of 512 hosts has a few hundred tasks
# Tasks whose output is their purpose: shown in full, as the default callback shows it.
SHOWN = frozenset(("debug", "ansible.builtin.debug", "ansible.legacy.debug"))
META = frozenset(("meta", "ansible.builtin.meta", "ansible.legacy.meta"))
# preflight's probe.yml announces a pull in the probe's run-wide arguments (a fact set once):
# preflight_probe_run.pull = {image, hosts, timeout_s, every_s}, or none without container_image.
# The next task on the hosts (not a debug) is the probe that pulls.
PULL_FACT = ("preflight_probe_run", "pull")
PULL_NAMES = 3  # the hosts a pull line names; the rest are counted ("+509 more")
PULL_NAME_CHARS = 64  # and each name cut to this, the image to PULL_IMAGE_CHARS: a bounded line
PULL_IMAGE_CHARS = 256


def _cut(text, chars):
    text = str(text)
    return text if len(text) <= chars else text[:chars - 3] + "..."


class PullProgress:
    """The probes' pull, while their task runs: which hosts' probes started (a fork took them),
    which returned (and pulled), and a line every `every_s` from a thread of its own that
    stop() ends: no line comes after stop() returns, and nothing it does raises into Ansible."""

    def __init__(self, announced, say, forks=None, clock=time.monotonic):
        self.image = _cut(announced.get("image") or "", PULL_IMAGE_CHARS)
        self.total = int(announced.get("hosts") or 0)
        self.timeout_s = float(announced.get("timeout_s") or defaults.CONTAINER_PULL_TIMEOUT_S)
        # (never a busy loop, whatever the fact says)
        self.every_s = max(float(announced.get("every_s") or defaults.CONTAINER_PULL_SAY_S), 0.01)
        self.forks = forks
        self._say, self._clock = say, clock
        self._began = clock()
        self._out = {}  # host -> None: started and not returned, in the order they started
        self.done = self.pulled = self.failed = 0
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = None

    def start(self):
        try:
            self._thread = threading.Thread(target=self._tick, name="torchfleet-pull",
                                            daemon=True)
            self._thread.start()
        except RuntimeError:  # no thread to be had: the pull goes on without its line
            self._thread = None

    def stop(self):
        with self._lock:  # a line being said ends first; none begins after this
            self._stopped.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(1.0)

    def started(self, host):
        with self._lock:
            self._out[host] = None

    def returned(self, host, result):
        """A host's probe returned (ok, failed or unreachable); `result` its module result."""
        with self._lock:
            self._out.pop(host, None)
            self.done += 1
            image = result.get("container") if isinstance(result, dict) else None
            if isinstance(image, dict):
                self.pulled += image.get("pulled") is True
                self.failed += bool(image.get("pull_error"))

    def line(self):
        with self._lock:
            return self._line()

    def _line(self):
        what = [("%d pulled" % self.pulled) if self.pulled else "",
                ("%d could not pull" % self.failed) if self.failed else ""]
        what = ", ".join(w for w in what if w)
        text = "pulling %s: %d of %d hosts done%s" % (
            self.image, self.done, max(self.total, self.done + len(self._out)),
            " (%s)" % what if what else "")
        if self._out:
            names = [_cut(h, PULL_NAME_CHARS) for h in list(self._out)[:PULL_NAMES]]
            more = len(self._out) - len(names)
            text += ", waiting on %s%s" % (", ".join(names), " (+%d more)" % more if more else "")
        queued = self.total - self.done - len(self._out)
        if queued > 0:  # beyond Ansible's forks: each starts when a probe before it returns
            text += "; %d wait for a fork%s" % (
                queued, " (%s at a time)" % self.forks if self.forks else "")
        return text + " for %d s (timeout %d s)" % (self._clock() - self._began, self.timeout_s)

    def _tick(self):
        try:
            while not self._stopped.wait(self.every_s):
                with self._lock:
                    if self._stopped.is_set():
                        return
                    self._say(self._line())
        except Exception:  # a screen that fails (a closed pipe) ends the line, not the play
            return


class CallbackModule(Default):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "torchfleet"

    def __init__(self):
        super().__init__()
        self._open = None  # the task whose line is still to be printed
        self._counts = {key: 0 for key in COUNTS}
        self._headed = False
        self._prefix = "TASK"
        self._play_pending = None
        self._log = []  # every task's and play's line: the run's play.log
        self._play_unshown = None  # a play whose banner waits for a failure to show
        self._run_dir = None  # where the play's report was written
        self._pull_announced = None  # a pull the next task on the hosts makes
        self._pull = None  # its PullProgress while that task runs

    def _all(self):
        """Every task's line on the screen too (-v and more)."""
        return self._display.verbosity >= 1

    def _line(self, text, shown=False):
        """A line of the run's log; on the screen too when shown or with -v."""
        if len(self._log) < PLAY_LOG_LINES:
            self._log.append(text)
        if shown or self._all():
            self._display.display(text)

    # ---- a task's line -------------------------------------------------------------------
    def _close_task(self):
        self._stop_pull()
        if self._open is None:
            return
        if self._play_pending is not None:
            if self._open.action in META and not any(self._counts.values()):
                # A play that ends at its first task (an attempt of train.yml that is not
                # needed) prints nothing at all.
                self._open = None
                return
            self._flush_play()
        counts = ", ".join("%s %s" % (k, v) for k, v in self._counts.items()
                           if v or k in ("ok", "failed"))
        name = "%s [%s]" % (self._prefix, self._open.get_name().strip())
        if self._headed:  # its banner and full output are above
            self._line("  => %s" % counts, shown=True)
            self._log[-1] = "%s %s" % (name, counts)
        else:
            self._line("%s %s" % (name, counts))
        self._open = None

    def _flush_play(self):
        play, self._play_pending = self._play_pending, None
        if play is None:
            return
        if len(self._log) < PLAY_LOG_LINES:
            self._log.append("PLAY [%s]" % play.get_name().strip())
        if self._all():
            Default.v2_playbook_on_play_start(self, play)
        else:
            self._play_unshown = play

    def _head(self):
        """The default callback's banners of the play and the task, printed once each, before
        the first full output of a failure (or of any task with -v)."""
        self._flush_play()
        if self._play_unshown is not None:
            play, self._play_unshown = self._play_unshown, None
            Default.v2_playbook_on_play_start(self, play)
        if self._open is not None and not self._headed:
            self._headed = True
            self._print_task_banner(self._open)

    def _start(self, task, prefix):
        if self._open is not None and self._open._uuid == task._uuid:
            return  # a meta task with a condition starts once per host: still one line
        self._close_task()
        self._open, self._headed, self._prefix = task, False, prefix
        if self._pull_announced is not None and task.action not in SHOWN | META:
            announced, self._pull_announced = self._pull_announced, None
            self._start_pull(announced)
        self._counts = {key: 0 for key in COUNTS}
        # What the default callback keeps of a task for its banner and result lines.
        self._task_type_cache[task._uuid] = prefix
        self._last_task_name = task.get_name().strip()
        self._last_task_banner = None

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._start(task, "TASK")

    def v2_playbook_on_handler_task_start(self, task):
        self._start(task, "RUNNING HANDLER")

    def v2_playbook_on_play_start(self, play):
        self._close_task()
        self._pull_announced = None
        self._play = play
        self._play_pending = play  # its banner waits for its first task that does something

    def v2_playbook_on_no_hosts_matched(self):
        # A play for a step not every run needs (preflight.yml's second port round, health=full)
        # matches no host when it is not needed; an empty inventory is named by the report.
        pass

    def v2_playbook_on_stats(self, stats):
        self._close_task()
        self._pull_announced = None
        self._write_log()
        hosts = sorted(stats.processed.keys())
        summary = {h: stats.summarize(h) for h in hosts}
        self._display.banner("PLAY RECAP")
        bad = [h for h in hosts if summary[h]["failures"] or summary[h]["unreachable"]]
        for host in bad:  # as the default prints them
            s = summary[host]
            self._display.display("%-26s : ok=%-4d changed=%-4d unreachable=%-4d failed=%-4d "
                                  "skipped=%-4d rescued=%-4d ignored=%-4d" % (
                                      host, s["ok"], s["changed"], s["unreachable"],
                                      s["failures"], s["skipped"], s["rescued"], s["ignored"]))
        rest = [h for h in hosts if h not in bad]
        if rest:
            total = {k: sum(summary[h][k] for h in rest) for k in ("ok", "changed", "skipped",
                                                                   "ignored")}
            changed = [h for h in rest if summary[h]["changed"]]
            # In the default's key=value form (failed and unreachable are 0 by definition).
            self._display.display(
                "%d other host(s) : ok=%d changed=%d unreachable=0 failed=0 skipped=%d "
                "ignored=%d%s" % (len(rest), total["ok"], total["changed"], total["skipped"],
                                  total["ignored"], "  (changed on %s)" % ", ".join(changed[:8])
                                  if changed else ""))
        self._display.display("", screen_only=True)

    def _write_log(self):
        if not self._run_dir:
            if not self._all():
                self._display.display("(every task's line: -v)")
            return
        path = os.path.join(self._run_dir, PLAY_LOG)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
            with os.fdopen(fd, "a") as f:
                f.write("\n".join(self._log) + "\n")
        except OSError as exc:
            self._display.display("(the run's log %s could not be written: %s)" % (path, exc))
            return
        self._display.display("every task: %s (-v prints them here)" % path)

    def _said(self, result):
        """What a debug task says on purpose: its message alone, without -v."""
        msg = result._result.get("msg")
        if self._all() or not isinstance(msg, str):
            self._head()
            return False
        self._flush_play()
        self._display.display(msg)
        return True

    def _found_report(self, result):
        """The run's directory: where the play wrote its report (preflight.json, train.json)."""
        report = result._result.get("report")
        if isinstance(report, str) and report.endswith(".json") and os.path.isabs(report):
            self._run_dir = os.path.dirname(report)

    # ---- the probes' pull: a line every every_s while their task runs --------------------
    def _announced(self, result):
        facts = result._result.get("ansible_facts")
        pull = facts.get(PULL_FACT[0]) if isinstance(facts, dict) else None
        pull = pull.get(PULL_FACT[1]) if isinstance(pull, dict) else None
        if isinstance(pull, dict) and pull.get("image"):
            self._pull_announced = pull

    def _start_pull(self, announced):
        try:
            forks = context.CLIARGS.get("forks")
        except Exception:  # no command line (a callback driven by an API): the line says less
            forks = None
        try:
            self._pull = PullProgress(announced, self._display.display, forks)
        except (TypeError, ValueError):  # an announcement of another shape: no line
            return
        self._pull.start()

    def _stop_pull(self):
        pull, self._pull = self._pull, None
        if pull is not None:
            pull.stop()

    def _returned(self, result):
        if self._pull is not None:
            self._pull.returned(result._host.get_name(), result._result)

    # ---- per host: counted; failures and what a task shows on purpose, in full ---------
    def _count(self, key):
        self._counts[key] += 1

    def v2_runner_on_ok(self, result):
        self._count("changed" if result._result.get("changed") else "ok")
        self._found_report(result)
        self._announced(result)
        self._returned(result)
        if result._task.action in SHOWN:
            if not self._said(result):
                super().v2_runner_on_ok(result)
        elif self._run_is_verbose(result):
            self._head()
            super().v2_runner_on_ok(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._count("ignored" if ignore_errors else "failed")
        self._returned(result)
        self._head()
        super().v2_runner_on_failed(result, ignore_errors)

    def v2_runner_on_unreachable(self, result):
        self._count("unreachable")
        self._returned(result)
        self._head()
        super().v2_runner_on_unreachable(result)

    def v2_runner_on_skipped(self, result):
        self._count("skipped")
        self._returned(result)

    def v2_runner_item_on_ok(self, result):
        if result._task.action in SHOWN and not self._said(result):
            super().v2_runner_item_on_ok(result)

    def v2_runner_item_on_failed(self, result):
        self._head()
        super().v2_runner_item_on_failed(result)

    def v2_runner_item_on_skipped(self, result):
        pass

    def v2_runner_retry(self, result):
        pass  # the task's line (or its failure) says how it ended

    def v2_runner_on_start(self, host, task):
        if self._pull is not None:  # a fork took this host's probe
            self._pull.started(host.get_name())

    def v2_playbook_on_include(self, included_file):
        pass
