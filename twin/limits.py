"""What the store and Python can hold: the bounds every value that enters finetwin is checked against.

One place for them, so that the telemetry contract (`ingest.events`, and its msgspec mirror), the job
configuration and the code that reads stored rows back agree. A value outside these bounds is refused where
it enters (telemetry: dead-lettered with reason `schema`), never passed on to fail in the database, in
`datetime` arithmetic or in a simulation.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated

from pydantic import AfterValidator, StringConstraints

from twin.units import parse_duration

# Integer columns are PostgreSQL `integer` (4 bytes); SQLite holds 8, so the smaller range is the store's.
STORE_INT_MAX = 2**31 - 1

# An event's time must lie within this much of the receiving clock, either way. Far enough for any backfill
# of recorded telemetry and any sensible clock skew setting; near enough that every store and Python hold it
# once converted to UTC (`9999-12-31T23:59:59-01:00` is year 10000 in UTC, `0001-01-01T00:00:00+01:00` is
# 1 BC: PostgreSQL stores both and then no Python can read them back; SQLite's driver cannot even write them).
EVENT_TIME_WINDOW = timedelta(days=3653)  # ten years

# How far ahead of the worker's clock an event may be dated before it is dead-lettered (`clock_skew`):
# the default of FINETWIN_MAX_CLOCK_SKEW.
DEFAULT_MAX_CLOCK_SKEW = timedelta(hours=1)

# The longest span the twin simulates, and the most intervals one run's series holds: a horizon of 1e11 hours
# (or a job arriving at 1e308 s) asked numpy for 745 GiB. Ten years of hourly intervals fit.
MAX_SIMULATED_SECONDS = EVENT_TIME_WINDOW.total_seconds()
MAX_SERIES_INTERVALS = 100_000
# Power is reported per GPU (the energy is GPUs x watts x seconds): 10 kW is ten times the board power of the
# largest GPU made (about 1 kW), so even a node's power reported by mistake as a GPU's is not refused.
MAX_GPU_POWER_WATTS = 10_000.0


def plausible_power(watts: float | None) -> float | None:
    """A power per GPU the twin computes energy with: a positive one within MAX_GPU_POWER_WATTS, else None
    (then the twin assumes one). Telemetry is bounded where it enters; a row stored before it was (1e308 W)
    made every interval's energy NaN."""
    if watts is None or not 0 < watts <= MAX_GPU_POWER_WATTS:  # NaN fails both comparisons
        return None
    return float(watts)


# Runs of one ensemble (what-if, plan, forecast, backtest): a billion grew by 100 MB/s until memory ran out.
MAX_ENSEMBLE_RUNS = 256
# Seeds numpy's generators take: a non-negative integer (a 64-bit one, as the API's bodies are bounded).
MAX_SEED = 2**63 - 1


def simulated_duration(value: str | float) -> float:
    """Seconds in a horizon or interval the twin is asked to simulate (`twin.units.parse_duration`); raises
    ValueError naming the value when it is not a duration or is longer than MAX_SIMULATED_SECONDS."""
    seconds = parse_duration(value)
    if seconds > MAX_SIMULATED_SECONDS:
        raise ValueError(
            f"{value!r} is longer than the twin simulates: at most {MAX_SIMULATED_SECONDS / 86400:,.0f} days "
            "(ten years)"
        )
    return seconds


def interval_problem(horizon: str | float | None, interval: str | float) -> str | None:
    """Why an interval cannot step a horizon (both already valid durations), None when it can: an interval
    longer than the horizon was echoed back as asked while the series held one interval of the horizon."""
    if horizon is None or parse_duration(interval) <= parse_duration(horizon):
        return None
    return f"the interval {interval!r} is longer than the horizon {horizon!r}"


def series_intervals_problem(window_s: float, interval_s: float) -> str | None:
    """Why a series over `window_s` in steps of `interval_s` cannot be made, None when it can."""
    count = window_s / interval_s
    if count <= MAX_SERIES_INTERVALS:
        return None
    return (
        f"{window_s:,.0f} s in intervals of {_seconds(interval_s)} s is {count:,.0f} intervals; at most "
        f"{MAX_SERIES_INTERVALS:,} (a longer --interval, or a shorter --horizon)"
    )


def _seconds(value: float) -> str:
    """Whole seconds with thousands separators, a fraction as given (an interval of 0.5 s read "0 s")."""
    return f"{value:,.0f}" if value == round(value) else f"{value:,.6g}"


# Text the store can hold: PostgreSQL refuses NUL in `text` and `json`. (A lone UTF-16 surrogate, which
# JSON's `\ud800` escape stands for, cannot be encoded as UTF-8 for any database either; pydantic and
# msgspec refuse it already, and this check does too.)
STORABLE_TEXT = re.compile("^[^\x00\ud800-\udfff]*$")


def is_storable_text(text: str) -> bool:
    return STORABLE_TEXT.match(text) is not None


def _storable(text: str) -> str:
    problem = unstorable_text_problem(text)
    if problem is not None:
        raise ValueError(problem)
    return text


def unstorable_text_problem(text: str) -> str | None:
    """Why the store cannot hold a text (the first character it cannot), None when it can."""
    if is_storable_text(text):
        return None
    if "\x00" in text:
        return "contains a NUL character, which the store cannot hold"
    lone = next(c for c in text if "\ud800" <= c <= "\udfff")
    return f"contains a lone UTF-16 surrogate (U+{ord(lone):04X}), which is not text the store can hold"


# Text a pydantic model accepts only if the store can hold it.
StorableText = Annotated[str, AfterValidator(_storable)]
# An id the store keeps (a job's, a node's): 1-200 characters, its length checked as a string's first
# ("at least 1 character"; a length set on StorableText itself is checked after its validator, and said as
# a list's: "at least 1 item").
StoredId = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(_storable)]

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


def check_topic_name(name: str) -> str:
    if not _TOPIC_NAME.fullmatch(name) or name in (".", ".."):
        raise ValueError(
            "not a Kafka topic name: 1-249 ASCII letters, digits, '.', '_' or '-', and not '.' or '..'"
        )
    return name


# A topic's name as Kafka allows it: checked when the settings are read (kafka-python raised it as a
# traceback when the consumer subscribed).
TopicName = Annotated[str, AfterValidator(check_topic_name)]


def time_window(now: datetime | None = None) -> tuple[datetime, datetime]:
    """The earliest and latest event times accepted at `now` (default: this machine's clock)."""
    now = now or datetime.now(UTC)
    return now - EVENT_TIME_WINDOW, now + EVENT_TIME_WINDOW


def within_time_window(ts: datetime, now: datetime | None = None) -> bool:
    """Whether an aware time lies in the window around `now` (compared as instants, never converted: a time
    at the edge of `datetime`'s range cannot always be converted to UTC)."""
    earliest, latest = time_window(now)
    return earliest <= ts <= latest
