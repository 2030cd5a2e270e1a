"""torchfleet's benchmark harness: `python -m bench --help`."""
