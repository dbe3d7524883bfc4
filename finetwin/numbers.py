"""Numbers as the commands print them ("-" for a missing or non-finite value)."""

from __future__ import annotations

import math
from typing import Any


def finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def pct(value: Any) -> str:
    return f"{float(value):.1%}" if finite(value) else "-"


def num(value: Any) -> str:
    return f"{float(value):.3f}" if finite(value) else "-"


def short(value: Any) -> str:
    """Three significant digits, thousands separated above 1000."""
    if not finite(value):
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"
