"""The twin's starting point from the store: the nodes that are up, the jobs queued and running (with their
progress), the arrival process and job mix observed over a lookback window, and observed failure times.

A job the store knows too little about to simulate (no configuration yet) is left out and counted in the
inputs' notes; a job without its work (dataset tokens) gets the median work of the observed jobs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
from sqlalchemy import Engine
from sqlmodel import Session, col, select

from twin.arrivals import fit_arrivals
from twin.clock import TwinClock, as_utc, twin_clock, window_start
from twin.cluster import MAX_GPUS_PER_NODE, cluster_from_inventory, oversized_nodes
from twin.domain import JobConfig, canonical_gpu_name, fewest_nodes
from twin.forecast import TwinInputs
from twin.job_config import descriptors_of
from twin.job_health import DEFAULT_GRACE, attention_by_job, attention_grace, attention_notes
from twin.limits import plausible_power
from twin.observed_outcomes import ObservedOutcomes
from twin.settings import TwinSettings
from twin.store import JOB_ROWS, Job, JobRecord, Node, ObservedRun, job_records
from twin.workload import RunningState, Workload, catalog_key

# The bundled benchmark sample's median work per job, for when nothing observed says better.
DEFAULT_WORK_TOKENS = 3_145_728.0
# Enough recent failures to describe when jobs fail; older ones describe an older cluster.
MAX_FAILURE_TIMES = 5000


class NoClusterError(ValueError):
    """The store knows no node that is up, so there is no cluster to forecast."""


utc = as_utc


def job_config(job: JobRecord) -> JobConfig | None:
    """The job's configuration as the models are asked it: with the protocol telemetry gave it (experiment
    id, identifier, tuning version, dtype), which the models' protocol features read."""
    if not (job.model_name and job.method and job.gpu_model and job.number_gpus and job.batch_size):
        return None
    if not job.tokens_per_sample:
        return None
    return JobConfig(
        model_name=job.model_name,
        method=job.method,
        gpu_model=canonical_gpu_name(job.gpu_model),
        number_gpus=int(job.number_gpus),
        number_nodes=int(job.number_nodes or fewest_nodes({"number_gpus": int(job.number_gpus)})),
        batch_size=int(job.batch_size),
        tokens_per_sample=int(job.tokens_per_sample),
        enable_roce=bool(job.enable_roce),
        fast_moe=int(job.fast_moe or 0),
        fast_kernels=bool(job.fast_kernels),
        time_limit_s=job.time_limit_s,
        extra=descriptors_of(job),
    )


