"""Durations as people write them: `90s`, `30m`, `24h`, `7d`, `1w`, plain seconds, several parts (`1h30m`,
`1d 12h`, as Go and Prometheus write them), the units' words (`6 hours`, `90 minutes`, `2 days`) and ISO 8601
(`PT1H`, `P1D`, as FINETWIN_MAX_CLOCK_SKEW takes them)."""

from __future__ import annotations

import math
import re

JOULES_PER_KWH = 3.6e6  # watt-seconds in a kilowatt-hour

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
# Each unit by its words: `m` is minutes, as everywhere in finetwin (a month is not a fixed duration).
_UNIT_WORDS = {
    word: _UNITS[unit]
    for unit, words in {
        "s": ("s", "sec", "secs", "second", "seconds"),
        "m": ("m", "min", "mins", "minute", "minutes"),
        "h": ("h", "hr", "hrs", "hour", "hours"),
        "d": ("d", "day", "days"),
        "w": ("w", "wk", "wks", "week", "weeks"),
    }.items()
    for word in words
}
_NUMBER = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*$")
# One way to read any text (each part ends in its separators, the next begins with a digit): a text that
# fails does not make the matcher try every split of its spaces. And no duration is longer than this.
_PARTS = re.compile(r"^\s*(?:\d+(?:\.\d+)?\s*[a-z]+[\s,]*)+$", re.IGNORECASE)
_LONGEST_TEXT = 100
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+)", re.IGNORECASE)
# ISO 8601 without years and months (not a fixed length): P1W, P1D, PT1H30M, P1DT12H, PT0.5S.
_ISO_8601 = re.compile(
    r"^\s*P(?=.*\d)(?:(\d+(?:\.\d+)?)W)?(?:(\d+(?:\.\d+)?)D)?"
    r"(?:T(?=\d)(?:(\d+(?:\.\d+)?)H)?(?:(\d+(?:\.\d+)?)M)?(?:(\d+(?:\.\d+)?)S)?)?\s*$",
    re.IGNORECASE,
)


def parse_duration(text: str | float | int) -> float:
    """Seconds in a duration; raises ValueError naming the text when it is not one."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds = float(text)
    else:
        seconds = _seconds_in(str(text))
        if seconds is None:
            raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 30m, 24h, 7d, 1h30m or 6 hours)")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"a duration must be positive: {text!r}")
    return seconds


def _seconds_in(text: str) -> float | None:
    """The seconds a duration's text says, or None where it is not one (a unit nobody knows included)."""
    if len(text) > _LONGEST_TEXT:
        return None
    iso = _ISO_8601.match(text)
    if iso:
        parts = (float(part) if part else 0.0 for part in iso.groups())
        return sum(n * _UNITS[unit] for n, unit in zip(parts, "wdhms", strict=True))
    bare = _NUMBER.match(text)
    if bare:
        return float(bare.group(1))
    if not _PARTS.match(text):
        return None
    seconds = 0.0
    for number, unit in _PART.findall(text):
        factor = _UNIT_WORDS.get(unit.lower())
        if factor is None:
            return None
        seconds += float(number) * factor
    return seconds


def duration_text(seconds: float) -> str:
    """A duration as people read it, in the largest unit that keeps it readable: `90 s`, `45 min`, `24 h`,
    `7 d` (a horizon of one second read `0.000277778 h`). The inverse of `parse_duration` for these forms."""
    for unit, size, below in (("s", 1.0, 120.0), ("min", 60.0, 7200.0), ("h", 3600.0, 172800.0)):
        if seconds < below:
            return f"{seconds / size:g} {unit}"
    return f"{seconds / 86400.0:g} d"
