"""What pruning a store to FINETWIN_KEEP_TELEMETRY_DAYS costs (`twin.retention`), and what it saves.

    .venv/bin/python bench/retention.py [--days 60] [--keep-days 30] [--database-url URL]

A store (SQLite; or PostgreSQL beside `--database-url`) with `--days` of telemetry: a job submitted every
30 s with six events each (`big_store.fill`), 64 nodes reporting every 10 minutes, and an hourly standing
forecast's scores (24 intervals of 10 figures). The first prune to `--keep-days` deletes about half of it,
while a writer commits an event every 10 ms as ingest would. Its baseline is the naive prune, on a copy of
the same store, with the same writer: one DELETE per table, which holds SQLite's one write lock, so the
writer waits for all of it. Then a tick that finds an hour more due, as the API's schedule does. One run,
same machine.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from datetime import time as day_time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from big_store import T0, fill  # noqa: E402
from sqlalchemy import Engine, delete, func, insert, or_, select, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402
from timing import Row, analyze, print_table  # noqa: E402

import twin.retention as retention  # noqa: E402
from finetwin.schema import migrate  # noqa: E402
from twin.db import make_engine, normalize_url  # noqa: E402
from twin.forecast_store import ForecastScore  # noqa: E402
from twin.store import Job, NodeStatusChange, TelemetryEvent  # noqa: E402

NODES, REPORT_EVERY = 64, timedelta(minutes=10)
FIGURES = 10


def add_reports_and_scores(engine: Engine, days: int) -> None:
    """Every node's report every 10 minutes (one change each, at the start), and an hourly forecast's
    scores."""
    steps = int(timedelta(days=days) / REPORT_EVERY)
    with engine.begin() as connection:
        connection.execute(insert(NodeStatusChange), [
            {"event_id": str(uuid.uuid4()), "cluster_id": "default", "node_id": f"n{n}", "ts": T0,
             "status": "up", "gpu_count": 8, "gpu_model": "L40S"} for n in range(NODES)
        ])  # fmt: skip
        for first in range(0, steps, 500):
            connection.execute(insert(TelemetryEvent), [
                {"event_id": str(uuid.uuid4()), "type": "node.status", "cluster_id": "default",
                 "ts": T0 + s * REPORT_EVERY, "job_id": None, "received_at": T0,
                 "payload": {"node_id": f"n{n}", "gpu_model": "L40S", "gpu_count": 8, "status": "up"}}
                for s in range(first, min(steps, first + 500)) for n in range(NODES)
            ])  # fmt: skip
        for hour in range(24 * days):
            start = T0 + timedelta(hours=hour)
            connection.execute(insert(ForecastScore), [
                {"forecast_id": hour, "cluster_id": "default", "figure": f"figure{f}", "interval_index": i,
                 "interval_start": start + timedelta(hours=i), "interval_end": start + timedelta(hours=i + 1),
                 "forecast_mean": 1.0, "forecast_p10": 0.5, "forecast_p90": 1.5, "actual": 1.1,
                 "inside": True, "scored_at": start}
                for i in range(24) for f in range(FIGURES)
            ])  # fmt: skip


def pages_in_use(engine: Engine) -> int:
    with engine.connect() as connection:
        count = connection.execute(text("PRAGMA page_count")).scalar_one()
        free = connection.execute(text("PRAGMA freelist_count")).scalar_one()
    return int(count - free)


def rows(engine: Engine) -> int:
    with engine.connect() as connection:
        return sum(
            connection.execute(select(func.count()).select_from(table)).scalar_one()
            for table in (TelemetryEvent, NodeStatusChange, ForecastScore)
        )


class Writer(threading.Thread):
    """What ingest meets meanwhile: a writer on a connection of its own committing one event at a time,
    every 10 ms; `waits` holds how long each commit took."""

    def __init__(self, url: str, ts: datetime) -> None:
        super().__init__(daemon=True)
        self.engine, self.ts = make_engine(url), ts
        self.stop, self.waits = threading.Event(), list[float]()

    def run(self) -> None:
        while not self.stop.wait(0.01):
            row = {"event_id": str(uuid.uuid4()), "type": "node.status", "cluster_id": "default",
                   "ts": self.ts, "job_id": None, "received_at": self.ts, "payload": {}}  # fmt: skip
            started = time.perf_counter()
            with self.engine.begin() as connection:
                connection.execute(insert(TelemetryEvent), [row])
            self.waits.append(time.perf_counter() - started)

    def __enter__(self) -> Writer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.join()
        self.engine.dispose()


def naive_prune(engine: Engine, before: datetime) -> float:
    """A DELETE per table in one transaction: the whole prune under the write lock. (Every node has one
    change, at the start, which both keep.)"""
    events, jobs, scores = (t.__table__ for t in (TelemetryEvent, Job, ForecastScore))  # type: ignore[attr-defined]
    ended = select(jobs.c.job_id).where(jobs.c.ended_at < before)
    midnight = datetime.combine(before.date(), day_time(), tzinfo=UTC)
    started = time.perf_counter()
    with engine.begin() as connection:
        connection.execute(delete(events).where(
            events.c.ts < before, or_(events.c.type == "node.status", events.c.job_id.in_(ended))
        ))  # fmt: skip
        connection.execute(delete(scores).where(scores.c.interval_start < midnight))
    return time.perf_counter() - started


class TwoStores:
    """A store and a copy of it, the prune's and the baseline's: SQLite files in a temporary directory, or
    two databases beside `--database-url`'s (the copy by CREATE DATABASE ... TEMPLATE), dropped after."""

    def __init__(self, database_url: str | None) -> None:
        self.admin = database_url
        self.work = Path(tempfile.mkdtemp(prefix="bench-retention-"))
        self.names = ("finetwin_bench_retention", "finetwin_bench_retention_copy")

    def url(self, copy: bool = False) -> str:
        if self.admin is None:
            return f"sqlite:///{self.work / ('copy.db' if copy else 'store.db')}"
        return str(make_url(normalize_url(self.admin)).set(database=self.names[copy]))

    def _admin(self, *statements: str) -> None:
        import psycopg

        conninfo = make_url(normalize_url(self.admin or "")).set(drivername="postgresql", database="postgres")
        with psycopg.connect(conninfo.render_as_string(hide_password=False), autocommit=True) as connection:
            for statement in statements:
                connection.execute(statement)  # type: ignore[arg-type]

    def create(self) -> None:
        if self.admin is not None:
            self._admin(*(f"DROP DATABASE IF EXISTS {n} WITH (FORCE)" for n in self.names),
                        f"CREATE DATABASE {self.names[0]}")  # fmt: skip

    def copy(self) -> None:
        if self.admin is None:
            shutil.copy(self.work / "store.db", self.work / "copy.db")
        else:
            self._admin(f"CREATE DATABASE {self.names[1]} TEMPLATE {self.names[0]}")

    def drop(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)
        if self.admin is not None:
            self._admin(*(f"DROP DATABASE IF EXISTS {n} WITH (FORCE)" for n in self.names))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--days", type=int, default=60)
    parser.add_argument("--keep-days", type=float, default=30.0)
    parser.add_argument(
        "--database-url", help="a PostgreSQL server to run on (its two databases are dropped)"
    )
    args = parser.parse_args()
    stores = TwoStores(args.database_url)
    sqlite = args.database_url is None
    try:
        stores.create()
        engine = make_engine(stores.url())
        migrate(engine)
        fill(engine, args.days * 2880)
        add_reports_and_scores(engine, args.days)
        if not sqlite:
            analyze(engine)
        engine.dispose()
        stores.copy()
        newest = T0 + timedelta(days=args.days)
        before = newest - timedelta(days=args.keep_days)

        engine = make_engine(stores.url())
        rows_before, pages_before = rows(engine), pages_in_use(engine) if sqlite else 0
        with Writer(stores.url(), newest) as writer:
            started = time.perf_counter()
            pruned = retention.prune(engine, "default", before)
            first = time.perf_counter() - started
        waits = writer.waits
        rows_after, pages_after = rows(engine) - len(waits), pages_in_use(engine) if sqlite else 0
        started = time.perf_counter()
        retention.prune(engine, "default", before + timedelta(hours=1))
        tick = time.perf_counter() - started
        engine.dispose()

        copy = make_engine(stores.url(copy=True))
        with Writer(stores.url(copy=True), newest) as naive_writer:
            naive = naive_prune(copy, before)
        naive_waits = naive_writer.waits
        naive_rows = rows(copy) - len(naive_waits)
        copy.dispose()
        assert naive_rows == rows_after, (naive_rows, rows_after)  # the same rows deleted
    finally:
        stores.drop()
    print(
        f"{args.days} days of telemetry, {rows_before:,} rows of events, node changes and scores; kept "
        f"{args.keep_days:g} days: {pruned.events:,} events and {pruned.scores:,} scores deleted\n"
    )
    table: list[Row] = [
        ("first prune, s", first, naive, "one DELETE per table (a copy of the store)"),
        ("a writer's longest commit meanwhile, s", max(waits), max(naive_waits), "during the DELETEs"),
        (
            "a writer's median commit meanwhile, s",
            statistics.median(waits),
            statistics.median(naive_waits),
            "during the DELETEs",
        ),  # fmt: skip
        ("a tick that finds 1 h more due, s", tick, first, "the first prune"),
        ("rows kept", float(rows_after), float(rows_before), "before the prune"),
    ]
    if sqlite:
        table.append(
            (
                "SQLite pages in use",
                float(pages_after),
                float(pages_before),
                "before (freed pages are reused)",
            )
        )
    print_table(table)


if __name__ == "__main__":
    main()
