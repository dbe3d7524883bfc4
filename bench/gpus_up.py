"""What reading the GPUs up over a window costs (`twin.gpus_up.load_gpus_up`: utilization on record is a share
of them), on a store whose nodes report their status every minute, against folding every report of the
record up to the window's end (what a read that grows with the record costs). The store is written as a
version before `node_status_changes` left it (raw reports and the nodes' rows) and then migrated, which
keeps the reports that change something, as ingest does from then on; the migration's time is printed.

    .venv/bin/python bench/gpus_up.py [--nodes 50] [--days 7] [--database-url URL] [--repeat 3]

Windows end at the record's end, as the standing forecast's scoring and `GET /v1/slos/attainment` read
them. Best of `--repeat`, same machine, one run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import Engine, func, insert  # noqa: E402
from sqlmodel import Session, col, select  # noqa: E402
from timing import Row, analyze, best_of, print_table  # noqa: E402

from finetwin.schema import migrate  # noqa: E402
from twin.db import make_engine  # noqa: E402
from twin.gpus_up import NodeReport, gpus_up_from_reports, load_gpus_up  # noqa: E402
from twin.store import NODE_STATUS_ONLY, Node, NodeStatusChange, TelemetryEvent  # noqa: E402

START = datetime(2025, 1, 1, tzinfo=UTC)
MODEL = "NVIDIA-A100-SXM4-80GB"


def fill(engine: Engine, nodes: int, days: int) -> datetime:
    """Every node up, reporting so every minute (a node down for an hour each day), written directly; the
    nodes' rows as ingest leaves them. Returns the record's end."""
    minutes = days * 24 * 60
    end = START + timedelta(minutes=minutes)
    with engine.begin() as connection:
        for first in range(0, minutes, 1_000):
            rows = []
            for minute in range(first, min(first + 1_000, minutes)):
                ts = START + timedelta(minutes=minute)
                for node in range(nodes):
                    down = (minute + 60 * node) % 1_440 < 60
                    payload = {"node_id": f"n{node:04d}", "gpu_model": MODEL, "gpu_count": 8,
                               "status": "down" if down else "up"}  # fmt: skip
                    rows.append({"event_id": str(uuid.uuid4()), "type": "node.status", "ts": ts,
                                 "cluster_id": "default", "job_id": None, "payload": payload,
                                 "received_at": ts})  # fmt: skip
            connection.execute(insert(TelemetryEvent), rows)
        last = end - timedelta(minutes=1)
        connection.execute(insert(Node), [
            {"node_id": f"n{node:04d}", "cluster_id": "default", "gpu_model": MODEL, "gpu_count": 8,
             "status": "down" if (minutes - 1 + 60 * node) % 1_440 < 60 else "up", "updated_at": last}
            for node in range(nodes)
        ])  # fmt: skip
    analyze(engine)
    return end


def fold_the_record(engine: Engine, origin: datetime, until: datetime) -> None:
    """The baseline: every report up to the window's end, read and folded."""
    with Session(engine) as session:
        rows = session.exec(
            select(TelemetryEvent.ts, TelemetryEvent.payload)
            .where(TelemetryEvent.cluster_id == "default", NODE_STATUS_ONLY, col(TelemetryEvent.ts) < until)
            .order_by(col(TelemetryEvent.ts))
        ).all()
    reports = [NodeReport(p["node_id"], ts, p["status"], p["gpu_count"], p["gpu_model"]) for ts, p in rows]
    gpus_up_from_reports(reports, origin)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--database-url", default=None, help="an empty database (default: SQLite)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        engine = make_engine(args.database_url or f"sqlite:///{Path(directory) / 'store.db'}")
        migrate(engine, "0013")
        end = fill(engine, args.nodes, args.days)
        started = time.perf_counter()
        migrate(engine)
        migrated_s = time.perf_counter() - started
        analyze(engine)
        reports = args.nodes * args.days * 1_440
        with Session(engine) as session:
            kept = session.exec(select(func.count()).select_from(NodeStatusChange)).one()
        print(f"{args.nodes} nodes reporting every minute for {args.days} days: {reports:,} reports "
              f"({kept:,} change something), {engine.dialect.name}; "
              f"migrating them took {migrated_s:.1f} s")  # fmt: skip
        table: list[Row] = []
        for label, width in (("an hour", timedelta(hours=1)), ("a day", timedelta(days=1)),
                             ("a week", timedelta(days=7))):  # fmt: skip
            origin = end - width

            def window(origin: datetime = origin) -> None:
                with Session(engine) as session:
                    load_gpus_up(session, "default", origin, end)

            baseline = best_of(1, lambda origin=origin: fold_the_record(engine, origin, end))
            table.append((f"GPUs up over {label} (s)", best_of(args.repeat, window), baseline,
                          "folding every report of the record"))  # fmt: skip
        engine.dispose()
    print_table(table)


if __name__ == "__main__":
    main()
