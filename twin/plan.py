"""From a workload to what the simulator needs: per job, when it arrives, which GPU pool it waits for, how
many GPUs, how long it holds them, whether it fails, what the scheduler believes it will take, its power.

Two steps, so that an ensemble pays for the models once:
- `prepare_catalog` (once per scenario): admission control, optimizations and right-sizing change the
  distinct configurations, and the models predict each one (throughput band, p_valid, power).
- `build_plan` (once per run): each job's random draws from its own stream (see `twin.randomness`) pick
  its throughput inside the band, whether it fails at runtime and when.

Where a job lands in its band is not drawn independently per job: the model's error is shared by the jobs of
an error family (`twin.families`), so each run draws one standard-normal shock per family and mixes it into
each job's own draw, z = sqrt(rho) z_family + sqrt(1 - rho) z_job, with rho the share of the error that the
models measured as shared (`twin.protocols.ErrorCorrelationModel`, from held-out residuals). Each job's
marginal band is unchanged; what changes is that errors no longer average out over hundreds of jobs, so the
ensemble's spread of GPU-hours and makespan carries the models' uncertainty as it behaves. The mixed draw
is a quantile; where the models describe their error's distribution (`ErrorDistributionModel`, heavy tailed
in practice) the quantile is read from it, else from a normal, and no further from p50 than the models'
held-out errors ever went (`ErrorRangeModel`). Whether a job fails at runtime is drawn the
same way (`FailureCorrelationModel`): a second family shock, so that a failure model that misjudges the
memory of a family misjudges all of its jobs in a run, and the band of jobs completed and failed is as wide
as the model's shared error makes it, not as narrow as independent coin flips. And where the failure model
is an ensemble (`FailureMembersModel`), each run takes one member's p_valid for all its jobs: the spread
between members is the model's uncertainty about p itself, which no per-job or per-family draw carries.
A job's power is drawn the same way where the model gives its error (`PowerErrorModel`): log-normal with the
prediction as its mean, with a third family shock, so that energy's band holds the power model's shared
error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from enum import IntEnum

import numpy as np
from scipy.special import ndtr, ndtri

from twin.cluster import Cluster, gpu_tdp_watts
from twin.config_changes import (
    DEFAULT_MIN_P_VALID,
    Admission,
    Optimization,
    optimize_config,
    repair_config,
    right_size_batches,
)
from twin.domain import JobConfig, config_rule
from twin.families import ERROR_QUANTILE_LEVELS, family_of
from twin.limits import plausible_power
from twin.protocols import (
    ErrorCorrelationModel,
    ErrorDistributionModel,
    ErrorRangeModel,
    FailureCorrelationModel,
    FailureMembersModel,
    JobModels,
    PowerErrorModel,
)
from twin.randomness import job_keys, job_uniforms
from twin.workload import NO_CONFIG, Workload

# A job with a fixed duration and no configuration draws this fraction of its GPUs' board power.
DEFAULT_POWER_FRACTION = 0.75


def recorded_power_w(measured: float | None, reported: float | None, gpu_model: str) -> float:
    """The power per GPU a job drew, as the store recorded it: its run's measured average, else its last
    reported power, else what the twin assumes (DEFAULT_POWER_FRACTION of its GPUs' board power). A power
    beyond the plausible (`twin.limits.plausible_power`: 1e308 W stored before ingest bounded it) is none."""
    return (
        plausible_power(measured)
        or plausible_power(reported)
        or gpu_tdp_watts(gpu_model) * DEFAULT_POWER_FRACTION
    )


# When no runtime failure has been observed yet: out-of-memory shows up after the model loads, within the
# first training steps; a uniform 1-10 minutes until observed failure times replace it.
DEFAULT_FAILURE_TIMES_S = np.array([60.0, 600.0])
# z of the 10th/90th percentile of a normal: the band p10-p90 spans ±1.2816 standard deviations.
_Z90 = 1.2815515655446004
# Draws beyond ±3 sigma would be extrapolation of the band, not evidence.
_Z_CLIP = 3.0

# Per-job random streams (a stream added later leaves the others' draws as they were).
STREAM_FAIL, STREAM_BAND, STREAM_FAIL_TIME, STREAM_POWER = 0, 1, 2, 3
STREAMS = 4
# Per-family shocks of a run: throughput error, runtime failure, power.
FAMILY_BAND, FAMILY_FAIL, FAMILY_POWER = 0, 1, 2


class Reject(IntEnum):
    NONE = 0
    RULE = 1  # the actuator's admission rules (rejected before launch)
    PREDICTED_FAILURE = 2  # admission control `reject`: the failure model expects it to fail at runtime
    NO_CAPACITY = 3  # the cluster has no GPU of that type, or fewer than the job needs


REJECT_NAMES = {
    Reject.RULE: "rule",
    Reject.PREDICTED_FAILURE: "predicted_runtime_failure",
    Reject.NO_CAPACITY: "no_capacity",
}


@dataclass(frozen=True, slots=True)
class PlanOptions:
    admission: Admission = Admission.OFF
    optimizations: frozenset[Optimization] = frozenset()
    right_size_batches: bool = False
    min_p_valid: float = DEFAULT_MIN_P_VALID

    def __post_init__(self) -> None:
        # Accept plain strings ("repair", "fast_kernels") from configuration files and the API.
        object.__setattr__(self, "admission", Admission(self.admission))
        object.__setattr__(self, "optimizations", frozenset(Optimization(o) for o in self.optimizations))


@dataclass
class PreparedCatalog:
    """The workload's distinct configurations after the scenario's changes, with the models' predictions."""

    configs: list[JobConfig]
    throughput: np.ndarray  # (k, 3) p10/p50/p90 tokens/s, whole job
    p_valid: np.ndarray  # (k,)
    power_w: np.ndarray  # (k,) per GPU
    reject: np.ndarray  # (k,) Reject codes decided by the configuration alone
    changed: np.ndarray  # (k,) bool: repaired, optimized or right-sized
    # (k,) share of the throughput error shared within the error family (0 = independent per job) ...
    error_correlation: np.ndarray | None = None
    # ... and each configuration's family, as a stable 64-bit key (the run's shared draw is keyed by it).
    family_keys: np.ndarray | None = None
    # (k, levels) standardized error at ERROR_QUANTILE_LEVELS per configuration; None: normal errors.
    error_quantiles: np.ndarray | None = None
    # (k,) share of the runtime-failure error shared within the family; None: independent failures.
    failure_correlation: np.ndarray | None = None
    # (k, members) each failure-model member's p_valid (mean: p_valid); None: p_valid is known exactly.
    p_valid_members: np.ndarray | None = None
    # (k,) standard deviation of the log-power error, and (k,) the share of it shared within the family;
    # None: each job's power is known.
    power_error_scale: np.ndarray | None = None
    power_correlation: np.ndarray | None = None
    # (k, 2) the most negative and the most positive log(tokens/s / p50) the model was seen to miss by;
    # None: unbounded.
    error_range: np.ndarray | None = None

    def run_limits_s(self) -> np.ndarray:
        """(k,) how long each configuration's run may last (`JobConfig.run_limit_s`), inf without a limit."""
        limits = [c.run_limit_s for c in self.configs]
        return np.array([math.inf if s is None else float(s) for s in limits], dtype=float)

    @classmethod
    def empty(cls) -> PreparedCatalog:
        z = np.zeros(0)
        return cls([], np.zeros((0, 3)), z, z, np.zeros(0, np.int8), np.zeros(0, bool))

    def with_correlation(self, correlation: np.ndarray | float) -> PreparedCatalog:
        """The same catalog with another share of shared error (what-ifs of the uncertainty, tests)."""
        return self._with_shares(error_correlation=self._shares(correlation))

    def with_failure_correlation(self, correlation: np.ndarray | float) -> PreparedCatalog:
        """The same catalog with another share of shared runtime-failure error."""
        return self._with_shares(failure_correlation=self._shares(correlation))

    def _shares(self, correlation: np.ndarray | float) -> np.ndarray:
        rho = np.broadcast_to(np.asarray(correlation, dtype=float), (len(self.configs),))
        return np.clip(rho, 0.0, MAX_CORRELATION)

    def _with_shares(self, **shares: np.ndarray) -> PreparedCatalog:
        keys = self.family_keys if self.family_keys is not None else family_hashes(self.configs)
        return replace(self, family_keys=keys, **shares)


# A family's error is never wholly shared: the jobs of a family still differ (batch, GPUs, sequence length).
MAX_CORRELATION = 0.99


def family_hashes(configs: Sequence[JobConfig]) -> np.ndarray:
    return job_keys([f"family:{family_of(c)}" for c in configs])


def prepare_catalog(
    catalog: Sequence[JobConfig],
    models: JobModels | None,
    options: PlanOptions = PlanOptions(),
    known: PreparedCatalog | None = None,
) -> PreparedCatalog:
    """The configurations after the plan's changes, with the models' predictions. `known`: a catalog
    prepared before with the same models; the rows of the configurations it holds (the same objects) are
    copied from it instead of asking the models again (a prediction is its configuration's own: no row
    depends on another). A what-if that changes a few configurations asks about those alone."""
    if not catalog:
        return PreparedCatalog.empty()
    if models is None:
        raise ValueError("jobs with a configuration need performance and failure models (none were given)")
    configs = list(catalog)
    if options.admission is Admission.REPAIR:
        configs = [repair_config(c) if config_rule(c) is not None else c for c in configs]
    if options.optimizations:
        configs = [optimize_config(c, options.optimizations) for c in configs]
    if options.right_size_batches:
        configs = right_size_batches(configs, models, options.min_p_valid)
    prepared = _predicted(configs, models) if known is None else _reusing(known, configs, models)
    if options.admission is Admission.REJECT:
        doubted = (prepared.reject == Reject.NONE) & (prepared.p_valid < options.min_p_valid)
        prepared.reject[doubted] = Reject.PREDICTED_FAILURE
    prepared.changed = np.array([a != b for a, b in zip(configs, catalog, strict=True)], dtype=bool)
    return prepared


def _predicted(configs: list[JobConfig], models: JobModels) -> PreparedCatalog:
    """`configs` with the models' predictions, rejected by the rules alone, none marked changed."""
    reject = np.array([Reject.RULE if config_rule(c) is not None else Reject.NONE for c in configs], np.int8)
    runnable = [c for c, r in zip(configs, reject, strict=True) if r == Reject.NONE]
    k = len(configs)
    throughput = np.full((k, 3), np.nan)
    p_valid = np.zeros(k)
    power = np.full(k, np.nan)
    p_valid_members = None
    power_scale = power_correlation = None
    if runnable:
        mask = reject == Reject.NONE
        throughput[mask] = _checked(models.predict_throughput(runnable), (len(runnable), 3), "throughput")
        if isinstance(models, FailureMembersModel):
            # p_valid is the members' mean: one pass of the failure model, not a second for predict_failure.
            p_valid_members = _members(models.predict_failure_members(runnable), mask)
            p_valid[mask] = p_valid_members[mask].mean(axis=1)
        else:
            predicted = _checked(models.predict_failure(runnable), (len(runnable),), "p_valid")
            p_valid[mask] = np.clip(predicted, 0, 1)
        power[mask] = _checked(models.predict_power_watts(runnable), (len(runnable),), "power")
        power_scale, power_correlation = _power_error(models, runnable, mask)
    missing_power = ~np.isfinite(power)
    if missing_power.any():
        power[missing_power] = [
            gpu_tdp_watts(c.gpu_model) * DEFAULT_POWER_FRACTION
            for c in np.asarray(configs, object)[missing_power]
        ]
    correlation, quantiles, failure_correlation, error_range = _error_structure(models, configs)
    return PreparedCatalog(
        configs, throughput, p_valid, power, reject, np.zeros(k, bool), correlation, family_hashes(configs),
        quantiles, failure_correlation, p_valid_members, power_scale, power_correlation, error_range,
    )  # fmt: skip


# What `_reusing` copies row by row: every column but the configurations themselves and what the plan
# decides after (`changed`; `reject` is copied and then left with the rules' rejections alone).
_PREDICTED_COLUMNS = tuple(f.name for f in fields(PreparedCatalog) if f.name not in ("configs", "changed"))


def _reusing(known: PreparedCatalog, configs: list[JobConfig], models: JobModels) -> PreparedCatalog:
    """`_predicted(configs, models)`, with the rows of the configurations `known` holds copied from it."""
    # By identity: a what-if's unchanged configurations are its baseline's own objects, and equality would
    # leave out `extra`, which the models may read. An equal configuration made anew is simply asked again.
    row_of = {id(c): i for i, c in enumerate(known.configs)}
    rows = np.array([row_of.get(id(c), -1) for c in configs], dtype=np.intp)
    held = rows >= 0
    if not held.any():
        return _predicted(configs, models)
    new = [c for c, h in zip(configs, held, strict=True) if not h]
    fresh = _predicted(new, models) if new else None
    columns: dict[str, np.ndarray | None] = {}
    for name in _PREDICTED_COLUMNS:
        old = getattr(known, name)
        added = getattr(fresh, name) if fresh is not None else None
        if old is None and added is None:
            columns[name] = None  # the models say nothing of it
            continue
        if old is None or (fresh is not None and added is None):
            return _predicted(configs, models)  # one side had nothing to run, so no such column: ask anew
        column = np.empty((len(configs), *old.shape[1:]), dtype=old.dtype)
        column[held] = old[rows[held]]
        if added is not None:
            column[~held] = added
        columns[name] = column
    reject = columns["reject"]
    assert reject is not None
    reject[reject == Reject.PREDICTED_FAILURE] = Reject.NONE  # the known plan's doubts, not this one's
    changed = np.zeros(len(configs), bool)
    return PreparedCatalog(configs, changed=changed, **columns)  # type: ignore[arg-type]


def _error_structure(
    models: JobModels, configs: list[JobConfig]
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """What the models say of how their errors behave, per configuration, where they say it: the share of the
    throughput error its family shares (0: independent), the standardized error's quantiles, the share of
    the failure model's error its family shares, and the range of held-out throughput errors."""
    k = len(configs)
    correlation = np.zeros(k)
    if isinstance(models, ErrorCorrelationModel):
        correlation = _checked(models.predict_error_correlation(configs), (k,), "error correlation")
        correlation = np.clip(np.nan_to_num(correlation, nan=0.0), 0.0, MAX_CORRELATION)
    quantiles = None
    if isinstance(models, ErrorDistributionModel):
        shape = (k, len(ERROR_QUANTILE_LEVELS))
        quantiles = np.maximum.accumulate(
            _checked(models.predict_error_quantiles(configs), shape, "error quantiles"), axis=1
        )
        if not np.isfinite(quantiles).all():
            raise ValueError("the model returned error quantiles that are not finite")
    failure_correlation = None
    if isinstance(models, FailureCorrelationModel):
        failure_correlation = _checked(
            models.predict_failure_correlation(configs), (k,), "failure correlation"
        )
        failure_correlation = np.clip(np.nan_to_num(failure_correlation, nan=0.0), 0.0, MAX_CORRELATION)
    error_range = None
    if isinstance(models, ErrorRangeModel):
        error_range = _checked(models.predict_error_range(configs), (k, 2), "error range")
        if np.isnan(error_range).any() or (error_range[:, 0] > 0).any() or (error_range[:, 1] < 0).any():
            raise ValueError("the model returned an error range that does not hold 0")
    return correlation, quantiles, failure_correlation, error_range


def _power_error(
    models: JobModels, runnable: list[JobConfig], mask: np.ndarray
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Each runnable configuration's log-power error spread and family share (0 for the rest, `mask` False:
    they never run), or (None, None) when the models do not give them."""
    if not isinstance(models, PowerErrorModel):
        return None, None
    predicted = _checked(models.predict_power_error(runnable), (len(runnable), 2), "power error")
    if not np.isfinite(predicted).all() or (predicted[:, 0] < 0).any():
        raise ValueError("the model returned a power error that is negative or not finite")
    scale, share = np.zeros(len(mask)), np.zeros(len(mask))
    scale[mask] = predicted[:, 0]
    share[mask] = np.clip(predicted[:, 1], 0.0, MAX_CORRELATION)
    return scale, share


def _members(predicted: object, mask: np.ndarray) -> np.ndarray:
    """(k, members) member p_valid for the runnable rows `mask` (0 elsewhere), each in [0, 1]."""
    array = np.asarray(predicted, dtype=float)
    if array.ndim != 2 or array.shape[0] != int(mask.sum()) or array.shape[1] < 1:
        raise ValueError(f"the model returned failure members of shape {array.shape}, "
                         f"expected ({int(mask.sum())}, members)")  # fmt: skip
    if not np.isfinite(array).all():
        raise ValueError("the model returned failure members' p_valid that are not finite")
    members = np.zeros((len(mask), array.shape[1]))
    members[mask] = np.clip(array, 0.0, 1.0)
    return members


def _checked(values: object, shape: tuple[int, ...], what: str) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.shape != shape:
        raise ValueError(f"the model returned {what} of shape {array.shape}, expected {shape}")
    return array


@dataclass
class JobPlan:
    """One run's jobs in arrival order (ties keep workload order); `row` maps back to the workload."""

    job_ids: list[str]
    row: np.ndarray
    arrival_s: np.ndarray
    gpus: np.ndarray
    pool: np.ndarray  # index into `pools`, -1 when it cannot be placed
    pools: list[str]
    hold_s: np.ndarray  # how long it holds its GPUs once started (to completion or to its failure)
    fails: np.ndarray  # bool: fails at runtime
    estimate_s: np.ndarray  # what the scheduler believes the run will take (p50 prediction or duration)
    power_w: np.ndarray  # per GPU
    reject: np.ndarray  # Reject codes
    elapsed_s: np.ndarray  # NaN, or how long it has been running when the simulation starts
    # How long it would hold its GPUs had it run to completion: hold_s, except for a job drawn to fail, whose
    # drawn run stands here. None where the plan does not draw runs (a truth replayed from measured times).
    run_s: np.ndarray | None = None
    # The nodes each running job runs on, by the plan's index, where telemetry named them.
    nodes: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.job_ids)


def band_draw(band: np.ndarray, u: np.ndarray) -> np.ndarray:
    """A throughput at quantile u of a split log-normal through the band's p10, p50 and p90."""
    return band_at(band, np.clip(ndtri(u), -_Z_CLIP, _Z_CLIP))


def band_at(band: np.ndarray, z: np.ndarray) -> np.ndarray:
    """The throughput `z` band units from p50: log-scale, the lower half-band below it, the upper above."""
    band = np.sort(np.maximum(band, 1e-9), axis=1)
    log10, log50, log90 = np.log(band[:, 0]), np.log(band[:, 1]), np.log(band[:, 2])
    sigma = np.where(z < 0, log50 - log10, log90 - log50) / _Z90
    return np.exp(log50 + z * sigma)


def error_z(catalog: PreparedCatalog, idx: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The standardized error at quantile `u` of each job's configuration: from the models' quantiles of
    their error where they give them (interpolated; the extreme levels bound it), else a normal's."""
    if catalog.error_quantiles is None:
        return np.clip(ndtri(u), -_Z_CLIP, _Z_CLIP)
    tables, which = np.unique(catalog.error_quantiles[idx], axis=0, return_inverse=True)
    z = np.empty(len(u))
    for t, table in enumerate(tables):
        rows = which.reshape(-1) == t
        z[rows] = np.interp(u[rows], ERROR_QUANTILE_LEVELS, table)
    return z


def within_range(
    catalog: PreparedCatalog, idx: np.ndarray, tokens_per_s: np.ndarray, p50: np.ndarray
) -> np.ndarray:
    """The drawn throughputs, none further from p50 than the model's held-out errors ever were
    (`ErrorRangeModel`): a wide band times a draw from the heavy tail in band units can reach runs
    thousands of times slower than predicted, which no held-out run was."""
    if catalog.error_range is None:
        return tokens_per_s
    low, high = catalog.error_range[idx, 0], catalog.error_range[idx, 1]
    return np.clip(tokens_per_s, p50 * np.exp(low), p50 * np.exp(high))


def running_nodes(workload: Workload, order: np.ndarray) -> dict[int, tuple[str, ...]]:
    """The nodes of each running job that telemetry placed, by its index in the plan (`order`)."""
    position = {int(row): i for i, row in enumerate(order)}
    return {position[row]: state.node_ids for row, state in workload.running.items() if state.node_ids}


def pool_index(workload: Workload, cluster: Cluster) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Each job's GPU pool (index into the cluster's GPU models; -1 = none) and whether it can ever fit."""
    pools = cluster.gpu_models
    index = {name: i for i, name in enumerate(pools)}
    default = 0 if len(pools) == 1 else -1  # an unnamed GPU type is fine when there is only one
    pool = np.fromiter(
        (index.get(g, -1) if g else default for g in workload.gpu_models), dtype=np.int64, count=len(workload)
    )
    capacity = np.zeros(len(pools) + 1, dtype=np.int64)
    for name, gpus in cluster.gpus_by_model().items():  # a draining node's GPUs serve no new job
        capacity[index[name]] = gpus
    # Up to a node's size it needs one node; beyond, whole nodes of the pool (their GPUs added up).
    fits = (pool >= 0) & (workload.gpus <= capacity[pool]) & (workload.gpus >= 1)
    # A running job fits where it runs, a draining node included.
    sizes = {n.node_id: (n.gpu_model, n.gpus) for n in cluster.nodes}
    for row, state in workload.running.items():
        if pool[row] < 0 or not state.node_ids:
            continue
        held = [sizes.get(node_id, ("", 0)) for node_id in state.node_ids]
        if all(model == pools[pool[row]] for model, _ in held):
            fits[row] |= 1 <= workload.gpus[row] <= sum(gpus for _, gpus in held)
    return pool, pools, fits


def build_plan(
    workload: Workload,
    catalog: PreparedCatalog,
    cluster: Cluster,
    key: int | None,
    failure_times_s: np.ndarray | None = None,
) -> JobPlan:
    """The run's plan. `key` (from `twin.randomness.run_key`) seeds every job's own stream; it may be None
    only when no job needs a random draw (all have fixed durations)."""
    n = len(workload)
    order = np.argsort(workload.arrival_s, kind="stable")
    pool, pools, fits = pool_index(workload, cluster)
    cfg = workload.config_idx
    has_cfg = cfg != NO_CONFIG
    reject = np.zeros(n, dtype=np.int8)
    reject[has_cfg] = catalog.reject[cfg[has_cfg]]
    reject[(reject == Reject.NONE) & ~fits] = Reject.NO_CAPACITY
    elapsed = np.full(n, np.nan)
    for row, state in workload.running.items():
        elapsed[row] = state.elapsed_s

    hold = workload.duration_s.astype(np.float64).copy()
    estimate = hold.copy()
    fails = np.zeros(n, dtype=bool)
    power = np.full(n, np.nan)
    modelled = np.flatnonzero(has_cfg)
    drawn = None
    if len(modelled):
        if key is None:
            raise ValueError("jobs with a configuration need a run key for their random draws")
        drawn = _draw_modelled(workload, catalog, key, modelled, elapsed[modelled], failure_times_s)
        hold[modelled], estimate[modelled] = drawn.hold, drawn.estimate
        fails[modelled], power[modelled] = drawn.fails, drawn.power
    fixed = ~has_cfg
    if fixed.any():
        started = fixed & ~np.isnan(elapsed)
        hold[started] = np.maximum(hold[started] - elapsed[started], 0.0)
        estimate[fixed] = hold[fixed]
        power[fixed] = _default_power(pool[fixed], pools)
    for row, state in workload.running.items():
        if state.power_w is not None and state.power_w > 0:  # measured: no prediction, no draw
            power[row] = state.power_w
    if np.isnan(hold[reject == Reject.NONE]).any():
        raise ValueError("a job has neither a duration nor a configuration")
    hold[reject != Reject.NONE] = 0.0
    if_run = hold.copy()
    if drawn is not None:
        if_run[modelled] = np.where(reject[modelled] == Reject.NONE, drawn.run, 0.0)
    return JobPlan(
        job_ids=[workload.job_ids[i] for i in order],
        row=order,
        arrival_s=workload.arrival_s[order].astype(np.float64),
        gpus=workload.gpus[order].astype(np.int64),
        pool=pool[order],
        pools=pools,
        hold_s=hold[order],
        fails=fails[order],
        estimate_s=estimate[order],
        power_w=power[order],
        reject=reject[order],
        elapsed_s=elapsed[order],
        run_s=if_run[order],
        nodes=running_nodes(workload, order),
    )


@dataclass(frozen=True, slots=True)
class _Draws:
    """One run's draws for the jobs with a configuration, in their order."""

    hold: np.ndarray  # how long each holds its GPUs: its run, or until it fails
    run: np.ndarray  # its run to the end of its work (or of its time limit)
    estimate: np.ndarray  # what the scheduler believes it takes: its work at the median throughput
    fails: np.ndarray  # it fails at runtime (a job the rules reject never runs, so never fails)
    power: np.ndarray  # watts per GPU


def _draw_modelled(
    workload: Workload,
    catalog: PreparedCatalog,
    key: int,
    modelled: np.ndarray,
    run_elapsed: np.ndarray,
    failure_times_s: np.ndarray | None,
) -> _Draws:
    """The rows `modelled` (jobs with a configuration) drawn from their own streams and their families'
    shocks: throughput inside the band, whether and when they fail, their power; a running job's (its
    `run_elapsed` not NaN) from where it stands."""
    idx = workload.config_idx[modelled]
    work = workload.work_tokens[modelled]
    if np.isnan(work).any():
        bad = workload.job_ids[int(modelled[np.isnan(work)][0])]
        raise ValueError(f"job {bad!r} has a configuration but no work (dataset tokens)")
    u = job_uniforms(key, job_keys([workload.job_ids[i] for i in modelled]), STREAMS)
    band = catalog.throughput[idx]
    runnable = catalog.reject[idx] == Reject.NONE
    band = np.where(runnable[:, None], band, 1.0)  # rejected jobs never run; keep the arithmetic finite
    quantile = shared_uniforms(catalog, idx, key, u[:, STREAM_BAND], catalog.error_correlation, FAMILY_BAND)
    u_fail = shared_uniforms(catalog, idx, key, u[:, STREAM_FAIL], catalog.failure_correlation, FAMILY_FAIL)
    p50 = np.maximum(np.sort(band, axis=1)[:, 1], 1e-9)
    tokens_per_s = within_range(catalog, idx, band_at(band, error_z(catalog, idx, quantile)), p50)
    limit = catalog.run_limits_s()[idx]
    run = np.minimum(work / tokens_per_s, limit)
    estimate = np.minimum(work / p50, limit)
    p_fail = 1.0 - run_p_valid(catalog, key)[idx]
    times = failure_times(failure_times_s)
    u_time = u[:, STREAM_FAIL_TIME].copy()
    started = ~np.isnan(run_elapsed)
    if started.any():
        rest, p_fail[started], u_time[started] = _from_where_it_stands(
            workload, modelled[started], run_elapsed[started], run[started], limit[started],
            p_fail[started], u_time[started], times,
        )  # fmt: skip
        run[started] = rest
        estimate[started] = rest
    fail_after = np.quantile(times, u_time)
    if started.any():
        fail_after[started] = np.maximum(fail_after[started] - run_elapsed[started], 0.0)
    # A job bound to fail burns its GPUs for as long as failing jobs do (the observed failure times, not
    # capped by how long its work would take: it never does that work); only a protocol's time limit can
    # stop it first, and then it counts as a run that completed.
    fail = (u_fail < p_fail) & (fail_after < limit - np.nan_to_num(run_elapsed, nan=0.0))
    return _Draws(
        hold=np.where(fail, fail_after, run),
        run=run,
        estimate=estimate,
        fails=fail & runnable,
        power=catalog.power_w[idx] * power_factor(catalog, idx, key, u[:, STREAM_POWER]),
    )


def _from_where_it_stands(
    workload: Workload,
    rows: np.ndarray,
    elapsed: np.ndarray,
    run: np.ndarray,
    limit: np.ndarray,
    p_fail: np.ndarray,
    u_time: np.ndarray,
    times: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Running jobs: (the rest of their run, their chance of failing, the uniform of their failure time).
    The rest of the work at the rate each shows (when it reports one). A job has not failed yet, so its
    chance of failing and its failure time are conditional on surviving so far:
    P(fail | alive at e) = (1-p)S(e) / (p + (1-p)S(e)), the time drawn from the tail beyond e."""
    rest = np.minimum(_remaining(workload, rows, run, elapsed), np.maximum(limit - elapsed, 0.0))
    survive = 1.0 - failure_cdf(times, elapsed)
    at_risk = p_fail * survive
    alive = 1.0 - p_fail + at_risk
    p_fail_now = np.divide(at_risk, alive, out=np.zeros_like(at_risk), where=alive > 0)
    return rest, p_fail_now, 1.0 - survive + u_time * survive


def _default_power(pools_of_rows: np.ndarray, pools: list[str]) -> list[float]:
    """Watts per GPU for jobs without a configuration: the usual share of their GPU type's TDP."""
    tdp = {name: gpu_tdp_watts(name) * DEFAULT_POWER_FRACTION for name in pools}
    fallback = gpu_tdp_watts("") * DEFAULT_POWER_FRACTION
    return [tdp.get(pools[p], fallback) if p >= 0 else fallback for p in pools_of_rows]


# The key of a run's one draw of the failure-model member (no job id hashes to it in practice).
_MEMBER_DRAW_KEY = np.array([0x6D656D6265722121], dtype=np.uint64)


def run_p_valid(catalog: PreparedCatalog, key: int) -> np.ndarray:
    """Each configuration's p_valid in run `key`: one member's, the same for every job of the run (drawn from
    the run key, so a what-if's run pairs with the baseline's), or the models' p_valid without members."""
    members = catalog.p_valid_members
    if members is None or members.shape[1] < 2:
        return catalog.p_valid
    u = float(job_uniforms(key, _MEMBER_DRAW_KEY, 1)[0, 0])
    return members[:, min(int(u * members.shape[1]), members.shape[1] - 1)]


def shared_uniforms(
    catalog: PreparedCatalog, idx: np.ndarray, key: int, own: np.ndarray,
    rho: np.ndarray | None, stream: int,
) -> np.ndarray:  # fmt: skip
    """Each job's uniform (its quantile in its band, or its failure draw): its own uniform `own`, mixed with
    its family's shock `stream` of this run (keyed by the run and the family, so a what-if's run pairs with
    the baseline's). Still uniform for each job; `rho` (per configuration) is how much it shares."""
    if rho is None or catalog.family_keys is None or not np.any(rho[idx] > 0):
        return own
    families, inverse = np.unique(catalog.family_keys[idx], return_inverse=True)
    shock = ndtri(job_uniforms(key, families, stream + 1)[:, stream])[inverse]
    r = rho[idx]
    return ndtr(np.sqrt(r) * shock + np.sqrt(1.0 - r) * ndtri(own))


def power_factor(catalog: PreparedCatalog, idx: np.ndarray, key: int, own: np.ndarray) -> np.ndarray:
    """Each job's power in this run over the predicted: exp(sigma z - sigma^2 / 2), z its own uniform `own`
    mixed with its family's power shock (1 where the catalog carries no power error), clipped as the band's
    draws. Log-normal with the prediction as its mean: summed over held-out jobs the predictions were
    unbiased (0.99-1.01 of the measured power of the sample's random holdouts and of most blocks), where a
    draw with the prediction as its median would have added sigma^2 / 2 (~2 % in a new region) to every
    energy forecast."""
    if catalog.power_error_scale is None:
        return np.ones(len(idx))
    u = shared_uniforms(catalog, idx, key, own, catalog.power_correlation, FAMILY_POWER)
    sigma = catalog.power_error_scale[idx]
    return np.exp(sigma * np.clip(ndtri(u), -_Z_CLIP, _Z_CLIP) - sigma**2 / 2)


def failure_times(observed_s: np.ndarray | None) -> np.ndarray:
    """The sorted failure times to draw from: the observed ones, or the default when none."""
    times = np.sort(
        np.asarray(observed_s if observed_s is not None else DEFAULT_FAILURE_TIMES_S, dtype=float)
    )
    return times if len(times) else DEFAULT_FAILURE_TIMES_S


def failure_cdf(times: np.ndarray, t: np.ndarray) -> np.ndarray:
    """P(failure time <= t) under the distribution `np.quantile(times, u)` draws from (u uniform)."""
    if len(times) == 1:
        return (t >= times[0]).astype(float)
    return np.interp(t, times, np.linspace(0.0, 1.0, len(times)))


def _remaining(workload: Workload, rows: np.ndarray, run: np.ndarray, elapsed: np.ndarray) -> np.ndarray:
    rest = np.maximum(run - elapsed, 0.0)
    for k, row in enumerate(rows):
        state = workload.running[int(row)]
        work = workload.work_tokens[row]
        if state.tokens_per_second and state.tokens_per_second > 0 and state.tokens_done is not None:
            rest[k] = max(work - state.tokens_done, 0.0) / state.tokens_per_second
    return rest