class _Rows:
    """Collects jobs into a Workload, configurations deduplicated into its catalog."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.arrival: list[float] = []
        self.gpus: list[int] = []
        self.gpu_models: list[str] = []
        self.work: list[float] = []
        self.config_idx: list[int] = []
        self.catalog: dict[object, int] = {}
        self.configs: list[JobConfig] = []
        self.running: dict[int, RunningState] = {}

    def add(
        self, job_id: str, arrival_s: float, config: JobConfig, work: float, running: RunningState | None
    ) -> None:
        if running is not None:
            self.running[len(self.ids)] = running
        self.ids.append(job_id)
        self.arrival.append(arrival_s)
        self.gpus.append(config.number_gpus)
        self.gpu_models.append(config.gpu_model)
        self.work.append(work)
        index = self.catalog.setdefault(catalog_key(config), len(self.catalog))
        if index == len(self.configs):
            self.configs.append(config)
        self.config_idx.append(index)

    def build(self) -> Workload:
        n = len(self.ids)
        return Workload(
            job_ids=self.ids,
            arrival_s=np.asarray(self.arrival, dtype=np.float64),
            gpus=np.asarray(self.gpus, dtype=np.int64),
            gpu_models=self.gpu_models,
            duration_s=np.full(n, np.nan),
            work_tokens=np.asarray(self.work, dtype=np.float64),
            config_idx=np.asarray(self.config_idx, dtype=np.int64) if n else np.zeros(0, np.int64),
            catalog=self.configs,
            running=self.running,
        )


def load_live_inputs(
    engine: Engine,
    *,
    cluster_id: str = "default",
    now: datetime | None = None,
    lookback: timedelta = timedelta(days=7),
    clock: TwinClock | None = None,
    attention_after: timedelta = DEFAULT_GRACE,
) -> TwinInputs:
    """The state at `now` (default: the twin's clock, i.e. the telemetry's newest time when it disagrees
    with the wall clock). Arrivals and the job mix come from the last `lookback` of telemetry time, never
    from before the telemetry began (a window that reached back before it would dilute the rate)."""
    if now is None:
        clock = clock or twin_clock(engine, cluster_id)
        now = clock.now
    now = utc(now)
    since = window_start(engine, cluster_id, now - lookback, now)
    notes: list[str] = []
    if clock is not None and clock.source == "telemetry" and clock.lag_s is not None:
        ahead = "behind" if clock.lag_s > 0 else "ahead of"
        notes.append(
            f"starts at the telemetry's newest time, {abs(clock.lag_s):,.0f} s {ahead} the wall clock"
        )
    # The jobs a forecast reads: queued or running now, and submitted in the window (the arrivals' history).
    is_active = col(Job.state).in_(("submitted", "running"))
    in_window = (col(Job.submitted_at) >= since) & (col(Job.submitted_at) < now)
    with Session(engine) as session:
        nodes = list(session.exec(select(Node).where(Node.cluster_id == cluster_id)).all())
        active = job_records(session, JOB_ROWS.where(Job.cluster_id == cluster_id, is_active))
        # In submission order, as the arrivals' mix is built: in the order the database keeps them, the same
        # store gave another forecast on SQLite than on PostgreSQL, or after an index changed the plan.
        history = job_records(session, JOB_ROWS.where(Job.cluster_id == cluster_id, in_window).order_by(
            col(Job.submitted_at), col(Job.job_id)
        ))  # fmt: skip
        # The work of the jobs read above only: every observed run of the record was read for each forecast.
        # Multiplied here, not in SQL: a run stored before telemetry bounded its values (1e200 s at 1e200
        # tokens/s) overflowed PostgreSQL's product, and failed every forecast until it left the window.
        runs = session.exec(
            select(ObservedRun.job_id, ObservedRun.dataset_tokens_per_second, ObservedRun.train_runtime)
            .join(Job, col(Job.job_id) == col(ObservedRun.job_id))
            .where(
                Job.cluster_id == cluster_id,
                is_active | in_window,
                col(ObservedRun.dataset_tokens_per_second).is_not(None),
                col(ObservedRun.train_runtime).is_not(None),
            )
        ).all()
        observed_work = {job_id: rate * runtime for job_id, rate, runtime in runs}
        failures = newest_failure_times(session, cluster_id)
    return inputs_from_rows(
        StoreRows(nodes, active, history, observed_work, failures),
        cluster_id=cluster_id, now=now, since=since, notes=notes, clock=clock,
        attention_after=attention_after,
    )  # fmt: skip


def load_cluster_inputs(engine: Engine, settings: TwinSettings, clock: TwinClock | None = None) -> TwinInputs:
    """`load_live_inputs` for the cluster the settings name, with their lookback and attention window."""
    return load_live_inputs(
        engine,
        cluster_id=settings.cluster_id,
        lookback=timedelta(days=settings.forecast_lookback_days),
        clock=clock,
        attention_after=attention_grace(settings),
    )


def newest_failure_times(
    session: Session, cluster_id: str, until: datetime | None = None
) -> list[float | None]:
    """Seconds into the run of the cluster's newest runtime failures (ended by `until`, if given), newest
    first, at most MAX_FAILURE_TIMES: one step back along the jobs' end-time index per failure."""
    # A runtime failure by its outcome (set with the state, by the same event): no index leads with it, so
    # SQLite walks the end-time index back and stops at the limit. By its state, it took the state index,
    # read every failed job of the record and sorted them (0.30 s against 0.009 s at 166,000 failures).
    query = select(Job.failed_after_s).where(
        Job.cluster_id == cluster_id, Job.outcome == "runtime", col(Job.failed_after_s).is_not(None)
    )
    if until is not None:
        query = query.where(col(Job.ended_at) <= utc(until))
    ordered = query.order_by(col(Job.ended_at).desc(), col(Job.job_id)).limit(MAX_FAILURE_TIMES)
    return list(session.exec(ordered).all())


@dataclass
class StoreRows:
    """What a forecast starts from, as the store's rows (read from it, or rebuilt for a past time)."""

    nodes: list[Node]
    active: list[JobRecord]  # queued or running at `now`
    history: list[JobRecord]  # submitted in [since, now)
    observed_work: dict[str, float]  # job id -> dataset tokens a finished run processed
    failures: list[float | None]  # seconds into the run of observed runtime failures, newest first


def job_work(job: JobRecord, observed_work: dict[str, float]) -> float | None:
    """A job's work in dataset tokens: as declared at submission, else what its finished run processed. Only
    a finite amount is work: a run's rate times its runtime can overflow to inf (1e200 x 1e200, stored before
    telemetry bounded both), and a forecast then assumed "inf tokens" for every job of unknown work."""
    if job.dataset_tokens and job.dataset_tokens > 0 and math.isfinite(job.dataset_tokens):
        return float(job.dataset_tokens)
    seen = observed_work.get(job.job_id)
    return float(seen) if seen and seen > 0 and math.isfinite(seen) else None


def typical_work(history: list[JobRecord], observed_work: dict[str, float]) -> float | None:
    """The work a forecast assumes for a job that does not declare it: the median of the window's jobs'
    known work (None when no job of the window has one)."""
    known = [w for w in (job_work(j, observed_work) for j in history) if w is not None]
    return float(np.median(known)) if known else None


def _outcomes(mix: Workload, states: list[str]) -> ObservedOutcomes | None:
    """How the mix's runs that ended did: to completion, or failing at runtime (`states`: each job's)."""
    state = np.asarray(states, dtype=str)
    completed, failed = state == "completed", state == "failed"
    ended = completed | failed
    return ObservedOutcomes.of(mix.catalog, mix.config_idx[ended], completed[ended])


