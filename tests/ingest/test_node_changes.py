"""Ingest keeps the nodes' reports that change something (`ingest.node_changes`), which the GPUs up over time
read (`twin.gpus_up`): heartbeats left out, late reports and redeliveries handled, and a store migrated
from before the table filled from the reports it has."""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from sqlalchemy import Engine, insert, select, text
from sqlmodel import Session

from finetwin.schema import migrate
from ingest.apply import apply_batch, apply_events
from ingest.events import Event, NodeStatus, new_event
from tests.conftest import wait_for
from tests.twin.gpus_up_checks import assert_window_reads_as_every_report_folded
from twin.clock import as_utc
from twin.db import make_engine
from twin.gpus_up import NodeReport
from twin.store import Node, NodeStatusChange, TelemetryEvent

T0 = datetime(2025, 3, 1, tzinfo=UTC)
A100, L40S = "NVIDIA-A100-SXM4-80GB", "L40S"


def heartbeats(seed: int, nodes: int = 5, minutes: int = 24 * 60) -> list[Event]:
    """Nodes that report every 10 minutes whether anything changed, rarely changing status (or, once in a
    while, GPUs), with now and then two reports of one instant."""
    rng = random.Random(seed)
    events = []
    for k in range(nodes):
        model, gpus = (A100, 8) if k % 2 else (L40S, 4)
        status = "up"
        for minute in range(rng.randrange(10), minutes, 10):
            if rng.random() < 0.08:
                status = rng.choice(["up", "down", "drain"])
            count = gpus - 1 if rng.random() < 0.02 else gpus
            ts = T0 + timedelta(minutes=minute)
            events.append(node_event(f"n{k}", model, count, status, ts))
            if rng.random() < 0.03:  # another report of the same instant
                events.append(node_event(f"n{k}", model, gpus, rng.choice(["up", "down"]), ts))
    return events


def node_event(node_id: str, model: str, gpus: int, status: str, ts: datetime) -> Event:
    payload = NodeStatus(node_id=node_id, gpu_model=model, gpu_count=gpus, status=status)  # type: ignore[arg-type]
    return new_event("node.status", payload, job_id=None, ts=ts)


def as_report(event: Event) -> NodeReport:
    p = event.payload
    return NodeReport(p.node_id, event.ts, p.status, p.gpu_count, p.gpu_model)  # type: ignore[union-attr]


Key = tuple[str, datetime, str, int, str]  # a report's node and its place in the store's order


def key(event: Event) -> Key:
    return tuple(as_report(event))  # type: ignore[return-value]


def changes_in_order(events: Sequence[Event]) -> set[Key]:
    """The reports whose state differs from their node's report before them, in the store's order of a
    node's reports (time, then status, GPUs, model). Two reports alike are one here: which of them is kept
    makes no difference."""
    kept, previous = set(), {}
    for report in sorted(map(as_report, events), key=lambda r: r[1:]):
        if previous.get(report.node_id) != report[2:]:
            kept.add(tuple(report))
        previous[report.node_id] = report[2:]
    return kept  # type: ignore[return-value]


def stored_changes(engine: Engine, events: Sequence[Event]) -> list[Key]:
    """The reports kept, one entry each."""
    by_id = {str(e.event_id): key(e) for e in events}
    with Session(engine) as session:
        return [
            by_id[str(event_id)] for event_id in session.execute(select(NodeStatusChange.event_id)).scalars()
        ]


@pytest.mark.parametrize("seed", [0, 1])
def test_reports_that_come_in_order_keep_exactly_the_changes(engine: Engine, seed: int) -> None:
    events = heartbeats(seed)
    ordered = sorted(events, key=lambda e: as_report(e)[1:])
    for start in range(0, len(ordered), 7):  # batches as a consumer takes them
        apply_events(engine, ordered[start : start + 7])
    kept = stored_changes(engine, events)
    assert sorted(kept) == sorted(changes_in_order(events))  # each change once, and nothing else
    assert len(kept) < len(events) / 5  # mostly heartbeats: what the table is for


