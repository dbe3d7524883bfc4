"""Fitting a new model version, and refitting it online: on a schedule and when the live error drifts.

`calibrate_version` is the one way a version is made (the `finetwin calibrate` command, the schedule and the
drift trigger all call it): load the benchmarks and the observed runs, compare fairly with the version in use
(`calibrate.promotion`), fit on every row, save the version, promote it only if it is not worse.

`RefitScheduler` puts the hourly refit and the drift check on the API's APScheduler. A drift reported by the
live hook (`on_drift`) or found by the periodic check adds a one-off refit job that runs now; the two paths
exist because the ingest worker may run in another process than the API.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import platform
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from sqlalchemy import Engine, insert, select, update

from calibrate import serving
from calibrate.dataset import TrainingData, WeightPolicy, assemble, file_sha256, load_benchmarks
from calibrate.drift import DriftPolicy, DriftReport, drift, summarize
from calibrate.loader import bundled_benchmark_path
from calibrate.observed import observed_table
from calibrate.promotion import Comparison, Incumbent, KeptFit, split_of, start_comparison
from calibrate.records import ModelVersionRecord
from calibrate.refit_process import RefitFailed, RefitProcess
from calibrate.registry import ModelRegistry, RegistryError
from calibrate.settings import CalibrateSettings
from twin.lifeline import exit_now, when_spawning_parent_gone

if TYPE_CHECKING:
    from calibrate.fit import CalibratedModels

log = logging.getLogger(__name__)

LIBRARIES = ("numpy", "pandas", "scikit-learn", "scipy", "skops", "finetwin")
REFIT_JOB_ID = "calibrate.refit"
REFIT_NOW_JOB_ID = "calibrate.refit-now"
DRIFT_CHECK_JOB_ID = "calibrate.drift-check"


@dataclass
class RefitResult:
    version: str | None  # None when nothing was fitted (nothing new to learn from)
    promoted: bool
    in_use: str | None
    comparison: Comparison | None
    fit_seconds: float  # the whole calibration: loading, the comparison's fits, the final fit, saving
    rows: int
    message: str
    metadata: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why a scheduled refit failed

    @property
    def final_fit_seconds(self) -> float | None:
        return self.metadata.get("final_fit_seconds")


def calibrate_version(
    models_dir: Path,
    *,
    benchmarks: Sequence[Path],
    engine: Engine | None = None,
    observed: bool = False,
    weights: WeightPolicy | None = None,
    tolerance: float = 0.002,
    reason: str = "manual",
    seed: int = 0,
    skip_if_unchanged: bool = False,
    parallel: bool = True,
    now: datetime | None = None,
) -> RefitResult:
    """Fit both models on the benchmarks (and the observed runs) and write a new version.

    Raises `calibrate.loader.BenchmarkFormatError` for a bad benchmark file and `ValueError` when there is
    nothing to fit on.
    """
    from calibrate.fit import fit_models

    started = time.perf_counter()
    now = now or datetime.now(UTC)
    weights = weights or WeightPolicy()
    registry = ModelRegistry(models_dir)
    if observed and engine is None:
        raise ValueError("observed runs need the store (an engine)")
    # The comparison's fits (on the split) and the final fit (on every row) are independent and each uses
    # one core: the comparison's fits run meanwhile in worker processes, one per side compared (its two fits
    # one after the other made a refit against the version in use take 39 s, not 27, on 30,920 rows). The
    # workers start before the rows are loaded, so that their imports overlap the loading: one, and a
    # second for the version in use when it kept no comparison fit this calibration may score; none for a
    # refit that may find nothing new.
    warm = 0 if skip_if_unchanged else 1 + int(_refits_version_in_use(registry, seed))
    keep: Path | None = None  # where the comparison writes the candidate's fit, kept with the version
    try:
        with _comparison_worker(parallel, warm=warm) as workers:
            tables, described = load_benchmarks(benchmarks)
            observed_rows = observed_table(engine) if observed and engine is not None else None
            data = assemble(tables, observed_rows, now=now, policy=weights, described=described)
            if not len(data):
                raise ValueError("no rows to fit on: give a benchmark file or observe some runs first")

            in_use = registry.in_use()
            # The version in use, or a newer one that was not promoted, may have learned from these rows.
            latest = {v for v in (in_use, (registry.versions() or [None])[-1]) if v is not None}
            same = sorted(v for v in latest if _same_data(registry, v, data))
            if skip_if_unchanged and same:
                return RefitResult(
                    None, False, in_use, None, time.perf_counter() - started, len(data),
                    f"nothing new since {same[-1]} (same {len(data)} rows); no refit",
                )  # fmt: skip

            union, candidate_rows, incumbent = _with_incumbent_rows(
                registry, in_use, data, engine, weights, now, seed
            )
            keep = registry.scratch()
            finish_comparison = start_comparison(
                union, candidate_rows, incumbent, fit=fit_models, seed=seed, tolerance=tolerance,
                executor=workers, keep=keep,
            )  # fmt: skip
            final_fit_started = time.perf_counter()
            models = fit_models(data.table, data.weights, seed=seed)
            final_fit_seconds = time.perf_counter() - final_fit_started
            # Written while the comparison still runs (about a second of the wall time otherwise):
            # everything of the version but its metadata, which holds the comparison.
            staging = registry.stage(models, data.row_hashes)
            try:
                comparison = finish_comparison()
                if registry.holds_parts(keep):
                    registry.stage_comparison_fit(staging, keep)
            except BaseException:
                registry.discard(staging)
                raise
    finally:
        if keep is not None:  # after the workers are gone: none still writes there
            registry.discard(keep)
    fit_seconds = time.perf_counter() - started
    metadata = _metadata(data, models, comparison, weights, reason, seed, fit_seconds, now)
    metadata["final_fit_seconds"] = round(final_fit_seconds, 3)
    version = registry.commit(staging, metadata)
    _leave_serving_snapshot(registry, version, models)
    promoted = comparison.not_worse and registry.promote(
        version,
        reason=f"{reason}: not worse than {comparison.against or 'nothing'}",
        replacing=comparison.against,
    )
    if engine is not None:
        record_version(engine, registry.metadata(version), promoted=promoted)
    verdict = _verdict(comparison, promoted, registry)
    message = f"{version}: {len(data)} rows, calibrated in {fit_seconds:.1f} s; {verdict}"
    return RefitResult(
        version, promoted, registry.in_use(), comparison, fit_seconds, len(data), message, metadata
    )


def _verdict(comparison: Comparison, promoted: bool, registry: ModelRegistry) -> str:
    """What became of the new version, for its message."""
    if promoted:
        if comparison.against:
            return f"in use (not worse than {comparison.against})"
        return "in use (the first version)"
    if comparison.not_worse:
        replaced = registry.in_use()
        return f"NOT promoted: {replaced} was put in use while it was compared with {comparison.against}"
    if comparison.unmeasured:
        return (
            f"NOT promoted: not measured on held-out rows ({comparison.unmeasured}), so not shown to be "
            f"as good as {comparison.against} in use"
        )
    return f"NOT promoted, worse than {comparison.against} in use: {_worse(comparison)}"


def _leave_serving_snapshot(registry: ModelRegistry, version: str, models: CalibratedModels) -> None:
    """The new version's serving snapshot (`calibrate.serving`), so that the next `finetwin predict` loads it
    without scikit-learn or skops and runs its trees through the tree walker at once, instead of loading it
    through skops (~3.5 s) and compiling its trees (~8 s). Best effort: a version without one loads as
    before."""
    try:
        serving.save(registry, version, models)
    except (RegistryError, OSError) as exc:
        log.warning("no serving snapshot for %s: %s", version, exc)


@contextlib.contextmanager
def _comparison_worker(parallel: bool, *, warm: int) -> Iterator[Executor | None]:
    """A process per comparison fit (`_ProcessPerTask`), or None to run in this process when parallel fits
    are off or no process can be started."""
    if not parallel:
        yield None
        return
    try:
        workers = _ProcessPerTask(warm=warm)
    except (OSError, NotImplementedError) as exc:
        log.warning("comparing in this process (no worker process: %s)", exc)
        yield None
        return
    with workers:
        yield workers


class _ProcessPerTask(Executor):
    """Each task submitted in a process of its own ("spawn": safe from a process with threads, such as the
    API's scheduler), started when the task is; `warm`: start that many now, with their imports (a pool of
    two would start its second process while the first is still importing, for a calibration needing one)."""

    def __init__(self, *, warm: int) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._pools = [self._pool() for _ in range(warm)]
        self._submitted = 0
        for pool in self._pools:
            pool.submit(_import_fitting)

    def _pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=1, mp_context=self._context, initializer=_end_with_parent)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        if self._submitted == len(self._pools):
            self._pools.append(self._pool())
        pool = self._pools[self._submitted]
        self._submitted += 1
        return pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for pool in self._pools:
            pool.shutdown(wait=wait, cancel_futures=cancel_futures)


def _end_with_parent() -> None:
    """In a comparison's process: end with the process that calibrates (`finetwin calibrate` or a refit's
    process), however it ends; left behind after a `kill -9`, it finished its fit for nobody and then waited
    for more work forever."""
    when_spawning_parent_gone(exit_now, "finetwin-comparison-parent-watch")


def _import_fitting() -> None:
    """In a worker: what the comparison's fits need (about 2 s of imports a new process would spend later).
    The models' modules import scikit-learn and SciPy only where they fit (a prediction runs without them),
    so those are named here, and skops, which writes the candidate's fit and reads a kept one."""
    import scipy.stats  # noqa: F401
    import sklearn.ensemble  # noqa: F401
    import sklearn.linear_model  # noqa: F401
    import sklearn.metrics  # noqa: F401
    import sklearn.model_selection  # noqa: F401
    import skops.io  # noqa: F401

    import calibrate.fit  # noqa: F401


