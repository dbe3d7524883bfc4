"""Keeps `node_status_changes` (`twin.store.NodeStatusChange`): of the nodes' status reports, those that
change something, written in the transaction that stores them.

A report that comes after every stored report of its node (the usual case) is kept only if its status, GPUs
or model differ from the node's latest report: the node's row holds that one, as long as the row's report
is the latest (`nodes.updated_at == nodes.last_report_at`). A report that arrived late, or one whose node's
row is not its latest report, is kept whatever it says, and so is the report that follows it: that one
may now change something it did not. Kept that way, every report left out says what the kept report
before it says, which is all a reader needs (`twin.gpus_up`): the table may hold a few reports that change
nothing, never miss one that does.

The nodes' rows are read FOR UPDATE (PostgreSQL), in one order, so two workers with reports of one node
decide one after the other; the node row upsert that follows takes the same locks.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Connection, Table, select
from sqlalchemy.dialects import postgresql, sqlite

from ingest.bulk import select_locked
from twin.clock import as_utc
from twin.gpus_up import NodeReport
from twin.store import NODE_STATUS_ONLY, Node, NodeStatusChange, TelemetryEvent

NODES: Table = Node.__table__  # type: ignore[attr-defined]
CHANGES: Table = NodeStatusChange.__table__  # type: ignore[attr-defined]
EVENTS: Table = TelemetryEvent.__table__  # type: ignore[attr-defined]


class Report(NamedTuple):
    """A stored node report: which event it is, in which cluster, and what it says (`node`, whose `key` is
    the store's order of one node's reports)."""

    event_id: str
    cluster_id: str
    node: NodeReport  # its time in UTC

    def row(self) -> dict[str, Any]:
        """Its row of `node_status_changes`."""
        return {"event_id": self.event_id, "cluster_id": self.cluster_id, **self.node._asdict()}


class _Head(NamedTuple):
    """What is known of a node's latest stored report."""

    ts: datetime | None  # its time; None: no report stored
    state: tuple[str, int, str] | None  # None: not known
    cluster_id: str | None


_NOTHING_STORED = _Head(None, None, None)


def record_changes(connection: Connection, reports: Sequence[Report]) -> None:
    """Keep the changes among `reports`, which this transaction stored in `telemetry_events` already and
    whose nodes' rows it has not updated yet (it does next, `last_report_at` with them)."""
    by_node: dict[str, list[Report]] = {}
    for report in reports:
        by_node.setdefault(report.node.node_id, []).append(report)
    heads = _lock_heads(connection, sorted(by_node))
    kept: dict[str, Report] = {}
    for node_id, own in by_node.items():
        head = heads.get(node_id, _NOTHING_STORED)
        for report in sorted(own, key=lambda r: r.node.key):
            node = report.node
            if _after_all(report, head):
                if head.state is None or head.cluster_id != report.cluster_id or node.state != head.state:
                    kept[report.event_id] = report
                head = _Head(node.ts, node.state, report.cluster_id)
            else:  # late: it is kept, and so is the report after it, which may now change what it did not
                kept[report.event_id] = report
                following = _next_report(connection, report)
                if following is not None:
                    kept[following.event_id] = following
    if kept:
        rows = [r.row() for r in sorted(kept.values(), key=lambda r: r.event_id)]
        dialect = postgresql if connection.dialect.name == "postgresql" else sqlite
        connection.execute(dialect.insert(CHANGES).on_conflict_do_nothing(index_elements=["event_id"]), rows)


def _after_all(report: Report, head: _Head) -> bool:
    """Whether `report` comes after every stored report of its node, or is the latest one again (as far as
    `head` tells)."""
    ts = report.node.ts
    if head.ts is None or ts > head.ts:
        return True
    # Of one time, the larger comes after: known only while the head's state is.
    return ts == head.ts and head.state is not None and report.node.state >= head.state


def _lock_heads(connection: Connection, node_ids: list[str]) -> dict[str, _Head]:
    columns = (NODES.c.node_id, NODES.c.cluster_id, NODES.c.status, NODES.c.gpu_count, NODES.c.gpu_model,
               NODES.c.updated_at, NODES.c.last_report_at)  # fmt: skip
    heads: dict[str, _Head] = {}
    for row in select_locked(connection, columns, NODES.c.node_id, node_ids):
        node_id, cluster_id, status, gpus, model, updated_at, last_report_at = row
        if last_report_at is None:  # a row written without telemetry: no report stored
            heads[node_id] = _Head(None, None, cluster_id)
            continue
        latest = as_utc(last_report_at)
        row_is_latest = as_utc(updated_at) == latest
        heads[node_id] = _Head(latest, (status, int(gpus), model) if row_is_latest else None, cluster_id)
    return heads


# The report after a given one, of its node: the partial index of the nodes' reports read forward from its
# time (its condition written into the SQL so that SQLite keeps to that index), each report's fields read
# out of the payload by the database.
_FIELDS = (
    EVENTS.c.event_id,
    EVENTS.c.cluster_id,
    EVENTS.c.payload["node_id"].as_string(),
    EVENTS.c.ts,
    EVENTS.c.payload["status"].as_string(),
    EVENTS.c.payload["gpu_count"].as_integer(),
    EVENTS.c.payload["gpu_model"].as_string(),
)


def _next_report(connection: Connection, report: Report) -> Report | None:
    """Of the node's stored reports in the report's cluster, the first after it in the store's order."""
    query = (
        select(*_FIELDS)
        .where(EVENTS.c.cluster_id == report.cluster_id, NODE_STATUS_ONLY, EVENTS.c.ts >= report.node.ts)
        .order_by(EVENTS.c.ts)
        .execution_options(yield_per=500)
    )
    result = connection.execute(query)
    first: Report | None = None
    try:
        for event_id, cluster_id, node_id, ts, status, gpus, model in result:
            when = as_utc(ts)
            if first is not None and when > first.node.ts:
                break  # past the time of the first one found: of that time, `first` is the smallest after it
            if node_id != report.node.node_id:
                continue
            found = NodeReport(node_id, when, status, int(gpus), model)
            if found.key > report.node.key and (first is None or found.key < first.node.key):
                first = Report(str(event_id), cluster_id, found)
    finally:
        result.close()
    return first