def _oversized_note(oversized: list[tuple[str, int]]) -> str:
    named = ", ".join(f"{node_id!r} ({count:,} GPUs)" for node_id, count in oversized[:3])
    more = f" and {len(oversized) - 3} more" if len(oversized) > 3 else ""
    return (
        f"{len(oversized)} node(s) up left out: they report more than {MAX_GPUS_PER_NODE} GPUs, more than a "
        f"node holds: {named}{more}"
    )


def _current_jobs(
    active: list[JobRecord], down: set[str], observed_work: dict[str, float], typical: float, now: datetime
) -> tuple[_Rows, int, int, int]:
    """The queued and running jobs as the plan's rows, in submission order, and how many were left out for
    want of a configuration, left out because a node they ran on is down, and given the typical work."""
    current = _Rows()
    skipped = lost = imputed = 0
    for job in sorted(active, key=lambda j: (utc(j.submitted_at) if j.submitted_at else now, j.job_id)):
        config = job_config(job)
        if config is None:
            skipped += 1
            continue
        if job.state == "running" and down.intersection(job.node_ids or ()):
            lost += 1  # its node went down: it is not running, and telemetry will say how it ended
            continue
        work = job_work(job, observed_work)
        if work is None:
            work, imputed = typical, imputed + 1
        submitted = utc(job.submitted_at) if job.submitted_at else now
        running = None
        if job.state == "running":
            started = utc(job.started_at) if job.started_at else now
            running = RunningState(
                elapsed_s=max((now - started).total_seconds(), 0.0),
                tokens_done=job.tokens_processed,
                tokens_per_second=job.last_tokens_per_second,
                power_w=plausible_power(job.last_power_watts),  # the plan keeps only a measured one
                node_ids=tuple(dict.fromkeys(job.node_ids or ())),  # a node named twice is one node
            )
        current.add(job.job_id, min((submitted - now).total_seconds(), 0.0), config, work, running)
    return current, skipped, lost, imputed


def inputs_from_rows(
    rows: StoreRows,
    *,
    cluster_id: str,
    now: datetime,
    since: datetime,
    notes: list[str],
    clock: TwinClock | None = None,
    attention_after: timedelta = DEFAULT_GRACE,
) -> TwinInputs:
    nodes, active, history, observed_work, failures = (
        rows.nodes, rows.active, rows.history, rows.observed_work, rows.failures[:MAX_FAILURE_TIMES]
    )  # fmt: skip
    inventory = [(n.node_id, n.gpu_model, n.gpu_count, n.status) for n in nodes]
    cluster = cluster_from_inventory(inventory)
    oversized = oversized_nodes(inventory)
    if not cluster.total_gpus:
        raise NoClusterError(
            f"no node of cluster {cluster_id!r} is up in the store (node.status telemetry): nothing to model"
            + (f" ({_oversized_note(oversized)})" if oversized else "")
        )
    if oversized:
        notes.append(_oversized_note(oversized))

    known_typical = typical_work(history, observed_work)
    typical = known_typical or DEFAULT_WORK_TOKENS

    if cluster.draining:
        notes.append(
            f"{cluster.draining} node(s) draining: they run their jobs to the end and take no new one"
        )
    down = {n.node_id for n in nodes if n.status == "down"}
    current, skipped, lost, imputed = _current_jobs(active, down, observed_work, typical, now)
    if skipped:
        notes.append(f"{skipped} queued or running job(s) left out: their configuration is not known yet")
    if lost:
        notes.append(f"{lost} running job(s) left out: a node they ran on is down")
    flagged = attention_by_job(
        [job for job in active if not down.intersection(job.node_ids or ())], now, attention_after
    )
    notes += attention_notes(flagged, attention_after)

    mix = _Rows()
    submitted_at: list[datetime] = []
    states: list[str] = []  # of the mix's jobs: how the runs that ended did
    for job in history:
        if job.submitted_at is None:
            continue
        submitted_at.append(utc(job.submitted_at))
        config = job_config(job)
        if config is not None:
            mix.add(job.job_id, 0.0, config, job_work(job, observed_work) or typical, None)
            states.append(job.state)
    if imputed or (known_typical is None and len(mix.ids)):
        notes.append(f"work (dataset tokens) unknown for some jobs: assumed {typical:,.0f} tokens")
    history_mix = mix.build()
    arrivals = fit_arrivals(submitted_at, history_mix, now, now - since) if submitted_at else None
    failure_times = np.asarray([f for f in failures if f is not None and f >= 0], dtype=float)
    if not len(failure_times):
        notes.append("no runtime failure observed yet: failures assumed 1-10 min into the run")
    return TwinInputs(
        cluster=cluster,
        workload=current.build(),
        arrivals=arrivals,
        failure_times_s=failure_times if len(failure_times) else None,
        start=now,
        notes=notes,
        clock=clock.describe() if clock is not None else None,
        attention={job_id: flagged[job_id] for job_id in set(current.ids) & flagged.keys()},
        outcomes=_outcomes(history_mix, states),
    )