def _with_incumbent_rows(
    registry: ModelRegistry,
    in_use: str | None,
    data: TrainingData,
    engine: Engine | None,
    weights: WeightPolicy,
    now: datetime,
    seed: int,
) -> tuple[TrainingData, np.ndarray, Incumbent | None]:
    """The union of the candidate's rows and the in-use version's (from its benchmark files, if still
    there and unchanged, and the observed runs), with a mask of the candidate's rows."""
    if in_use is None:
        return data, np.ones(len(data), dtype=bool), None
    try:
        metadata = registry.metadata(in_use)
        incumbent = Incumbent(
            in_use, registry.training_rows(in_use), metadata.get("heldout_metrics", {}),
            _kept_fit(registry, in_use, metadata, seed),
        )  # fmt: skip
    except RegistryError as exc:
        # A version in use that fails verification cannot be compared with: the new one must not replace
        # it silently (recorded metrics of nothing), so it is compared with "cannot be measured".
        log.error("the version in use cannot be read for comparison: %s", exc)
        return data, np.ones(len(data), dtype=bool), Incumbent(in_use, frozenset(), {})
    have = {d["sha256"] for d in data.benchmarks}
    extra = [
        path
        for d in metadata.get("data", {}).get("benchmarks", [])
        if d.get("sha256") not in have and _unchanged(path := Path(str(d["path"])), str(d.get("sha256")))
    ]
    observed_by_incumbent = metadata.get("data", {}).get("rows_by_source", {}).get("observed", 0)
    has_observed = bool((data.table["source"] == "observed").any())
    extra_observed = observed_by_incumbent and not has_observed and engine is not None
    if not extra and not extra_observed:
        return data, np.ones(len(data), dtype=bool), incumbent
    tables, _ = load_benchmarks(extra)
    more = assemble(tables, observed_table(engine) if extra_observed else None, now=now, policy=weights)
    keep = np.isin(more.row_hashes, list(incumbent.row_hashes))
    more = more.subset(keep)
    union = TrainingData(
        pd.concat([data.table, more.table], ignore_index=True, sort=False),
        np.concatenate([data.weights, more.weights]),
        np.concatenate([data.row_hashes, more.row_hashes]),
        data.benchmarks,
    )
    candidate_rows = np.concatenate([np.ones(len(data), bool), np.zeros(len(more), bool)])
    return union, candidate_rows, incumbent


