"""Benchmark rows to telemetry: each row becomes the life of one job on a simulated cluster of 8-GPU nodes.

`plan_replay` turns a benchmark table (from `calibrate.loader.load_benchmark`) into a time-ordered list of
events; `send_replay` sends them to the bus, optionally paced in compressed simulated time.

- The cluster: for each GPU model in the file, enough 8-GPU nodes for its largest job and for its share of
  the work at ~70 % utilization; a `node.status` (up) for each node comes first.
- Arrivals: a seeded Poisson process (exponential gaps); rows arrive in a seeded random order.
- Each job: `job.submitted` (its configuration), then `job.rejected` (the rule it broke), or `job.started`
  (placement by a simple list scheduler) → `job.progress`… → `job.completed` with the row's measured columns,
  or `job.started` → `job.failed` (`oom`) a plausible time into the run.

Everything derives from the seed (arrival times, the event ids), so a seed replays identically relative to
its epoch: the time its timeline starts. `finetwin replay` and `up` anchor it at the moment they start (the
twin's clock is the telemetry's, so a replay is "now" for the twin); `--epoch` pins it for reproducible
runs, and the library's default is a fixed date derived from the seed.
Job ids are `<prefix><line>` — the row's line in the file — so every job can be traced back to its row.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd

from ingest.bus import BusProducer
from ingest.events import (
    MEASURED_FIELDS,
    Event,
    JobCompleted,
    JobFailed,
    JobProgress,
    JobRejected,
    JobStarted,
    JobSubmitted,
    NodeStatus,
    new_event,
)
from twin.domain import GPUS_PER_NODE, Rule, gpu_type, model_params_b
from twin.job_config import CONFIG_FIELDS, DESCRIPTOR_FIELDS

REPLAY_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://finetwin/replay")
# Nodes are sized for this utilization: jobs mostly start within minutes (measured on the sample), as
# multi-hour runs and whole-cluster 32-GPU jobs fragment a busier cluster into hours-long queues.
TARGET_UTILIZATION = 0.35
SCHEDULING_LATENCY_S = 5.0  # mean delay between submission and start on an idle cluster
BASE_EPOCH = datetime(2025, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    events: list[tuple[float, Event]]  # (simulated seconds since the epoch, event), in time order
    epoch: datetime
    jobs: int
    nodes: dict[str, str] = field(default_factory=dict)  # node id -> GPU model

    @property
    def duration_s(self) -> float:
        return self.events[-1][0] if self.events else 0.0


def default_job_prefix(seed: int) -> str:
    return f"replay-{seed}-"


def plan_replay(
    table: pd.DataFrame, *, seed: int = 0, job_prefix: str | None = None, mean_interarrival_s: float = 60.0,
    cluster_id: str = "default", epoch: datetime | None = None,
    target_utilization: float = TARGET_UTILIZATION,
) -> ReplayPlan:  # fmt: skip
    """The telemetry of every row of a benchmark table, in simulated time order, dated from `epoch`
    (default: a fixed date derived from the seed)."""
    if mean_interarrival_s <= 0:
        raise ValueError("mean_interarrival_s must be positive")
    prefix = default_job_prefix(seed) if job_prefix is None else job_prefix
    rng = np.random.default_rng(seed)
    if epoch is None:
        epoch = BASE_EPOCH + timedelta(hours=seed % (24 * 365))
    elif epoch.tzinfo is None:
        raise ValueError("the replay's epoch needs a time zone (e.g. 2025-01-01T00:00:00Z)")
    namespace = uuid.uuid5(REPLAY_NAMESPACE, f"{seed}/{prefix}")
    rows = table.to_dict("records")
    order = rng.permutation(len(rows))
    arrivals = 1.0 + np.cumsum(rng.exponential(mean_interarrival_s, len(rows)))
    latencies = rng.exponential(SCHEDULING_LATENCY_S, len(rows))
    uniforms = rng.random((len(rows), 2))

    def make(kind: str, payload: Any, at: float, job_id: str | None, n: int = 0) -> tuple[float, Event]:
        event_id = uuid.uuid5(namespace, f"{job_id}/{kind}/{n}")
        ts = epoch + timedelta(seconds=float(at))
        return at, new_event(kind, payload, job_id=job_id, ts=ts, cluster_id=cluster_id, event_id=event_id)

    durations = {i: _run_seconds(rows[i], uniforms[i, 0]) for i in range(len(rows))}
    span = float(arrivals[-1]) if len(rows) else 1.0
    if not 0 < target_utilization <= 1:
        raise ValueError(f"target_utilization must be in (0, 1], got {target_utilization}")
    cluster = _Cluster.sized_for(
        ((rows[i], d) for i, d in durations.items() if d is not None), span, target_utilization
    )
    events: list[tuple[float, Event]] = [
        make("node.status", NodeStatus(node_id=node_id, gpu_model=gpu, gpu_count=GPUS_PER_NODE, status="up"),
             0.0, None, k)
        for k, (node_id, gpu) in enumerate(cluster.node_models.items())
    ]  # fmt: skip
    for position, index in enumerate(order):
        row = rows[index]
        job_id = f"{prefix}{int(row['line'])}"
        arrival = float(arrivals[position])
        try:
            events.append(make("job.submitted", _submitted(row), arrival, job_id))
            duration = durations[index]
            if row["outcome"] == "rejected":
                rejected = JobRejected(rule=Rule(row["rule"]))
                events.append(make("job.rejected", rejected, arrival + 0.1 + uniforms[index, 1], job_id))
                continue
            assert duration is not None
            start, node_ids = cluster.place(row, arrival + float(latencies[position]), duration)
            events.append(make("job.started", JobStarted(node_ids=node_ids), start, job_id))
            if row["outcome"] == "valid":
                events.extend(
                    make("job.progress", p, start + at, job_id, n) for n, (at, p) in enumerate(_progress(row))
                )
                events.append(make("job.completed", _completed(row), start + duration, job_id))
            else:
                failed = JobFailed(reason="oom", seconds_into_run=round(duration, 3))
                events.append(make("job.failed", failed, start + duration, job_id))
        except ValueError as exc:  # a row whose values break the telemetry contract
            raise ValueError(f"benchmark line {int(row['line'])}: cannot turn into telemetry: {exc}") from exc
    events.sort(key=lambda item: item[0])  # stable: a job's events keep their order on equal times
    return ReplayPlan(events=events, epoch=epoch, jobs=len(rows), nodes=dict(cluster.node_models))


def send_replay(
    plan: ReplayPlan | Sequence[tuple[float, Event]], producer: BusProducer, topic: str, *,
    speed: float = 0.0, stop: threading.Event | None = None, progress: Callable[[int], object] | None = None,
) -> int:  # fmt: skip
    """Send the plan's events (key = job id); `speed` > 0 paces them at `speed` simulated seconds per wall
    second, 0 sends as fast as the producer goes. Returns how many were sent (fewer if `stop` was set).
    `progress(n)` hears every 1000 events sent (and the rest at the end): the caller draws the bar."""
    events = plan.events if isinstance(plan, ReplayPlan) else plan
    stop = stop or threading.Event()
    started = time.monotonic()
    sent = 0
    for at, event in events:
        if speed > 0:
            delay = started + at / speed - time.monotonic()
            if delay > 0 and stop.wait(delay):  # pacing is the point here; stop cuts it short
                break
        if stop.is_set():
            break
        producer.send(topic, event.to_json(), event.key.encode())
        sent += 1
        if progress is not None and sent % 1000 == 0:
            progress(1000)
    if progress is not None:
        progress(sent % 1000)
    producer.flush()
    return sent


# --- rows to payloads -------------------------------------------------------------------------------------


def _value(row: dict[str, Any], column: str) -> Any:
    value = row.get(column)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value.item() if isinstance(value, np.generic) else value


def _submitted(row: dict[str, Any]) -> JobSubmitted:
    dataset_tokens = None
    if row["outcome"] == "valid":
        dataset_tokens = float(row["dataset_tokens_per_second"]) * float(row["train_runtime"])
    configuration = {name: _value(row, name) for name in (*CONFIG_FIELDS, *DESCRIPTOR_FIELDS)}
    return JobSubmitted(**configuration, dataset_tokens=dataset_tokens)


def _completed(row: dict[str, Any]) -> JobCompleted:
    return JobCompleted(**{name: _value(row, name) for name in MEASURED_FIELDS})


# The longest a replayed run goes between two progress reports (or its start and its first, its last and
# its end): the benchmark's longest run (12 h) had 10 reports 66 min apart.
PROGRESS_GAP_S = 600.0


def _progress(row: dict[str, Any]) -> list[tuple[float, JobProgress]]:
    """Progress reports spread over the run: one per ~2 minutes, 2 to 10 of them, and in a longer run at
    least one per PROGRESS_GAP_S (a run silent longer than the twin's attention window looks hung:
    `twin.job_health`)."""
    runtime = float(row["train_runtime"])
    tokens_per_second = float(row["dataset_tokens_per_second"])
    count = max(min(10, max(2, int(runtime // 120))), math.ceil(runtime / PROGRESS_GAP_S) - 1)
    reports = []
    for n in range(1, count + 1):
        at = runtime * n / (count + 1)
        reports.append(
            (at, JobProgress(
                tokens_processed=tokens_per_second * at,
                tokens_per_second=tokens_per_second,
                gpu_memory_peak_pct=_value(row, "gpu_memory_utilization_peak"),
                power_watts=_value(row, "gpu_power_watts_avg"),
            ))
        )  # fmt: skip
    return reports


def _run_seconds(row: dict[str, Any], uniform: float) -> float | None:
    """How long the job holds its GPUs: the measured runtime, or for an out-of-memory failure a plausible
    time into the run (model loading grows with the model's size, the failure comes in the first steps)."""
    if row["outcome"] == "valid":
        return float(row["train_runtime"])
    if row["outcome"] == "runtime":
        params_b = model_params_b(str(row["model_name"])) or 8.0
        return (20.0 + 1.5 * params_b) * (0.5 + uniform)
    return None


# --- the simulated cluster --------------------------------------------------------------------------------


def _node_layout(row: dict[str, Any]) -> tuple[int, int]:
    """(nodes, GPUs per node) for a job: its requested nodes, more if its GPUs do not fit 8 per node."""
    gpus = int(row["number_gpus"])
    nodes = max(int(row["number_nodes"]), math.ceil(gpus / GPUS_PER_NODE))
    return nodes, math.ceil(gpus / nodes)


def _short_name(gpu_model: str) -> str:
    try:
        name = gpu_type(gpu_model).short
    except KeyError:
        name = gpu_model
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


class _Cluster:
    """8-GPU nodes per GPU model, each GPU free from some simulated time on; a list scheduler places jobs."""

    def __init__(self, nodes_per_model: dict[str, int]) -> None:
        self.node_models: dict[str, str] = {}
        self.free_at: dict[str, list[float]] = {}
        self.by_model: dict[str, list[str]] = {}
        for gpu_model, count in sorted(nodes_per_model.items()):
            ids = [f"{_short_name(gpu_model)}-{n:02d}" for n in range(count)]
            self.by_model[gpu_model] = ids
            for node_id in ids:
                self.node_models[node_id] = gpu_model
                self.free_at[node_id] = [0.0] * GPUS_PER_NODE

    @classmethod
    def sized_for(
        cls,
        jobs: Iterable[tuple[dict[str, Any], float]],
        span: float,
        utilization: float = TARGET_UTILIZATION,
    ) -> _Cluster:
        """Enough nodes of each GPU model for its largest job and for its GPU-seconds at the target
        utilization over the replay's span."""
        largest: dict[str, int] = {}
        gpu_seconds: dict[str, float] = {}
        for row, duration in jobs:
            gpu = row["gpu_model"]
            nodes, _ = _node_layout(row)
            largest[gpu] = max(largest.get(gpu, 1), nodes)
            gpu_seconds[gpu] = gpu_seconds.get(gpu, 0.0) + int(row["number_gpus"]) * duration
        return cls({
            gpu: max(largest[gpu], math.ceil(gpu_seconds[gpu] / (GPUS_PER_NODE * span * utilization)))
            for gpu in largest
        })  # fmt: skip

    def place(self, row: dict[str, Any], ready: float, duration: float) -> tuple[float, list[str]]:
        """Start the job on the nodes where its GPUs free up soonest; returns (start time, node ids)."""
        nodes, per_node = _node_layout(row)
        candidates = self.by_model[row["gpu_model"]]
        when = {node_id: sorted(self.free_at[node_id])[per_node - 1] for node_id in candidates}
        chosen = heapq.nsmallest(nodes, candidates, key=lambda node_id: (max(when[node_id], ready), node_id))
        start = max([ready] + [when[node_id] for node_id in chosen])
        for node_id in chosen:
            slots = sorted(self.free_at[node_id])
            self.free_at[node_id] = [start + duration] * per_node + slots[per_node:]
        return start, sorted(chosen)
