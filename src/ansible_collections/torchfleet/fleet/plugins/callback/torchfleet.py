# -*- coding: utf-8 -*-
from __future__ import annotations

DOCUMENTATION = r"""
---
name: torchfleet
type: stdout
short_description: One line per task with counts of hosts; every failure in full
description:
  - Ansible's default output prints a line per host per task, thousands of lines for a preflight
    of a hundred hosts before the table that matters. This callback prints, per task, one line
    with how many hosts were ok, changed, skipped, failed and unreachable, and every failure or
    unreachable host in full, with the same text as the default callback.
  - What a task prints on purpose (debug messages such as torchfleet's summary tables) is shown
    in full, as is the watch's progress; the recap lists the hosts that failed or were
    unreachable and counts the rest.
  - C(ANSIBLE_STDOUT_CALLBACK=default) gives Ansible's own output back.
version_added: "0.1.0"
author: torchfleet developers (@torchfleet)
extends_documentation_fragment:
  - default_callback
  - result_format_callback
"""

from ansible.plugins.callback.default import CallbackModule as Default

COUNTS = ("ok", "changed", "skipped", "failed", "unreachable", "ignored")
# Tasks whose output is their purpose: shown in full, as the default callback shows it.
SHOWN = frozenset(("debug", "ansible.builtin.debug", "ansible.legacy.debug"))
META = frozenset(("meta", "ansible.builtin.meta", "ansible.legacy.meta"))


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

    # ---- a task's line -------------------------------------------------------------------
    def _close_task(self):
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
        if self._headed:  # its banner and full output are above
            self._display.display("  => %s" % counts)
        else:
            self._display.display("%s [%s] %s" % (self._prefix, self._open.get_name().strip(),
                                                  counts))
        self._open = None

    def _flush_play(self):
        play, self._play_pending = self._play_pending, None
        if play is not None:
            super().v2_playbook_on_play_start(play)

    def _head(self):
        """The default callback's banner, printed once, before the first full output."""
        self._flush_play()
        if self._open is not None and not self._headed:
            self._headed = True
            self._print_task_banner(self._open)

    def _start(self, task, prefix):
        if self._open is not None and self._open._uuid == task._uuid:
            return  # a meta task with a condition starts once per host: still one line
        self._close_task()
        self._open, self._headed, self._prefix = task, False, prefix
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
        self._play = play
        self._play_pending = play  # its banner waits for its first task that does something

    def v2_playbook_on_stats(self, stats):
        self._close_task()
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

    # ---- per host: counted; failures and what a task shows on purpose, in full ---------
    def _count(self, key):
        self._counts[key] += 1

    def v2_runner_on_ok(self, result):
        self._count("changed" if result._result.get("changed") else "ok")
        if result._task.action in SHOWN or self._run_is_verbose(result):
            self._head()
            super().v2_runner_on_ok(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._count("ignored" if ignore_errors else "failed")
        self._head()
        super().v2_runner_on_failed(result, ignore_errors)

    def v2_runner_on_unreachable(self, result):
        self._count("unreachable")
        self._head()
        super().v2_runner_on_unreachable(result)

    def v2_runner_on_skipped(self, result):
        self._count("skipped")

    def v2_runner_item_on_ok(self, result):
        if result._task.action in SHOWN:
            self._head()
            super().v2_runner_item_on_ok(result)

    def v2_runner_item_on_failed(self, result):
        self._head()
        super().v2_runner_item_on_failed(result)

    def v2_runner_item_on_skipped(self, result):
        pass

    def v2_runner_retry(self, result):
        pass  # the task's line (or its failure) says how it ended

    def v2_runner_on_start(self, host, task):
        pass

    def v2_playbook_on_include(self, included_file):
        pass