def _refits_version_in_use(registry: ModelRegistry, seed: int) -> bool:
    """Whether the comparison will likely fit the version in use again (it kept no fit to score)."""
    in_use = registry.in_use()
    if in_use is None:
        return False
    try:
        return not _may_score_kept_fit(registry, in_use, registry.metadata(in_use), seed)
    except RegistryError:
        return False  # it cannot be read: compared as "cannot be measured", not refitted


def _may_score_kept_fit(registry: ModelRegistry, version: str, metadata: dict[str, Any], seed: int) -> bool:
    """Whether the version kept a comparison fit that a comparison of this calibration may score: made on
    a split of the same kind and seed, with the same libraries (finetwin's own version among them: a fit
    made by other code is fitted again by this one)."""
    comparison = metadata.get("comparison") or {}
    return (
        comparison.get("split") == split_of(seed)
        and metadata.get("libraries") == library_versions()
        and registry.has_comparison_fit(version)
    )


def _kept_fit(registry: ModelRegistry, version: str, metadata: dict[str, Any], seed: int) -> KeptFit | None:
    """The version's comparison fit where a comparison of this calibration may score it, verified."""
    if not _may_score_kept_fit(registry, version, metadata, seed):
        return None
    comparison = metadata.get("comparison") or {}
    pointer = registry.pointer() or {}
    manifest = pointer.get("manifest_sha256") if pointer.get("version") == version else None
    # Verified here, not only where it is loaded: a damaged version in use is then compared as one that
    # cannot be read (`_with_incumbent_rows`), rather than failing the whole calibration where it is scored.
    registry.verify(version, manifest)
    n_train = int((comparison.get("candidate") or {}).get("n_train", 0))
    return KeptFit(registry.root, version, manifest, n_train)


