"""Where the latest report lives: a small JSON pointer, `<data_dir>/reports/latest.json`, rewritten
atomically each time `finetwin report` runs, so the dashboard can link the newest report without
scanning directories (a JSON file rather than a symlink: it works on every file system and says more)."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from calibrate.settings import CalibrateSettings

POINTER_FILE = "latest.json"


def reports_root(settings: CalibrateSettings) -> Path:
    """The directory that holds reports written without --out, and the latest-report pointer."""
    return settings.data_dir / "reports"


def new_report_dir(settings: CalibrateSettings) -> Path:
    """Where a report written without --out goes: `<data_dir>/reports/<UTC time>`."""
    return reports_root(settings) / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def record_latest(report: Any, root: Path) -> Path:
    """Point `root/latest.json` at `report` (a `calibrate.report.Report`); returns the pointer's path."""
    root.mkdir(parents=True, exist_ok=True)
    pointer = {
        "out_dir": str(report.out_dir),
        "report_md": str(report.report_md),
        "numbers_json": str(report.numbers_json),
        "figures": {k: (str(v) if v else None) for k, v in report.figures.items()},
        "generated_at": report.generated_at,
        "source": report.source,
    }
    path = root / POINTER_FILE
    tmp = path.with_name(f".{POINTER_FILE}.tmp")
    tmp.write_text(json.dumps(pointer, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def latest_report(settings_or_root: CalibrateSettings | Path) -> dict[str, Any] | None:
    """The pointer's content (absolute paths: out_dir, report_md, numbers_json, figures; generated_at,
    source), or None when no report was written or its files are gone."""
    root = (
        reports_root(settings_or_root)
        if isinstance(settings_or_root, CalibrateSettings)
        else settings_or_root
    )
    try:
        pointer = json.loads((root / POINTER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not Path(pointer.get("report_md", "")).is_file():
        return None
    return pointer
