"""When a new model version may replace the one in use: held-out metrics, compared fairly.

"Not worse", precisely: on the same held-out rows, the candidate's
- throughput MdAPE and MAPE are not higher than the in-use version's by more than `tolerance`,
- runtime-failure balanced accuracy is not lower by more than `tolerance`,
- p10-p90 band coverage is not further from the target range [0.70, 0.92] by more than `tolerance`;
a metric that cannot be measured on either side (no such rows) fails the comparison.

Fair, precisely: both versions are judged by the same procedure on the same rows that neither was trained
on. The rows are the union of the candidate's training rows and the in-use version's (rebuilt from its row
fingerprints); one seeded random split holds out 15 % of them; each side is refitted with this code on its
own rows of the other 85 % and scored on the held-out 15 %. Scoring the in-use artifact itself on rows it
trained on would flatter it (in-sample) and a refit of the same data could never win.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from calibrate.dataset import TrainingData
from calibrate.fit import score
from calibrate.splits import random_holdout

HOLDOUT_FRACTION = 0.15
BAND_TARGET = (0.70, 0.92)
# The in-use version's rows must be rebuilt almost entirely to refit it; otherwise its recorded metrics are
# all there is to compare with (and the comparison says so).
MIN_REBUILT_SHARE = 0.9
SAME_ROWS = "same rows"  # the basis when the in-use version was trained on the candidate's very rows

LOWER_IS_BETTER = ("throughput_mdape", "throughput_mape")
HIGHER_IS_BETTER = ("failure_balanced_accuracy",)

FitFunction = Callable[..., Any]  # calibrate.fit.fit_models(table, sample_weight, *, seed) -> models


@dataclass(frozen=True)
class Verdict:
    not_worse: bool
    reasons: list[str]  # one line per metric that decided it


@dataclass
class Comparison:
    against: str | None  # the version in use when the candidate was fitted
    basis: str  # how the in-use side was measured (see `start_comparison`)
    test_rows: int
    candidate: dict[str, float]
    incumbent: dict[str, float] | None
    not_worse: bool
    reasons: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Incumbent:
    """What the comparison needs of the version in use."""

    version: str
    row_hashes: frozenset[str]
    recorded_metrics: Mapping[str, float]


def band_gap(coverage: float) -> float:
    """How far a band coverage is outside the target range (0 inside it)."""
    low, high = BAND_TARGET
    return max(0.0, low - coverage, coverage - high)


def not_worse(candidate: Mapping[str, float], incumbent: Mapping[str, float], tolerance: float) -> Verdict:
    reasons: list[str] = []
    ok = True

    def judge(name: str, cand: float, inc: float, worse: bool) -> None:
        nonlocal ok
        if _missing(cand) or _missing(inc):
            ok = False
            reasons.append(f"{name}: cannot be measured (candidate {cand}, in use {inc})")
            return
        ok = ok and not worse
        reasons.append(f"{name}: {cand:.4f} vs {inc:.4f} in use -> {'WORSE' if worse else 'ok'}")

    for name in LOWER_IS_BETTER:
        cand, inc = candidate.get(name, math.nan), incumbent.get(name, math.nan)
        judge(name, cand, inc, cand > inc + tolerance)
    for name in HIGHER_IS_BETTER:
        cand, inc = candidate.get(name, math.nan), incumbent.get(name, math.nan)
        judge(name, cand, inc, cand < inc - tolerance)
    cand_cov, inc_cov = candidate.get("band_coverage", math.nan), incumbent.get("band_coverage", math.nan)
    if _missing(cand_cov) or _missing(inc_cov):
        judge("band_coverage", cand_cov, inc_cov, True)
    else:
        judge("band_coverage", cand_cov, inc_cov, band_gap(cand_cov) > band_gap(inc_cov) + tolerance)
    return Verdict(ok, reasons)


def start_comparison(
    union: TrainingData,
    candidate_rows: np.ndarray,
    incumbent: Incumbent | None,
    *,
    fit: FitFunction,
    seed: int,
    tolerance: float,
    executor: Executor | None = None,
) -> Callable[[], Comparison]:
    """The candidate's held-out metrics and whether it is not worse than the version in use, begun: the fits
    go to `executor` (a calibration gives each side a process of its own, so that the version in use is
    refitted beside the candidate, not after it) or run now without one; the function returned waits for
    them and gives the comparison.

    `union` holds the candidate's rows (mask `candidate_rows`) and whatever of the in-use version's rows
    could be rebuilt. Basis of the in-use side, in order of preference:
    - "same rows": it was trained on exactly the candidate's rows, so its refit is the candidate's;
    - "same split": refitted on its own rows of the training split, scored on the same held-out rows;
    - "recorded": too few of its rows could be rebuilt, so its metrics recorded at its fit are used.
    """
    split = random_holdout(union.table, fraction=HOLDOUT_FRACTION, seed=seed)
    test = np.zeros(len(union), dtype=bool)
    test[split.test] = True
    test_table = union.table[test].reset_index(drop=True)
    n_test = int(test.sum())
    basis, incumbent_train = _incumbent_basis(union, candidate_rows, incumbent, test)

    def start(train: np.ndarray) -> Future[dict[str, float]]:
        if executor is not None:
            return executor.submit(_fit_and_score, union, train, test_table, fit=fit, seed=seed)
        done: Future[dict[str, float]] = Future()
        done.set_result(_fit_and_score(union, train, test_table, fit=fit, seed=seed))
        return done

    candidate_side = start(~test & candidate_rows)
    incumbent_side = start(incumbent_train) if incumbent_train is not None else None

    def finish() -> Comparison:
        candidate_metrics = candidate_side.result() | {"n_test": n_test}
        if incumbent is None:
            return Comparison(None, basis, n_test, candidate_metrics, None, True)
        if incumbent_side is not None:
            incumbent_metrics = incumbent_side.result() | {"n_test": n_test}
        elif basis == SAME_ROWS:
            incumbent_metrics = dict(candidate_metrics)
        else:
            incumbent_metrics = {k: float(v) for k, v in incumbent.recorded_metrics.items()}
        verdict = not_worse(candidate_metrics, incumbent_metrics, tolerance)
        return Comparison(
            incumbent.version, basis, n_test, candidate_metrics, incumbent_metrics, verdict.not_worse,
            verdict.reasons,
        )  # fmt: skip

    return finish


def _incumbent_basis(
    union: TrainingData, candidate_rows: np.ndarray, incumbent: Incumbent | None, test: np.ndarray
) -> tuple[str, np.ndarray | None]:
    """How the in-use side is measured (`start_comparison`), and its training rows when it is refitted."""
    if incumbent is None:
        return "nothing in use", None
    incumbent_rows = np.isin(union.row_hashes, list(incumbent.row_hashes))
    rebuilt = len(set(union.row_hashes[incumbent_rows])) / max(len(incumbent.row_hashes), 1)
    if rebuilt < MIN_REBUILT_SHARE:
        return f"recorded (only {rebuilt:.0%} of its rows could be rebuilt)", None
    if np.array_equal(incumbent_rows, candidate_rows):
        return SAME_ROWS, None
    return "same split", ~test & incumbent_rows


def _fit_and_score(
    union: TrainingData, train: np.ndarray, test_table: pd.DataFrame, *, fit: FitFunction, seed: int
) -> dict[str, float]:
    if not train.any():
        return {"n_train": 0}
    model = fit(union.table[train].reset_index(drop=True), union.weights[train], seed=seed)
    result = score(model, test_table)
    result["n_train"] = int(train.sum())
    return result


def _missing(value: float) -> bool:
    return value is None or not math.isfinite(float(value))


def manual_verdict(
    candidate: Mapping[str, Any], in_use: Mapping[str, Any] | None, tolerance: float
) -> tuple[Verdict, str]:
    """Whether an operator may promote a version (from the two versions' metadata), and on what basis.

    The comparison made when the candidate was fitted is used if it was made against the version in use
    now (same rows, same split); otherwise the two versions' recorded held-out metrics are compared, which
    is weaker (different rows) and said so.
    """
    if in_use is None:
        return Verdict(True, ["nothing is in use"]), "nothing in use"
    recorded = candidate.get("comparison") or {}
    if recorded.get("against") == in_use.get("version") and recorded.get("incumbent"):
        return Verdict(bool(recorded.get("not_worse")), list(recorded.get("reasons", []))), (
            f"the comparison made at its fit ({recorded.get('basis')})"
        )
    verdict = not_worse(
        _floats(candidate.get("heldout_metrics")), _floats(in_use.get("heldout_metrics")), tolerance
    )
    return verdict, "recorded held-out metrics of each version (on different rows)"


def _floats(metrics_: Any) -> dict[str, float]:
    if not isinstance(metrics_, Mapping):
        return {}
    return {
        k: (math.nan if v is None else float(v))
        for k, v in metrics_.items()
        if isinstance(v, int | float) or v is None
    }
