from __future__ import annotations

from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.table import render


def test_columns_align_and_long_cells_wrap_between_words():
    text = render(("HOST", "FIX"), [("node0", "mount /very/long/path/that/stays/whole now")],
                  max_width=20)
    lines = text.splitlines()
    assert lines[0].split() == ["HOST", "FIX"]
    assert lines[2].startswith("node0  mount")
    assert "/very/long/path/that/stays/whole" in text
    assert lines[-1].strip() == "now" and lines[-1].index("now") == lines[0].index("FIX")
