"""Durations as people write them (twin.units.parse_duration): every option, file and query that takes one."""

from __future__ import annotations

import pytest

from twin.units import duration_text, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        (90, 90.0),
        ("90s", 90.0),
        ("30m", 1800.0),
        ("24H", 86400.0),
        ("7d", 604800.0),
        ("1w", 604800.0),
        ("1.5h", 5400.0),
        # Several parts, as Go, Prometheus and kubectl write them (`1h30m` was not a duration).
        ("1h30m", 5400.0),
        ("1d 12h", 129600.0),
        ("2 days, 3 hours", 183600.0),
        # The units' words.
        ("6 hours", 21600.0),
        ("90 minutes", 5400.0),
        ("1 min", 60.0),
        ("45 secs", 45.0),
        ("2 weeks", 1209600.0),
        # ISO 8601, as FINETWIN_MAX_CLOCK_SKEW takes it (`?since=P1D` was refused).
        ("PT1H", 3600.0),
        ("P1D", 86400.0),
        ("P1DT12H", 129600.0),
        ("PT1H30M", 5400.0),
        ("P2W", 1209600.0),
        ("pt0.5s", 0.5),
    ],
)
def test_durations_in_the_ways_people_write_them(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    ["6 months", "h", "", "6 hrz", "-5m", "1h30", "m30", "1h 30m tomorrow"]
    + ["P", "PT", "P1M", "P1Y", "PT1H2D"],  # ISO 8601's months and years are no fixed length
)
def test_what_is_not_a_duration_is_refused_with_examples(text: str) -> None:
    examples = r"\(use e\.g\. 90s, 30m, 24h, 7d, 1h30m or 6 hours\)"
    with pytest.raises(ValueError, match=rf"not a duration: .* {examples}"):
        parse_duration(text)


def test_a_duration_is_positive() -> None:
    with pytest.raises(ValueError, match="a duration must be positive: '0s'"):
        parse_duration("0s")


def test_a_long_text_that_is_no_duration_is_refused_at_once() -> None:
    """Spaces between many parts, then a stray character: a pattern that may split each run of spaces two
    ways would try them all (2^n) before failing; this one reads it one way, and a text longer than any
    duration is not read at all."""
    assert parse_duration("1h " * 33) == 33 * 3600.0
    for text in ("1h  " * 24 + "!", "1h  " * 10_000 + "!"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(1.0, "1 s"), (90.0, "90 s"), (120.0, "2 min"), (2700.0, "45 min"), (7200.0, "2 h"), (86400.0, "24 h"),
     (172800.0, "2 d"), (604800.0, "7 d")],
)  # fmt: skip
def test_a_duration_is_written_in_the_largest_unit_that_keeps_it_readable(seconds: float, text: str) -> None:
    """A horizon of one second read `0.000277778 h`; each text reads back as its seconds."""
    assert duration_text(seconds) == text
    assert parse_duration(text.replace(" ", "")) == seconds
