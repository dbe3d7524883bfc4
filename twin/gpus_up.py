"""The GPUs that were up over time, from the nodes' status reports: what utilization as it happened is a share
of. A node that went down for an hour served nothing that hour, and one added today served nothing
yesterday; judging the past against the nodes up now reads both wrong (a day's utilization over 100 %
after a node left for good).

A node's status at time t is its latest report dated at or before t, of two reports at one time the larger
(status, GPUs, model), as the store keeps it (`ingest.apply`, `twin.rebuild`); its GPUs count
while that status is `up` (a draining node takes no new job, and a forecast does not count its GPUs either:
`twin.cluster.Cluster.total_gpus`). Before a node's first report none of its GPUs is known to be up.

What is read is bounded by the window's changes, not by the record: of the reports, only those that change
a node's state are read (`twin.store.NodeStatusChange`: a node reporting every minute as a heartbeat
changes state a few times a day); of them, those dated in the window, and, for the nodes that reported
since the window began, each one's latest before it (a backward scan that stops once it has them all). A
node whose row says it last reported before the window stood so through it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import numpy as np
from sqlmodel import Session, col, select

from twin.clock import as_utc
from twin.domain import canonical_gpu_name
from twin.store import Node, NodeStatusChange


class NodeReport(NamedTuple):
    """A `node.status` report. Its fields from `ts` on are the store's order of two reports of one node."""

    node_id: str
    ts: datetime
    status: str
    gpu_count: int
    gpu_model: str

    @property
    def key(self) -> tuple[datetime, str, int, str]:
        return (self.ts, *self.state)

    @property
    def state(self) -> tuple[str, int, str]:
        return (self.status, self.gpu_count, self.gpu_model)


@dataclass(frozen=True)
class GpusUp:
    """Per GPU type, a step function of seconds from `origin`: from `at[k]` on, `gpus[k]` GPUs are up (none
    before `at[0]`). Every type up at some time is a key, with its zeros."""

    origin: datetime
    steps: dict[str, tuple[np.ndarray, np.ndarray]]

    def seconds_up(self, edges_s: Sequence[float] | np.ndarray) -> dict[str, np.ndarray]:
        """Per type, the GPU-seconds up in each interval between `edges_s` (seconds from `origin`)."""
        edges = np.asarray(edges_s, dtype=float)
        return {name: np.diff(_integral(at, gpus, edges)) for name, (at, gpus) in self.steps.items()}


