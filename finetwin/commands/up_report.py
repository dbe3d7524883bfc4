"""`up`'s characterization report of the benchmark it replays, written once per data directory: the
dashboard's report panel then shows the paper's four questions answered on that benchmark from `up`'s
first minute, where it said "run `finetwin report`" (2.7 s of one core on the bundled sample)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from finetwin.settings import Settings

log = logging.getLogger(__name__)


def start_first_report(settings: Settings, bench: Path) -> threading.Thread | None:
    """A thread writing the report of `bench` where `finetwin report` writes one, unless the data directory
    has a report already (None then): a report written by hand, or by an earlier `up`, is left as it is."""
    from calibrate.report.latest import latest_report

    if latest_report(settings) is not None:
        return None
    thread = threading.Thread(target=_write, args=(settings, bench), name="first-report", daemon=True)
    thread.start()
    return thread


def _write(settings: Settings, bench: Path) -> None:
    from calibrate.loader import load_benchmark
    from calibrate.report.build import build_report
    from calibrate.report.latest import new_report_dir, record_latest, reports_root

    try:
        built = build_report(
            load_benchmark(bench), new_report_dir(settings), source=str(bench), formats=("md",)
        )
        record_latest(built, reports_root(settings))
    except Exception:  # a convenience: `up` serves on without it, and says why
        log.warning("no characterization report of %s for the dashboard", bench, exc_info=True)
        return
    log.info("characterization report of %s: %s (the dashboard's report panel)", bench, built.report_md)