def _unchanged(path: Path, sha256: str) -> bool:
    return path.is_file() and file_sha256(path) == sha256


def _same_data(registry: ModelRegistry, version: str, data: TrainingData) -> bool:
    try:
        metadata = registry.metadata(version)
    except RegistryError:
        return False
    same_rows = metadata.get("data", {}).get("fingerprint") == data.fingerprint
    return same_rows and metadata.get("libraries") == library_versions()


def _worse(comparison: Comparison) -> str:
    return "; ".join(r for r in comparison.reasons if "WORSE" in r or "cannot" in r)


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def _metadata(
    data: TrainingData,
    models: Any,
    comparison: Comparison,
    weights: WeightPolicy,
    reason: str,
    seed: int,
    fit_seconds: float,
    now: datetime,
) -> dict[str, Any]:
    table = data.table
    info: dict[str, Any] = getattr(models, "info", {})
    return {
        "created_at": now.isoformat(timespec="seconds"),
        "reason": reason,
        "seed": seed,
        "data": {
            "fingerprint": data.fingerprint,
            "n_rows": len(data),
            "rows_by_source": data.rows_by_source,
            "left_out": dict(data.left_out),  # rows given but not learned from, by why (`dataset.assemble`)
            # The newest observed run it learned from (telemetry time): a backtest at an earlier time must
            # not use this version (`ModelRegistry.version_in_use_at`).
            "observed_through": _observed_through(table),
            "outcomes": {str(k): int(v) for k, v in table["outcome"].value_counts().items()},
            "benchmarks": data.benchmarks,
        },
        "weights": {
            "benchmark_row": 1.0,
            "observed_weight": weights.observed_weight,
            "observed_half_life_days": weights.half_life_days,
        },
        "features": list(getattr(models, "feature_names", [])),
        # How much throughput error an error family shares, by novelty level (the twin's ensembles use it),
        # how far from its prediction a held-out run has landed, and how unsure the power model is.
        "error_correlation": dict(info.get("error_correlation", {})),
        "error_range": dict(info.get("error_range", {})),
        "power_error": {
            "scale": dict(info.get("power_error_scale", {})),
            "correlation": dict(info.get("power_error_correlation", {})),
        },
        "libraries": library_versions(),
        "heldout_metrics": comparison.candidate,
        "comparison": comparison.to_json(),
        "promoted": comparison.not_worse,
        "fit_seconds": round(fit_seconds, 3),
    }


