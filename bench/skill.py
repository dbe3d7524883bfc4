"""Forecast skill over a long record: `GET /v1/forecast/skill` (which the dashboard polls, and every
Prometheus scrape of /metrics computes) over a month of the standing forecast's scores.

    .venv/bin/python bench/skill.py [--days 30] [--database-url URL] [--repeat 3]

The store holds what `FINETWIN_FORECAST_EVERY`'s default writes in `--days` of telemetry time: a forecast
every 5 minutes, each scored over 24 hourly intervals on 10 figures (six overall, utilization of four GPU
types): 2,073,600 scores for 30 days. Measured, best of `--repeat`, on the same store in one run:

- the skill of every interval and of the last day, from the running sums (`twin.skill_totals`);
- the baseline: the same skill as it was computed before them, every score of the window read and
  summarized in Python, as GET /v1/forecast/skill did;
- the one-time cost of the migration that sums a store's scores (0008), on the same scores.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from sqlalchemy import Engine, insert  # noqa: E402
from sqlmodel import Session, col, func, select  # noqa: E402
from timing import best_of, print_table  # noqa: E402

from finetwin.schema import migrate  # noqa: E402
from twin.db import make_engine  # noqa: E402
from twin.forecast_store import ForecastScore  # noqa: E402
from twin.skill import skill  # noqa: E402
from twin.skill_totals import EDGE, Totals  # noqa: E402

FIGURES = ("utilization", "queue_length", "running_jobs", "jobs_completed", "jobs_failed", "energy_kwh",
           "utilization/L40S", "utilization/NVIDIA-A100-SXM4-80GB", "utilization/NVIDIA-A100-80GB-PCIe",
           "utilization/NVIDIA-H100-PCIe")  # fmt: skip
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def store_scores(engine: Engine, days: int) -> int:
    """The scores of `days` of standing forecasts, written as rows (no sums: the migration adds them)."""
    rng = np.random.default_rng(0)
    batch: list[dict[str, object]] = []
    written = 0
    with engine.begin() as connection:
        for forecast in range(days * 288):
            start = T0 + timedelta(minutes=5 * forecast)
            for interval in range(24):
                means, actuals = rng.random(len(FIGURES)), rng.random(len(FIGURES))
                for figure, mean, actual in zip(FIGURES, means.tolist(), actuals.tolist(), strict=True):
                    recalibrated = interval % 2 == 0
                    batch.append({
                        "forecast_id": forecast + 1, "cluster_id": "default", "figure": figure,
                        "interval_index": interval, "interval_start": start + timedelta(hours=interval),
                        "interval_end": start + timedelta(hours=interval + 1), "forecast_mean": mean,
                        "forecast_p10": mean - 0.3, "forecast_p90": mean + 0.3, "actual": actual,
                        "inside": abs(mean - actual) <= 0.3, "raw_p10": mean - 0.2 if recalibrated else None,
                        "raw_p90": mean + 0.2 if recalibrated else None, "scored_at": start,
                    })  # fmt: skip
            if len(batch) >= 50_000:
                connection.execute(insert(ForecastScore), batch)
                written += len(batch)
                batch = []
        if batch:
            connection.execute(insert(ForecastScore), batch)
            written += len(batch)
    return written


def every_score(engine: Engine, since: datetime | None) -> dict[str, object]:
    """The baseline: the skill as GET /v1/forecast/skill computed it before the running sums, every score of
    the window read (the columns it read) and summarized in Python."""
    score = ForecastScore
    with Session(engine) as session:
        query = select(score.forecast_id, score.figure, score.forecast_mean, score.actual, score.inside,
                       func.coalesce(score.raw_p10, score.forecast_p10),
                       func.coalesce(score.raw_p90, score.forecast_p90))  # fmt: skip
        if since is not None:
            query = query.where(col(score.interval_start) >= since)
        rows = session.exec(query).all()
    totals: dict[str, Totals] = {}
    for _, figure, mean, actual, inside, low, high in rows:
        raw_inside = low - EDGE <= actual <= high + EDGE
        totals.setdefault(figure, Totals()).add_score(mean, actual, inside, raw_inside)
    figures = {figure: t.summary() for figure, t in totals.items()}
    return {"scored": len({r[0] for r in rows}), "intervals": len(rows), "figures": figures}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--database-url", help="default: a SQLite file in a temporary directory")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        engine = make_engine(args.database_url or f"sqlite:///{Path(work) / 'skill.db'}")
        migrate(engine, "0007")
        scores = store_scores(engine, args.days)
        started = time.perf_counter()
        migrate(engine)
        migration_s = time.perf_counter() - started
        last_day = T0 + timedelta(days=args.days - 1, hours=12, minutes=2)  # a window starting mid-day
        check = skill(engine, "default")
        reference = every_score(engine, None)
        assert (
            check["intervals"] == reference["intervals"] == scores and check["scored"] == reference["scored"]
        )
        rows = []
        for label, since in (("every interval", None), ("the last 1.5 days", last_day)):
            sums_s = best_of(args.repeat, lambda since=since: skill(engine, "default", since))
            baseline_s = best_of(args.repeat, lambda since=since: every_score(engine, since))
            rows.append((f"skill over {label}, s", sums_s, baseline_s, "every score read"))
        rows.append(("migration 0008: summing the stored scores, s (once)", migration_s, None, ""))
        engine.dispose()
    print(f"forecast skill: {scores:,} scores ({args.days} days of the standing forecast), "
          f"{engine.url.get_backend_name()}, best of {args.repeat}")  # fmt: skip
    print_table(rows)


if __name__ == "__main__":
    main()
