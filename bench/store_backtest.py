"""`finetwin backtest --from-store` on a store that has run for months: what the backtest reads of the store
(the state at T and at T + H), from its window only, against folding every event up to T + H (how it read
the store before), and against the same read on a store a tenth as old.

    .venv/bin/python bench/store_backtest.py [--replays 40] [--database-url URL] [--repeat 3]

The store holds `--replays` replays of the bundled benchmark sample back to back (a job a minute, about
2.8 days and 16,000 events each), applied by ingest as telemetry; the small store holds a tenth of them.
T is 12 hours before the newest event, H is 6 hours, the lookback is the default week. Best of `--repeat`,
same machine, one run.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import Engine, func, select  # noqa: E402
from timing import analyze, best_of, print_table, small_and_large  # noqa: E402

from calibrate.loader import bundled_benchmark_path, load_benchmark  # noqa: E402
from finetwin.schema import migrate  # noqa: E402
from ingest.apply import apply_events  # noqa: E402
from ingest.replay import plan_replay  # noqa: E402
from twin.clock import telemetry_span  # noqa: E402
from twin.db import make_engine  # noqa: E402
from twin.rebuild import backtest_states, fold_events, stored_events  # noqa: E402
from twin.store import TelemetryEvent  # noqa: E402

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
HORIZON = timedelta(hours=6)
LOOKBACK = timedelta(days=7)
BATCH = 5_000


def fill(engine: Engine, replays: int) -> int:
    """Replays of the sample back to back, each starting where the last ended; returns the events applied."""
    table = load_benchmark(bundled_benchmark_path())
    epoch, applied = EPOCH, 0
    for k in range(replays):
        plan = plan_replay(table, seed=k, job_prefix=f"r{k}-", epoch=epoch)
        events = [event for _, event in plan.events]
        for first in range(0, len(events), BATCH):
            applied += apply_events(engine, events[first : first + BATCH]).applied
        epoch += timedelta(seconds=plan.duration_s + 60)
    return applied


def whole_record(engine: Engine, at: datetime, end: datetime) -> None:
    """The read before: every event up to T + H, folded at T and at T + H."""
    events = stored_events(engine, "default", end)
    fold_events(events, "default", at)
    fold_events(events, "default", end)


def timings(url: str, replays: int, repeat: int) -> dict[str, float]:
    engine = make_engine(url)
    migrate(engine)
    fill(engine, replays)
    analyze(engine)
    newest = telemetry_span(engine, "default")[1]
    assert newest is not None
    at = newest - 2 * HORIZON
    end = at + HORIZON
    with engine.connect() as connection:
        events = connection.execute(select(func.count()).select_from(TelemetryEvent)).scalar_one()
    out = {
        "events": float(events),
        "window": best_of(repeat, lambda: backtest_states(engine, "default", at, end, LOOKBACK)),
        "whole": best_of(repeat, lambda: whole_record(engine, at, end)),
    }
    engine.dispose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replays", type=int, default=40)
    parser.add_argument("--database-url", help="an empty database for the large store (default: SQLite)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    small_replays = max(1, args.replays // 10)

    def measure(url: str, replays: int, _: Path) -> dict[str, float]:
        return timings(url, replays, args.repeat)

    small, big = small_and_large(measure, small_replays, args.replays, args.database_url)
    print(f"a backtest's read of the store: {big['events']:,.0f} events ({args.replays} replays) against "
          f"{small['events']:,.0f} ({small_replays}), best of {args.repeat}")  # fmt: skip
    whole = "every event up to T + H folded"
    rows = (
        ("the window's read, large store, s", big["window"], big["whole"], whole),
        ("the window's read, large store, s", big["window"], small["window"], "the small store's"),
        ("the window's read, small store, s", small["window"], small["whole"], whole),
    )
    print_table(rows)


if __name__ == "__main__":
    main()