def _observed_through(table: pd.DataFrame) -> str | None:
    if "observed_at" not in table.columns:
        return None
    newest = pd.to_datetime(table["observed_at"], utc=True, errors="coerce").max()
    return None if pd.isna(newest) else newest.isoformat()


def record_version(engine: Engine, metadata: dict[str, Any], *, promoted: bool) -> None:
    from sqlalchemy.exc import IntegrityError

    from calibrate.live_error import version_record

    row = version_record({**metadata, "promoted": promoted})
    try:
        with engine.begin() as connection:
            exists = connection.execute(
                select(ModelVersionRecord.version).where(ModelVersionRecord.version == row["version"])
            ).first()
            if exists is None:
                connection.execute(insert(ModelVersionRecord.__table__), [row])  # type: ignore[attr-defined]
            return
    except IntegrityError:
        # The ingest worker records every version that predicts: on a first start it can see the new
        # version in use and record it between this check and this insert. The row is there; only what
        # this fit knows better (promoted, why) is written over it.
        pass
    table = ModelVersionRecord.__table__  # type: ignore[attr-defined]
    with engine.begin() as connection:
        connection.execute(
            update(table)
            .where(table.c.version == row["version"])
            .values(promoted=row["promoted"], reason=row["reason"])
        )


def refit_benchmarks(settings: CalibrateSettings, registry: ModelRegistry) -> list[Path]:
    """What a scheduled refit learns from: the configured files, else the in-use version's (when they are
    still there), else the bundled real sample."""
    if settings.refit_benchmarks:
        return list(settings.refit_benchmarks)
    in_use = registry.in_use()
    if in_use is not None:
        described = registry.metadata(in_use).get("data", {}).get("benchmarks", [])
        paths = [Path(str(d["path"])) for d in described if Path(str(d["path"])).is_file()]
        if paths:
            return paths
    return [bundled_benchmark_path()]


def shareable_url(engine: Engine) -> str | None:
    """The engine's URL with its password, for a child process to open the same store; None for a store
    only this process can see (SQLite in memory)."""
    url = engine.url
    if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
        return None
    return url.render_as_string(hide_password=False)