def assert_reads_as_every_report_folded(engine: Engine, events: Sequence[Event], seed: int) -> None:
    reports = [as_report(e) for e in events]
    rng = np.random.default_rng(seed)
    for _ in range(8):
        start, length = float(rng.uniform(-3, 26)), float(rng.uniform(0.2, 20))
        origin = T0 + timedelta(hours=start)
        assert_window_reads_as_every_report_folded(engine, reports, origin, origin + timedelta(hours=length))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reports_in_any_order_and_redelivered_read_as_every_report_folded(engine: Engine, seed: int) -> None:
    """Late reports, reports of one instant split across batches, and redeliveries: the table may keep more
    than the changes, and the GPUs up read from it are still those of every report folded."""
    events = heartbeats(seed)
    rng = random.Random(seed)
    # Mostly in order, with a share of the reports held back and delivered late, some twice.
    late = [e for e in events if rng.random() < 0.15]
    on_time = [e for e in events if e not in late]
    on_time.sort(key=lambda e: e.ts)
    delivery = on_time + rng.sample(late, len(late)) + rng.sample(events, 20)
    at = 0
    while at < len(delivery):
        size = rng.randrange(1, 40)
        apply_events(engine, delivery[at : at + size])
        at += size
    kept = stored_changes(engine, events)
    assert changes_in_order(events) <= set(kept)  # never one missing
    assert len(kept) < len(events) / 2
    assert_reads_as_every_report_folded(engine, events, seed)


def test_a_node_row_written_without_telemetry_then_reporting(engine: Engine) -> None:
    """A row with no report behind it says nothing of the reports: the first one is kept whatever it says."""
    with Session(engine) as session:
        session.add(Node(node_id="n0", cluster_id="default", gpu_model=L40S, gpu_count=4, status="up",
                         updated_at=T0 - timedelta(days=1)))  # fmt: skip
        session.commit()
    events = [node_event("n0", L40S, 4, "up", T0 + timedelta(minutes=m)) for m in range(0, 60, 10)]
    for event in events:
        apply_events(engine, [event])
    assert stored_changes(engine, events) == [key(events[0])]
    with Session(engine) as session:
        row = session.get(Node, "n0")
        assert row is not None and row.last_report_at is not None
        assert as_utc(row.last_report_at) == events[-1].ts


def test_a_store_from_before_the_table_is_filled_from_its_reports(database_url: str) -> None:
    """Reports stored by a version before 0014 (raw events and the nodes' rows only): migrating keeps
    exactly their changes and each node's latest report time."""
    engine = make_engine(database_url)
    migrate(engine, "0013")
    events = heartbeats(3, nodes=3, minutes=24 * 60)
    with engine.begin() as connection:
        connection.execute(insert(TelemetryEvent), [
            {"event_id": str(e.event_id), "type": "node.status", "ts": e.ts, "cluster_id": "default",
             "job_id": None, "payload": e.payload.model_dump(), "received_at": e.ts}
            for e in events
        ])  # fmt: skip
        latest = {}  # each node's row as ingest left it: its latest report
        for report in sorted(map(as_report, events), key=lambda r: r[1:]):
            latest[report.node_id] = report
        connection.execute(
            Node.__table__.insert(),  # type: ignore[attr-defined]
            [{"node_id": r.node_id, "cluster_id": "default", "gpu_model": r.gpu_model,
              "gpu_count": r.gpu_count, "status": r.status, "updated_at": r.ts} for r in latest.values()],
        )  # fmt: skip
    migrate(engine)
    assert sorted(stored_changes(engine, events)) == sorted(changes_in_order(events))
    with Session(engine) as session:
        for row in session.execute(select(Node)).scalars():
            newest = max(e.ts for e in events if e.payload.node_id == row.node_id)  # type: ignore[union-attr]
            assert row.last_report_at is not None and as_utc(row.last_report_at) == newest
    assert_reads_as_every_report_folded(engine, events, 3)
    engine.dispose()


def test_two_writers_with_reports_of_one_node_decide_one_after_the_other(postgres_url: str) -> None:
    """PostgreSQL: a worker's batch holds the node's row until it commits, so another worker's later report
    is judged against it (up after down: a change), not against the state both saw before."""
    engine = make_engine(postgres_url)
    migrate(engine)
    first_report = node_event("n0", A100, 8, "up", T0)
    apply_events(engine, [first_report])
    down, up_again = (node_event("n0", A100, 8, status, T0 + timedelta(minutes=m))
                      for status, m in (("down", 10), ("up", 20)))  # fmt: skip
    with engine.connect() as first:
        transaction = first.begin()
        apply_batch(first, [down])
        second = threading.Thread(target=apply_events, args=(engine, [up_again]))
        second.start()
        wait_for(lambda: waiting_on_a_lock(engine), 30, "the second writer to wait for the first")
        transaction.commit()
    second.join(30)
    assert not second.is_alive()
    assert sorted(stored_changes(engine, [first_report, down, up_again])) == [
        key(first_report),
        key(down),
        key(up_again),
    ]
    engine.dispose()


def waiting_on_a_lock(engine: Engine) -> bool:
    with engine.connect() as connection:
        query = text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        )
        return connection.execute(query).scalar_one() > 0
