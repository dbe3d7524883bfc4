"""Fitting and using the calibrated models: the one interface the registry, the CLI, the API and the twin
use.

`fit_models(table)` fits the throughput, runtime-failure and power models on a benchmark table (loader
output, possibly with observed runs appended); `CalibratedModels` answers for frames (`predict_frame`) and
for `JobConfig`s (`twin.protocols.JobModels`), and splits into scikit-learn estimators plus JSON-able
parameters (`to_parts` / `from_parts`) so the registry can store it with skops, which never runs code on
load.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from calibrate import accuracy, config_frame, row_order
from calibrate.boosting import SKOPS_TRUSTED_TYPES
from calibrate.compiled import CompiledTrees, TreesSnapshot
from calibrate.config_frame import Table, configs_to_frame
from calibrate.encoding import FeatureEncoding
from calibrate.failure import VALID_THRESHOLD, RuntimeFailureModel, fit_failure, model_method
from calibrate.features import FEATURE_NAMES, feature_columns
from calibrate.measured_ranges import beyond_measured, measured_ranges
from calibrate.performance import ThroughputModel, fit_throughput
from calibrate.power import PowerUseModel, fit_power
from calibrate.splits import random_holdout
from calibrate.tree_walker import TreeArrays
from twin.domain import JobConfig, Outcome, broken_rules
from twin.families import ERROR_QUANTILE_LEVELS, error_family

__all__ = [
    "SKOPS_TRUSTED_TYPES",
    "CalibratedModels",
    "fit_models",
    "holdout_metrics",
]

# 2: one numeric matrix with the categorical codes fixed at fit time, and the adaptive band.
PARAMS_FORMAT = 2
# OpenMP threads per fit. The models are small; on a shared two-core machine more threads spin against other
# processes and made a fit twenty times slower in measurements, while one thread loses little.
FIT_THREADS = 1
_RULE_COLUMNS = ("number_gpus", "batch_size", "fast_moe", "number_nodes")
# `predict_columns` looks for repeated configurations in tables of this many rows or more (an advice answer's
# ~70 rows are all distinct), and predicts only the distinct ones when they are at most this share.
DISTINCT_FROM_ROWS = 1_000
DISTINCT_AT_MOST = 0.8


# What a prediction carries per row, in `predict_frame`'s column order (`power_watts` when asked for).
PREDICTION_COLUMNS: tuple[str, ...] = (
    "outcome", "rule", "p_valid", "tokens_per_second_p10", "tokens_per_second_p50", "tokens_per_second_p90",
    "note", "p_valid_low", "power_watts",
)  # fmt: skip


@dataclass
class _ConfigFeatures:
    """The encoded matrix of some configurations, their canonical GPU names and (once asked) their novelty
    levels."""

    configs: tuple[JobConfig, ...]
    X: np.ndarray
    gpus: np.ndarray
    levels: np.ndarray | None = None

    def holds(self, configs: Sequence[JobConfig]) -> bool:
        """Whether these are the same configuration objects (JobConfig is frozen: the same object, the same
        configuration), compared by identity: ~0.1 ms for 4,000, where building the matrix costs ~40 ms."""
        return len(configs) == len(self.configs) and all(
            a is b for a, b in zip(configs, self.configs, strict=True)
        )


class CalibratedModels:
    """Implements `twin.protocols.JobModels` (throughput, runtime failure, power)."""

    feature_names: list[str] = list(FEATURE_NAMES)

    def __init__(
        self,
        encoding: FeatureEncoding,
        throughput: ThroughputModel,
        failure: RuntimeFailureModel,
        power: PowerUseModel,
        info: dict[str, Any] | None = None,
    ) -> None:
        self.encoding = encoding
        self.throughput = throughput
        self.failure = failure
        self.power = power
        self.info = dict(info or {})
        # The last configurations asked about: the twin asks up to eight questions of one catalog in a row
        # (`twin.plan.prepare_catalog`), and each built the same matrix again (~40 ms for 4,000 configs).
        self._last_features: _ConfigFeatures | None = None

    def prepare_native(self, *, wait: bool = True) -> bool:
        """Every ensemble's trees as machine code (`calibrate.native_trees`), compiled in parallel or
        loaded from this machine's cache; `wait=False` returns at once and the predictions switch over as
        each library is ready. True when all are ready on return."""
        trees = self._compiled_trees()
        for compiled in trees:
            compiled.prepare_native(wait=False)
        return all([compiled.prepare_native(wait=wait) for compiled in trees]) if wait else False

    def tree_engine(self) -> str:
        """How the trees run: "native" once every ensemble runs as its own machine code, "compiling" while a
        library is being built (the walker meanwhile), "walker" (`calibrate.tree_walker`), else "treelite"
        (its interpreter, and scikit-learn for large batches: no compiler, or native trees off)."""
        engines = {compiled.engine() for compiled in self._compiled_trees()}
        for engine in ("compiling", "treelite", "walker"):
            if engine in engines:
                return engine
        return "native"

    def _compiled_trees(self) -> list[CompiledTrees]:
        models = (self.throughput, self.failure, self.power)
        return [compiled for model in models for compiled in model.compiled_trees()]

    def _compiled_parts(self) -> dict[str, CompiledTrees]:
        """The compiled trees by the name of their estimator: in the registry (`to_parts`) and in the serving
        snapshot alike."""
        center, difficulty = self.throughput.compiled_trees()
        parts = {"throughput": center, "throughput_difficulty": difficulty}
        parts.update({f"failure_{k}": trees for k, trees in enumerate(self.failure.compiled_trees())})
        for trees in self.power.compiled_trees():  # none where too few runs had power telemetry
            parts["power"] = trees
        return parts

    def serving_snapshot(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """What `from_serving` needs besides the version's params: every ensemble's `TreesSnapshot` (its
        native library where it has one) and the failure members' calibration, and the trees' arrays."""
        trees = {name: compiled.snapshot() for name, compiled in self._compiled_parts().items()}
        arrays: dict[str, np.ndarray] = {}
        for name, snapshot in trees.items():
            arrays.update(snapshot.arrays.to_arrays(name))
        described = {
            "trees": {name: snapshot.to_json() for name, snapshot in trees.items()},
            "platt": [list(pair) for pair in self.failure.platt()],
        }
        return described, arrays

    @classmethod
    def from_serving(
        cls, snapshot: dict[str, Any], arrays: Mapping[str, np.ndarray], params: dict[str, Any]
    ) -> CalibratedModels:
        """The models of a version from its params and its `serving_snapshot`: the same predictions, from the
        compiled libraries in this machine's cache or the tree walker, without scikit-learn (no reference
        numbers, no `to_parts`). Raises ValueError (or KeyError, TypeError) where the snapshot does not fit
        or cannot run here."""
        estimators: dict[str, Any] = {
            name: TreesSnapshot.from_json(data, TreeArrays.from_arrays(arrays, name))
            for name, data in snapshot["trees"].items()
        }
        for k, (slope, intercept) in enumerate(snapshot["platt"]):
            estimators[f"failure_calibration_{k}"] = (float(slope), float(intercept))
        return cls.from_parts(estimators, params)

    def matrix(self, table: Table) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """(encoded feature matrix, canonical GPU names, a note per row) of loader-shaped rows."""
        columns, notes = feature_columns(table)
        return self.encoding.matrix(columns), columns["gpu_model"], notes

    def predict_frame(
        self, table: pd.DataFrame, *, power: bool = False, reference: bool = False, distinct: bool = False
    ) -> pd.DataFrame:
        """Loader output (benchmark or configs) -> one prediction per row, same index and order; with
        `power`, also `power_watts` per GPU from the same features (one feature build, not two).
        `reference`: through scikit-learn's estimators instead of the compiled trees (same numbers).
        `distinct`: the caller's rows are distinct configurations already (`predict_columns`)."""
        predicted = self.predict_columns(table, power=power, reference=reference, distinct=distinct)
        return pd.DataFrame(
            {name: predicted[name] for name in PREDICTION_COLUMNS if name in predicted}, index=table.index
        )

    def predict_columns(
        self, table: Table, *, power: bool = False, reference: bool = False, distinct: bool = False
    ) -> dict[str, Any]:
        """`predict_frame`'s columns as arrays by name (`note`: a list), for a frame or for columns by name
        (`calibrate.config_frame.configs_to_columns`): an answer's ~70 rows skip pandas altogether.

        A large table is predicted once per distinct configuration: a CSV of configurations repeats them
        (100,000 rows resampled from the benchmark hold ~3,900), and the features and trees cost ~50 µs a
        row where finding the repeats costs ~1 µs. `distinct`: the rows are distinct already
        (`calibrate.loader.load_distinct_configs`), and are not searched for repeats again."""
        n = config_frame.row_count(table)
        if n >= DISTINCT_FROM_ROWS and not distinct:
            first, inverse = config_frame.distinct_rows(table)
            if len(first) <= DISTINCT_AT_MOST * n:
                try:
                    distinct = self._predict_rows(config_frame.take(table, first), power, reference)
                except ValueError:
                    # A bad cell: the whole table again, so that the message names the row as the caller
                    # numbers it, not its place among the distinct configurations.
                    return self._predict_rows(table, power, reference)
                return {
                    name: [values[i] for i in inverse] if isinstance(values, list) else values[inverse]
                    for name, values in distinct.items()
                }
        return self._predict_rows(table, power, reference)

    def _predict_rows(self, table: Table, power: bool, reference: bool) -> dict[str, Any]:
        X, gpus, notes = self.matrix(table)
        rows, beyond = beyond_measured(table, self.info.get("measured_ranges"))
        extrapolated = np.zeros(len(notes), dtype=bool)
        extrapolated[rows] = True  # for the advice, which never recommends an extrapolation
        if len(rows):
            with_beyond = np.asarray(notes, dtype=object)
            current = with_beyond[rows]
            with_beyond[rows] = np.where(current != "", current + "; " + beyond, beyond)
            notes = with_beyond.tolist()
        rules = admission_rules(table)
        rejected = np.not_equal(rules, None)
        names, methods = config_frame.column(table, "model_name"), config_frame.column(table, "method")
        order = row_order.alike_together(X)  # the trees walk alike rows faster one after another
        if order is not None:
            X, gpus, rejected, names, methods = (a[order] for a in (X, gpus, rejected, names, methods))
        # A configuration the rules reject never runs: its p_valid is 0 without asking the failure model's
        # four ensembles (a sweep over batch sizes and sequence lengths holds many such rows).
        runnable = np.flatnonzero(~rejected)
        p_valid, p_valid_low = np.zeros(len(rejected)), np.zeros(len(rejected))
        with _quiet_threads() if reference else contextlib.nullcontext():
            if len(runnable):
                novel = self.failure.novel(names[runnable], methods[runnable])
                p_valid[runnable], p_valid_low[runnable] = self.failure.predict_with_low(
                    X[runnable], novel, reference=reference
                )
            band = self.throughput.predict(X, reference=reference)
            watts = self.power.predict(X, gpus, reference=reference) if power else None
        if order is not None:
            p_valid, p_valid_low, band, rejected = (
                row_order.restore(a, order) for a in (p_valid, p_valid_low, band, rejected)
            )
            watts = row_order.restore(watts, order) if watts is not None else None
        outcome = np.where(
            rejected,
            Outcome.REJECTED.value,
            np.where(p_valid >= VALID_THRESHOLD, Outcome.VALID.value, Outcome.RUNTIME.value),
        )
        predicted: dict[str, Any] = {
            "outcome": outcome,
            "rule": rules,
            "p_valid": p_valid,
            "tokens_per_second_p10": band[:, 0],
            "tokens_per_second_p50": band[:, 1],
            "tokens_per_second_p90": band[:, 2],
            "note": notes,
            "p_valid_low": p_valid_low,
            "extrapolated": extrapolated,
        }
        if watts is not None:
            predicted["power_watts"] = watts
        return predicted

    def _features(self, configs: Sequence[JobConfig]) -> _ConfigFeatures:
        """The configurations' matrix, built once for a run of questions about the same ones. Read-only, so
        that no prediction can change what the next one reads."""
        last = self._last_features
        if last is not None and last.holds(configs):
            return last
        X, gpus, _ = self.matrix(configs_to_frame(configs))
        X.flags.writeable = False
        features = _ConfigFeatures(tuple(configs), X, gpus)
        self._last_features = features  # one assignment: a concurrent caller sees the old or the new whole
        return features

    def _levels(self, configs: Sequence[JobConfig]) -> tuple[_ConfigFeatures, np.ndarray]:
        features = self._features(configs)
        if features.levels is None:
            features.levels = self.throughput.levels(features.X)
        return features, features.levels

    def predict_throughput(self, configs: Sequence[JobConfig]) -> np.ndarray:
        if not configs:
            return np.zeros((0, 3))
        return self.throughput.predict(self._features(configs).X)

    def predict_failure(self, configs: Sequence[JobConfig]) -> np.ndarray:
        """p_valid from the runtime-failure model alone; the admission rules are the caller's to check."""
        if not configs:
            return np.zeros(0)
        return self.failure.predict(self._features(configs).X)

    def predict_failure_members(self, configs: Sequence[JobConfig]) -> np.ndarray:
        """twin.protocols.FailureMembersModel: each cross-fitted member's calibrated p_valid, (n, members);
        their mean is `predict_failure`."""
        if not configs:
            return np.zeros((0, len(self.failure.members)))
        return self.failure.member_predictions(self._features(configs).X).T

    def predict_error_correlation(self, configs: Sequence[JobConfig]) -> np.ndarray:
        """twin.protocols.ErrorCorrelationModel: the share of each config's throughput error that its error
        family shares (measured on held-out residuals when the version was fitted)."""
        if not configs:
            return np.zeros(0)
        return self.throughput.error_correlation_at(self._levels(configs)[1])

    def predict_error_quantiles(self, configs: Sequence[JobConfig]) -> np.ndarray:
        """twin.protocols.ErrorDistributionModel: each config's standardized throughput error at
        twin.families.ERROR_QUANTILE_LEVELS, from held-out residuals of its novelty level."""
        if not configs:
            return np.zeros((0, len(ERROR_QUANTILE_LEVELS)))
        return self.throughput.error_quantiles_at(self._levels(configs)[1])

    def predict_error_range(self, configs: Sequence[JobConfig]) -> np.ndarray:
        """twin.protocols.ErrorRangeModel: per config, the most negative and the most positive error of
        log(tokens/s) held out at its novelty level."""
        if not configs:
            return np.zeros((0, 2))
        return self.throughput.error_range_at(self._levels(configs)[1])

    def predict_failure_correlation(self, configs: Sequence[JobConfig]) -> np.ndarray:
        """twin.protocols.FailureCorrelationModel: the share of each config's runtime-failure error that its
        error family shares, from held-out residuals: those of held-out blocks where the config's LLM and
        method are a pair the version never saw, else those of random folds."""
        names = np.array([c.model_name for c in configs], dtype=object)
        methods = np.array([c.method for c in configs], dtype=object)
        return self.failure.error_correlation_of(self.failure.novel(names, methods))

    def predict_power_watts(self, configs: Sequence[JobConfig]) -> np.ndarray:
        if not configs:
            return np.zeros(0)
        features = self._features(configs)
        return self.power.predict(features.X, features.gpus)

    def predict_power_error(self, configs: Sequence[JobConfig]) -> np.ndarray:
        """twin.protocols.PowerErrorModel: per config, the standard deviation of its log(watts) error and
        the share of it its error family shares, from held-out runs of its novelty level."""
        if not configs:
            return np.zeros((0, 2))
        features, levels = self._levels(configs)
        return self.power.predict_error(levels, features.gpus)

    def to_parts(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(name -> scikit-learn pipeline, JSON-able parameters)."""
        # The trees' estimators under the names `_compiled_parts` gives them (and the snapshot repeats).
        estimators: dict[str, Any] = {name: trees.estimator for name, trees in self._compiled_parts().items()}
        estimators.update({f"failure_calibration_{k}": c for k, c in enumerate(self.failure.calibrators)})
        params = {
            "format": PARAMS_FORMAT,
            "feature_names": list(self.feature_names),
            "encoding": self.encoding.params(),
            "throughput": self.throughput.params(),
            "failure": {
                "members": len(self.failure.members),
                "valid_threshold": VALID_THRESHOLD,
                "lower_bound": self.failure.lower_bound,
                "error_correlation": self.failure.error_correlation,
                "novel_lower_bound": self.failure.novel_lower_bound,
                "known_pairs": sorted(self.failure.known_pairs),
                "novel_error_correlation": self.failure.novel_error_correlation,
            },
            "power": self.power.params(),
            "info": self.info,
        }
        return estimators, params

    @classmethod
    def from_parts(cls, estimators: dict[str, Any], params: dict[str, Any]) -> CalibratedModels:
        if params.get("format") != PARAMS_FORMAT:
            raise ValueError(f"unsupported model parameters format {params.get('format')!r}")
        if list(params.get("feature_names", [])) != list(FEATURE_NAMES):
            raise ValueError("the stored models were fitted on other features than this finetwin builds")
        encoding = FeatureEncoding.from_params(params["encoding"])
        members = int(params["failure"]["members"])
        try:
            throughput = ThroughputModel.from_params(
                estimators["throughput"], estimators["throughput_difficulty"], params["throughput"]
            )
            failure = RuntimeFailureModel(
                [estimators[f"failure_{k}"] for k in range(members)],
                [estimators[f"failure_calibration_{k}"] for k in range(members)],
                _lower_bound(params["failure"].get("lower_bound")),
                float(params["failure"].get("error_correlation") or 0.0),
                _lower_bound(params["failure"].get("novel_lower_bound")),
                frozenset(str(m) for m in params["failure"].get("known_pairs") or []),
                _optional_float(params["failure"].get("novel_error_correlation")),
            )
        except KeyError as exc:
            raise ValueError(f"missing estimator {exc.args[0]!r}") from None
        power = PowerUseModel.from_params(estimators.get("power"), params["power"])
        return cls(encoding, throughput, failure, power, params.get("info"))


def _optional_float(stored: Any) -> float | None:
    return None if stored is None else float(stored)


def _lower_bound(stored: Any) -> tuple[list[float], list[float]] | None:
    """The failure model's lower-bound knots from params.json (absent in versions saved before them)."""
    if stored is None:
        return None
    knots_p, knots_low = (list(map(float, k)) for k in stored)
    if len(knots_p) != len(knots_low) or len(knots_p) < 2:
        raise ValueError("the failure model's lower-bound knots are malformed")
    return knots_p, knots_low


def admission_rules(table: Table) -> np.ndarray:
    """The actuator's first broken rule per row (exact, in the paper's order), or None: an object array."""
    present = set(config_frame.column_names(table))
    missing = [c for c in _RULE_COLUMNS if c not in present and c != "fast_moe"]
    if missing:
        raise ValueError(f"missing configuration columns: {', '.join(missing)}")
    fast_moe = (
        np.nan_to_num(config_frame.column(table, "fast_moe").astype(float), nan=0.0)
        if "fast_moe" in present
        else np.zeros(config_frame.row_count(table))
    )
    return broken_rules(
        config_frame.column(table, "number_gpus").astype(int),
        config_frame.column(table, "batch_size").astype(int),
        fast_moe.astype(int),
        config_frame.column(table, "number_nodes").astype(int),
    )


def row_families(table: pd.DataFrame) -> np.ndarray:
    """Each row's error family (`twin.families`: model, method, GPU)."""
    return np.array(
        [
            error_family(str(m), str(k), str(g))
            for m, k, g in zip(table["model_name"], table["method"], table["gpu_model"], strict=True)
        ],
        dtype=object,
    )


def fit_models(
    table: pd.DataFrame, sample_weight: np.ndarray | None = None, *, seed: int = 0, power: bool = True
) -> CalibratedModels:
    """Fit all three models on a benchmark table (loader output; observed runs may be appended in the same
    columns). `sample_weight`: one per row, e.g. larger for observed and newer runs. `power=False` leaves the
    power model unfitted (a share of each GPU's TDP), for fits that are only scored: `score` reads no power,
    and its fits cost ~0.6 s of CPU of each comparison fit of a calibration of 30,920 rows."""
    for column in ("outcome", "dataset_tokens_per_second"):
        if column not in table.columns:
            raise ValueError(
                f"the training table has no {column!r} column (use calibrate.loader.load_benchmark)"
            )
    weight = None if sample_weight is None else np.asarray(sample_weight, dtype=float)
    if weight is not None and (
        weight.shape != (len(table),) or not np.all(np.isfinite(weight)) or np.any(weight < 0)
    ):
        raise ValueError("sample_weight must hold one finite, non-negative weight per row")
    columns, _ = feature_columns(table)
    encoding = FeatureEncoding.fit(columns)
    X = encoding.matrix(columns)
    gpus = columns["gpu_model"]
    outcome = table["outcome"].astype(str).to_numpy()
    throughput = pd.to_numeric(table["dataset_tokens_per_second"], errors="coerce").to_numpy(dtype=float)
    valid = outcome == Outcome.VALID.value
    usable = valid & np.isfinite(throughput) & (throughput > 0)
    passed = valid | (outcome == Outcome.RUNTIME.value)
    power_watts = (
        pd.to_numeric(table["gpu_power_watts_avg"], errors="coerce").to_numpy(dtype=float)
        if power and "gpu_power_watts_avg" in table.columns
        else np.full(len(table), np.nan)  # no telemetry: `fit_power` fits nothing
    )
    with _quiet_threads():
        families = row_families(table)
        throughput_model = fit_throughput(
            X[usable], throughput[usable], _subset(weight, usable), seed=seed, families=families[usable]
        )
        failure_model = fit_failure(
            X[passed], valid[passed], _subset(weight, passed), seed=seed, families=families[passed],
            pairs=model_method(table["model_name"].to_numpy(), table["method"].to_numpy())[passed],
        )  # fmt: skip
        power_model = fit_power(
            X[usable], gpus[usable], power_watts[usable], _subset(weight, usable), seed=seed,
            families=families[usable],
        )  # fmt: skip
    info = {
        "seed": seed,
        "n_rows": int(len(table)),
        "n_valid": int(usable.sum()),
        "n_runtime_failures": int((outcome == Outcome.RUNTIME.value).sum()),
        "n_rejected": int((outcome == Outcome.REJECTED.value).sum()),
        # For the twin's ensembles (twin.plan): by novelty level (0 seen, 1 new region), the share of the
        # throughput error that an error family shares, from held-out residuals.
        "error_correlation": dict(throughput_model.error_correlation),
        "error_quantiles": dict(throughput_model.error_quantiles),
        "error_range": dict(throughput_model.error_range),
        # ... and the share of the runtime-failure model's error that a family shares: of a known LLM and
        # method, and of a pair the version never saw (None: too few such rows to measure it).
        "failure_error_correlation": failure_model.error_correlation,
        "failure_error_correlation_novel": failure_model.novel_error_correlation,
        # ... and the power model's error by novelty level: its spread (log watts) and a family's share.
        "power_error_scale": dict(power_model.error_scale),
        "power_error_correlation": dict(power_model.error_correlation),
        # The sizes the models learned from: a prediction beyond them says it is extrapolated.
        "measured_ranges": measured_ranges(table, passed),
    }
    return CalibratedModels(encoding, throughput_model, failure_model, power_model, info)


def holdout_metrics(
    table: pd.DataFrame, *, seed: int = 0, fraction: float = 0.15, sample_weight: np.ndarray | None = None
) -> dict[str, float]:
    """Fit on a random (1 - fraction) of `table` and score the rest. Errors are fractions (0.06 = 6 %);
    throughput metrics on held-out valid runs, failure metrics on held-out rows that pass the rules.
    Deterministic for a seed."""
    split = random_holdout(table, fraction=fraction, seed=seed)
    train = table.iloc[split.train]
    test = table.iloc[split.test]
    weight = None if sample_weight is None else np.asarray(sample_weight, dtype=float)[split.train]
    models = fit_models(train, weight, seed=seed, power=False)
    return score(models, test) | {"n_train": float(len(train)), "n_test": float(len(test))}


def score(models: CalibratedModels, test: pd.DataFrame) -> dict[str, float]:
    """The accuracy metrics of fitted models on labelled rows (loader output)."""
    predicted = models.predict_frame(test)
    outcome = test["outcome"].astype(str).to_numpy()
    valid = outcome == Outcome.VALID.value
    passed = outcome != Outcome.REJECTED.value
    actual = test["dataset_tokens_per_second"].to_numpy(dtype=float)
    p50 = predicted["tokens_per_second_p50"].to_numpy()
    return {
        "throughput_mdape": accuracy.mdape(actual[valid], p50[valid]),
        "throughput_mape": accuracy.mape(actual[valid], p50[valid]),
        "band_coverage": accuracy.band_coverage(
            actual[valid],
            predicted["tokens_per_second_p10"].to_numpy()[valid],
            predicted["tokens_per_second_p90"].to_numpy()[valid],
        ),
        "failure_balanced_accuracy": accuracy.balanced_accuracy(
            valid[passed], predicted["p_valid"].to_numpy()[passed] >= VALID_THRESHOLD
        ),
        "failure_brier": accuracy.brier_score(valid[passed], predicted["p_valid"].to_numpy()[passed]),
        "rules_exact": accuracy.exact_share(
            outcome == Outcome.REJECTED.value, predicted["outcome"].to_numpy() == Outcome.REJECTED.value
        ),
    }


def _subset(weight: np.ndarray | None, mask: np.ndarray) -> np.ndarray | None:
    """The weights of the rows in `mask`, or None where every one is 1: the same fit, and scikit-learn bins
    a weighted feature with one sort per bin edge (4.9 of the 17 s of trees in a calibration of 30,920
    benchmark rows, which all weigh 1)."""
    if weight is None:
        return None
    chosen = weight[mask]
    return None if np.all(chosen == 1.0) else chosen


@contextmanager
def _quiet_threads() -> Iterator[None]:
    # threadpoolctl limits the thread pools of the libraries loaded when it is entered, and the models import
    # scikit-learn only where they fit: its OpenMP runtime is loaded first, or the fits run unlimited
    # (measured: a calibration of 30,920 rows took 28 s instead of 16, its CPU time 36 s instead of 15).
    import sklearn.ensemble  # noqa: F401

    with threadpool_limits(limits=FIT_THREADS, user_api="openmp"), warnings.catch_warnings():
        # scikit-learn 1.9 warns from inside HistGradientBoosting about its own joblib helper.
        warnings.filterwarnings(
            "ignore", message=r".*sklearn\.utils\.parallel\.delayed.*", category=UserWarning
        )
        yield