class RefitScheduler:
    """The online refits of one process: hourly, and at once when the live error drifts."""

    def __init__(
        self,
        settings: CalibrateSettings,
        engine: Engine,
        scheduler: Any,  # apscheduler BaseScheduler
        *,
        models_dir: Path | None = None,
        on_done: Callable[[RefitResult], None] | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        in_child: bool = True,
    ) -> None:
        """`in_child`: each refit in a child process at a lower CPU priority (`calibrate.refit_process`),
        unless the store cannot be opened from another process (SQLite in memory)."""
        self.settings = settings
        self.engine = engine
        self.scheduler = scheduler
        self.models_dir = models_dir or settings.resolved_models_dir()
        self.registry = ModelRegistry(self.models_dir)
        self.policy = DriftPolicy.from_settings(settings)
        self.on_done = on_done
        self.clock = clock
        self._running = threading.Lock()
        self._child = RefitProcess() if in_child and shareable_url(engine) is not None else None
        self._stopped = False
        self._last_drift_trigger: datetime | None = None
        self.last_result: RefitResult | None = None

    def install(self) -> None:
        """The hourly refit and the periodic drift check (for drift found by an ingest worker elsewhere)."""
        self.scheduler.add_job(
            self.refit, "interval", minutes=self.settings.refit_interval_minutes, id=REFIT_JOB_ID,
            kwargs={"reason": "schedule"}, replace_existing=True, coalesce=True, max_instances=1,
        )  # fmt: skip
        self.scheduler.add_job(
            self.check_drift, "interval", seconds=self.settings.drift_check_seconds, id=DRIFT_CHECK_JOB_ID,
            replace_existing=True, coalesce=True, max_instances=1,
        )  # fmt: skip
        try:
            fresh = self.registry.in_use() is None
        except RegistryError as exc:
            # The registry's own files, damaged (the API stopped at its start): said, and left as they are
            # for the operator to mend; the advice and forecasts that need the model say so meanwhile.
            log.error("the model registry cannot be read: %s", exc)
            fresh = False
        if fresh:
            # A fresh installation has no model: fit the first one now rather than in an hour, so forecasts
            # and advice use calibrated models (they fall back to uncalibrated ones until it lands).
            self.scheduler.add_job(
                self.refit, next_run_time=self.clock(), id=REFIT_NOW_JOB_ID, kwargs={"reason": "first model"},
                replace_existing=True, coalesce=True, max_instances=1, misfire_grace_time=None,
            )  # fmt: skip

    def stop(self) -> None:
        """Ends a refit running in its child process (the API is stopping): it is abandoned, not saved."""
        self._stopped = True
        if self._child is not None:
            self._child.stop()

    def on_drift(self, report: DriftReport) -> bool:
        """Refit now (at most once per cooldown); returns whether a refit was scheduled."""
        now = self.clock()
        cooldown = timedelta(minutes=self.settings.drift_cooldown_minutes)
        if self._last_drift_trigger is not None and now - self._last_drift_trigger < cooldown:
            return False
        self._last_drift_trigger = now
        self.scheduler.add_job(
            self.refit, next_run_time=now, id=REFIT_NOW_JOB_ID, kwargs={"reason": f"drift: {report}"},
            replace_existing=True, coalesce=True, max_instances=1, misfire_grace_time=None,
        )  # fmt: skip
        return True

    def check_drift(self) -> bool:
        try:
            version = self.registry.in_use()
        except RegistryError:  # said at the start and by every refit, not again every few seconds
            return False
        if version is None:
            return False
        with self.engine.connect() as connection:
            report = drift(summarize(connection, version, self.policy.window), self.policy)
        return self.on_drift(report) if report is not None else False

    def refit(self, reason: str = "schedule") -> RefitResult | None:
        if not self._running.acquire(blocking=False):
            log.info("a refit is already running; skipping the one for %s", reason)
            return None
        try:
            arguments: dict[str, Any] = dict(
                models_dir=self.models_dir,
                benchmarks=refit_benchmarks(self.settings, self.registry),
                observed=self.settings.refit_observed,
                weights=WeightPolicy(self.settings.observed_weight, self.settings.observed_half_life_days),
                tolerance=self.settings.promote_tolerance,
                reason=reason,
                # The hourly refit has nothing to do when no run was observed since; a drift with the same
                # data would fit the same model again.
                skip_if_unchanged=True,
            )
            if self._child is not None:
                result = self._child.run(calibrate_version, shareable_url(self.engine), **arguments)
            else:
                result = calibrate_version(engine=self.engine, **arguments)
        except KeyboardInterrupt:
            if threading.current_thread() is threading.main_thread():
                raise  # the user's own Ctrl-C
            # The refit's process was stopped (`stop`: the API is stopping), or, refitting in this process,
            # the comparison fit's worker took a terminal's Ctrl-C (it reaches every process of the
            # foreground group): its KeyboardInterrupt comes back as its result. Not a failure to report
            # with a traceback.
            why = "the API is stopping" if self._stopped else "its worker process was interrupted (Ctrl-C)"
            log.info("refit (%s) abandoned: %s", reason, why)
            return None
        except RefitFailed as exc:
            log.error("refit (%s) failed in its process: %s\n%s", reason, exc, exc.child_traceback)
            result = RefitResult(
                None, False, None, None, 0.0, 0, f"refit ({reason}) failed: {exc}", error=str(exc)
            )
        except Exception as exc:  # the scheduler's thread must survive a failed refit; say why it failed
            log.exception("refit (%s) failed", reason)
            result = RefitResult(
                None, False, None, None, 0.0, 0, f"refit ({reason}) failed: {exc}", error=str(exc)
            )
        finally:
            self._running.release()
        log.info("refit (%s): %s", reason, result.message)
        if result.version is not None:
            pruned = self.registry.prune(self.settings.models_keep_versions)
            if pruned:
                log.info("deleted old model versions %s", ", ".join(pruned))
        self.last_result = result
        if self.on_done is not None:
            self.on_done(result)
        return result
