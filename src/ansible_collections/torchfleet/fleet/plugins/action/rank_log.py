"""Read a rank's log on its host (the rank_log module); with follow, read on until the host's
part of the run ends: each chunk is printed and appended to `dest` on the controller, which
`torchfleet logs --follow` prints as it grows. Ctrl-C ends the following, never the run."""
from __future__ import annotations

import os

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.torchfleet.fleet.plugins.module_utils.run.ranklog import ARGUMENT_SPEC, STREAMS

display = Display()

SPEC = dict(ARGUMENT_SPEC, follow=dict(type="bool", default=False),
            poll_s=dict(type="float", default=5.0), dest=dict(type="path"))


def append(path, text):
    if not path or not text:
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, text.encode("utf-8", "replace"))
    finally:
        os.close(fd)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _checked, p = self.validate_argument_spec(argument_spec=SPEC)
        # As given: a path such as ~/... is the host's, expanded there.
        args = {k: self._task.args[k] for k in ARGUMENT_SPEC if k in self._task.args}
        offsets = dict(args.get("offsets") or {})
        texts = {stream: [] for stream in STREAMS}
        while True:
            args.update(offsets=offsets, wait_s=p["poll_s"] if p["follow"] else 0.0)
            answer = self._execute_module(module_name="torchfleet.fleet.rank_log",
                                          module_args=args, task_vars=task_vars)
            if answer.get("failed"):
                return dict(result, **answer)
            streams = answer.get("streams") or {}
            for stream in STREAMS:
                got = streams.get(stream) or {}
                text = str(got.get("text") or "")
                offsets[stream] = got.get("offset", offsets.get(stream))
                if text:
                    texts[stream].append(text)
                    append(p["dest"], text)
                    if p["follow"]:
                        display.display(text.rstrip("\n"))
            if not p["follow"] or answer.get("ended") or answer.get("missing"):
                break
        result.update(changed=False, found=bool(answer.get("found")),
                      missing=bool(answer.get("missing")),
                      ended=bool(answer.get("ended")), dir=answer.get("dir", ""),
                      streams={s: {"text": "".join(texts[s])[-1024 * 1024:],
                                   "offset": offsets.get(s)} for s in STREAMS})
        return result
