"""The GPUs that were up over time, from the nodes' status reports: what utilization as it happened is a share
of. A node that went down for an hour served nothing that hour, and one added today served nothing
yesterday; judging the past against the nodes up now reads both wrong (a day's utilization over 100 %
after a node left for good).

A node's status at time t is its latest report dated at or before t, by the store's rule for two reports at
one time (`twin.rebuild.fold_node`); its GPUs count while that status is `up` (a draining node takes no new
job, and a forecast does not count its GPUs either: `twin.cluster.Cluster.total_gpus`). Before a cluster's
first report no GPU of it is known to be up.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlmodel import Session, col, select

from twin.clock import as_utc
from twin.domain import canonical_gpu_name
from twin.rebuild import fold_node
from twin.store import NODE_STATUS_ONLY, Node, TelemetryEvent

NodeReport = tuple[datetime, Mapping[str, Any]]  # event time, `node.status` payload


@dataclass(frozen=True)
class GpusUp:
    """Per GPU type, a step function of seconds from `origin`: from `at[k]` on, `gpus[k]` GPUs are up (none
    before `at[0]`). Every type up at some time is a key, with its zeros."""

    origin: datetime
    steps: dict[str, tuple[np.ndarray, np.ndarray]]

    @classmethod
    def constant(cls, origin: datetime, gpus_by_type: Mapping[str, int]) -> GpusUp:
        """These GPUs up at every time: what a store without node reports knows (its `nodes` table)."""
        return cls(
            origin,
            {
                name: (np.array([-np.inf]), np.array([float(gpus)]))
                for name, gpus in gpus_by_type.items()
                if gpus
            },
        )

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


def gpus_up_from_reports(reports: Iterable[NodeReport], cluster_id: str, origin: datetime) -> GpusUp:
    """The GPUs up over time by these reports (any order), as seconds from `origin`."""
    origin = as_utc(origin)
    nodes: dict[str, Node] = {}
    up: Counter[str] = Counter()  # GPUs up by type after each report, kept as reports come
    times: list[float] = []
    totals: list[dict[str, int]] = []
    for ts, payload in sorted(((as_utc(ts), p) for ts, p in reports), key=lambda r: r[0]):
        node_id = str(payload["node_id"])
        up.subtract(_serving(nodes.get(node_id)))
        fold_node(nodes, cluster_id, ts, payload)
        up.update(_serving(nodes[node_id]))
        # Of reports of one instant, the state after the last counts: `_integral` takes the last of equal
        # times, and the others hold for no time.
        times.append((ts - origin).total_seconds())
        totals.append(dict(up))
    names = sorted({name for total in totals for name, gpus in total.items() if gpus})
    at = np.array(times, dtype=float)
    return GpusUp(
        origin,
        {name: (at, np.array([total.get(name, 0) for total in totals], dtype=float)) for name in names},
    )


def _serving(node: Node | None) -> Counter[str]:
    """The node's GPUs by type if it is up, else none."""
    if node is None or node.status != "up":
        return Counter()
    return Counter({canonical_gpu_name(node.gpu_model): int(node.gpu_count)})


def load_gpus_up(session: Session, cluster_id: str, origin: datetime, until: datetime) -> GpusUp:
    """The cluster's GPUs up over time, from its node reports dated before `until`; from its `nodes` table,
    as constant, when it has no report (a store filled without them)."""
    reports = session.exec(
        select(TelemetryEvent.ts, TelemetryEvent.payload)
        .where(
            TelemetryEvent.cluster_id == cluster_id, NODE_STATUS_ONLY, col(TelemetryEvent.ts) < as_utc(until)
        )
        .order_by(col(TelemetryEvent.ts))
    ).all()
    if reports:
        return gpus_up_from_reports(reports, cluster_id, origin)
    nodes = session.exec(select(Node).where(Node.cluster_id == cluster_id)).all()
    return GpusUp.constant(as_utc(origin), sum((_serving(node) for node in nodes), Counter()))