def _integral(at: np.ndarray, gpus: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The step function's integral from its first step to each `x` (0 before it)."""
    # Only differences of the integral count, so a step from -inf (a constant) may start at any time before
    # every x and the next step.
    start = at[0] if np.isfinite(at[0]) else min(float(x.min(initial=0.0)), float(at[1:].min(initial=0.0)))
    at = np.concatenate(([start], at[1:]))
    before = np.concatenate(([0.0], np.cumsum(gpus[:-1] * np.diff(at))))
    step = np.searchsorted(at, x, side="right") - 1
    k = np.maximum(step, 0)
    return np.where(step >= 0, before[k] + gpus[k] * (x - at[k]), 0.0)


def gpus_up_from_reports(
    reports: Iterable[NodeReport], origin: datetime, before: Mapping[str, NodeReport] | None = None
) -> GpusUp:
    """The GPUs up over time by these reports (any order), as seconds from `origin`; `before`: each node's
    state before them (from any earlier time)."""
    origin = as_utc(origin)
    nodes: dict[str, NodeReport] = dict(before or {})
    up: Counter[str] = Counter()  # GPUs up by type, kept as reports come
    for node in nodes.values():
        up.update(_serving(node))
    times: list[float] = [-np.inf] if nodes else []
    totals: list[dict[str, int]] = [dict(up)] if nodes else []
    for report in sorted(reports, key=lambda r: r.ts):
        known = nodes.get(report.node_id)
        if known is not None and report.key < known.key:
            continue  # the store keeps the larger of two reports of one time
        nodes[report.node_id] = report
        if known is not None and known.state == report.state:
            continue  # the same status, GPUs and model (a heartbeat): no step
        was, now = _serving(known), _serving(report)
        up.subtract(was)
        up.update(now)
        # Of reports of one instant, the state after the last counts: `_integral` takes the last of equal
        # times, and the others hold for no time.
        times.append((as_utc(report.ts) - origin).total_seconds())
        totals.append(dict(up))
    names = sorted({name for total in totals for name, gpus in total.items() if gpus})
    at = np.array(times, dtype=float)
    return GpusUp(
        origin,
        {name: (at, np.array([total.get(name, 0) for total in totals], dtype=float)) for name in names},
    )


def _serving(node: NodeReport | None) -> Counter[str]:
    """The node's GPUs by type if it is up, else none."""
    if node is None or node.status != "up":
        return Counter()
    return Counter({canonical_gpu_name(node.gpu_model): int(node.gpu_count)})


def load_gpus_up(session: Session, cluster_id: str, origin: datetime, until: datetime) -> GpusUp:
    """The cluster's GPUs up over time from `origin` to `until`, from its nodes' reports (its `nodes` table
    for a node stored without any, as some tests write them)."""
    origin, until = as_utc(origin), as_utc(until)
    rows = session.exec(select(Node).where(Node.cluster_id == cluster_id)).all()
    window = list(
        _scan(session, cluster_id, col(NodeStatusChange.ts) >= origin, col(NodeStatusChange.ts) < until)
    )
    # A row is its node's latest report: one dated before the window says the node stood so through it.
    before = {row.node_id: _as_report(row) for row in rows if as_utc(row.updated_at) < origin}
    since = {row.node_id for row in rows} - before.keys()
    before |= _latest(session, cluster_id, since, col(NodeStatusChange.ts) < origin, newest=True)
    unknown = since - before.keys() - {report.node_id for report in window}
    if unknown:  # no report before the window nor in it: reported after it, or never (its row is all)
        later = _latest(session, cluster_id, unknown, col(NodeStatusChange.ts) >= until, newest=False)
        before |= {row.node_id: _as_report(row) for row in rows if row.node_id in unknown - later.keys()}
    return gpus_up_from_reports(window, origin, before)


def _as_report(row: Node) -> NodeReport:
    return NodeReport(row.node_id, as_utc(row.updated_at), row.status, int(row.gpu_count), row.gpu_model)


_FIELDS = (
    NodeStatusChange.node_id,
    NodeStatusChange.ts,
    NodeStatusChange.status,
    NodeStatusChange.gpu_count,
    NodeStatusChange.gpu_model,
)


def _scan(
    session: Session, cluster_id: str, *conditions: Any, newest_first: bool = False
) -> Iterator[NodeReport]:
    """The cluster's node reports that change something (`twin.store.NodeStatusChange`) under
    `conditions`, oldest first (or newest), a batch at a time."""
    order = col(NodeStatusChange.ts).desc() if newest_first else col(NodeStatusChange.ts)
    query = (
        select(*_FIELDS)
        .where(NodeStatusChange.cluster_id == cluster_id, *conditions)
        .order_by(order)
        .execution_options(yield_per=2_000)
    )
    result = session.exec(query)  # type: ignore[call-overload]
    try:
        for node_id, ts, status, gpus, model in result:
            yield NodeReport(str(node_id), as_utc(ts), str(status), int(gpus), str(model))
    finally:
        result.close()


def _latest(
    session: Session, cluster_id: str, wanted: Collection[str], *conditions: Any, newest: bool
) -> dict[str, NodeReport]:
    """Of each wanted node, its report nearest the scan's start under `conditions`: the newest (`newest`)
    or the oldest; of two at that time, the larger. The scan stops once every wanted node is found and the
    time has moved past the last one found, so a backward scan from a window's start reads about one
    report per node where nodes report often."""
    found: dict[str, NodeReport] = {}
    if not wanted:
        return found
    last_found: datetime | None = None
    with closing(_scan(session, cluster_id, *conditions, newest_first=newest)) as scan:
        for report in scan:
            if len(found) == len(wanted) and report.ts != last_found:
                break
            if report.node_id not in wanted:
                continue
            known = found.get(report.node_id)
            if known is None:
                found[report.node_id] = report
                last_found = report.ts
            elif report.ts == known.ts and report.key > known.key:
                found[report.node_id] = report
    return found
