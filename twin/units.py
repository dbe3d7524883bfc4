"""Durations as people write them: `90s`, `30m`, `24h`, `7d`, `1w`, or plain seconds."""

from __future__ import annotations

import math
import re

JOULES_PER_KWH = 3.6e6  # watt-seconds in a kilowatt-hour

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.IGNORECASE)


def parse_duration(text: str | float | int) -> float:
    """Seconds in a duration; raises ValueError naming the text when it is not one."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds = float(text)
    else:
        match = _DURATION.match(str(text))
        if not match:
            raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 30m, 24h, 7d)")
        seconds = float(match.group(1)) * _UNITS[(match.group(2) or "s").lower()]
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"a duration must be positive: {text!r}")
    return seconds
