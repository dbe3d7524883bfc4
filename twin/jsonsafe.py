"""Documents that `json.dumps(allow_nan=False)` accepts: forecasts, reports and other computed results."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np


def json_safe(value: Any) -> Any:
    """numpy scalars as Python numbers, NaN/inf as None (JSON has neither), mapping keys as str."""
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def finite_or_none(value: Any) -> float | None:
    """A number as a float, or None when it is missing, not a number, NaN or infinite."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
