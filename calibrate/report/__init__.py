"""The characterization report: the paper's four questions (will the job run, how fast, will it scale,
how to go faster) answered with the paper's definitions, from any LLMFineTuningBench file or from the
runs observed in the store.

`build_report(table_or_csv, out_dir)` writes report.md, numbers.json and PNG figures; `latest_report()`
finds the newest one. Exports are loaded lazily so `finetwin --help` does not import pandas/matplotlib.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Report", "build_report", "compute_numbers", "latest_report", "record_latest", "reports_root"]

_EXPORTS = {
    "Report": "calibrate.report.build",
    "build_report": "calibrate.report.build",
    "compute_numbers": "calibrate.report.build",
    "latest_report": "calibrate.report.latest",
    "record_latest": "calibrate.report.latest",
    "reports_root": "calibrate.report.latest",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'calibrate.report' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
