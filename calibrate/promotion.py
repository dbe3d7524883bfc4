"""When a new model version may replace the one in use: held-out metrics, compared fairly.

"Not worse", precisely: on the same held-out rows, the candidate's
- throughput MdAPE and MAPE are not higher than the in-use version's by more than `tolerance`,
- runtime-failure balanced accuracy is not lower by more than `tolerance`,
- p10-p90 band coverage is not further from the target range [0.70, 0.92] by more than `tolerance`;
a metric that cannot be measured on either side (no such rows) fails the comparison.

Fair, precisely: both versions are judged by the same procedure on the same rows that neither was trained
on. The rows are the union of the candidate's training rows and the in-use version's (rebuilt from its row
fingerprints); 15 % of them are held out, chosen by each row's fingerprint and the seed
(`calibrate.splits.hashed_holdout`), so a row is held out in every comparison that holds it. Each side is
fitted on its own rows of the other 85 % and scored on the held-out 15 %. Scoring the in-use artifact itself
on rows it trained on would flatter it (in-sample) and a refit of the same data could never win.

The candidate's fit is kept with the version (`calibrate.registry`): when a later version is compared with
it on a split of the same kind and seed, with the same libraries, that fit is scored on the new held-out
rows instead of fitting the in-use side again: it was fitted on exactly its rows of the training split (with
the weights they had then), and none of the held-out rows is among them. A refit against the version in use
then costs two fits, not three: on 30,920 rows, 13.0-16.5 s against 21.8-22.7 s. The kept fit is scored by
the calibrating process while the candidate's fit runs in its worker. A version keeps ~11 MB more for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibrate.dataset import TrainingData
from calibrate.fit import score
from calibrate.registry import ModelRegistry, write_parts
from calibrate.splits import hashed_holdout
from calibrate.too_few_runs import TooFewRuns

HOLDOUT_FRACTION = 0.15
BAND_TARGET = (0.70, 0.92)
# The in-use version's rows must be rebuilt almost entirely to refit it; otherwise its recorded metrics are
# all there is to compare with (and the comparison says so).
MIN_REBUILT_SHARE = 0.9
SAME_ROWS = "same rows"  # the basis when the in-use version was trained on the candidate's very rows
KEPT_FIT = "same split, its kept fit"  # ... when its comparison fit on a split of the same kind is scored
# How the held-out rows are chosen, recorded with each comparison: a version's kept fit is scored again only
# on a split of the same kind (and seed and share), never on rows it may have trained on.
SPLIT_SCHEME = "row-hash-v1"
UNMEASURED = "unmeasured"  # the key of a comparison fit's result that says why it could not be made

LOWER_IS_BETTER = ("throughput_mdape", "throughput_mape")
HIGHER_IS_BETTER = ("failure_balanced_accuracy",)

FitFunction = Callable[..., Any]  # calibrate.fit.fit_models(table, sample_weight, *, seed, power) -> models


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
    split: dict[str, Any] = field(default_factory=dict)  # `split_of(seed)`: how the held-out rows were chosen
    # Why the candidate has no held-out metrics, where its fit on the split's training part could not be
    # made (`calibrate.too_few_runs.TooFewRuns`); None where it has them.
    unmeasured: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class KeptFit:
    """Where a version's comparison fit is (`calibrate.registry.ModelRegistry.load_comparison_fit`), and how
    many rows it was fitted on."""

    registry_root: Path
    version: str
    manifest_sha256: str | None
    n_train: int


@dataclass(frozen=True)
class Incumbent:
    """What the comparison needs of the version in use."""

    version: str
    row_hashes: frozenset[str]
    recorded_metrics: Mapping[str, float]
    kept_fit: KeptFit | None = None  # its comparison fit, where it can be scored on this comparison's split


def split_of(seed: int) -> dict[str, Any]:
    """The description of a comparison's split that a kept fit must match to be scored on it."""
    return {"scheme": SPLIT_SCHEME, "seed": seed, "fraction": HOLDOUT_FRACTION}


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
    keep: Path | None = None,
) -> Callable[[], Comparison]:
    """The candidate's held-out metrics and whether it is not worse than the version in use, begun: the fits
    go to `executor` (a calibration gives each side a process of its own, so that the version in use is
    refitted beside the candidate, not after it) or run now without one; the function returned scores a
    kept fit, waits for the fits and gives the comparison. `keep`: an empty directory where the candidate's
    fit is written (`calibrate.registry.write_parts`) for later comparisons.

    `union` holds the candidate's rows (mask `candidate_rows`) and whatever of the in-use version's rows
    could be rebuilt. Basis of the in-use side, in order of preference:
    - "same rows": it was trained on exactly the candidate's rows, so its refit is the candidate's;
    - "same split, its kept fit": its comparison fit, made on a split of the same kind, scored on the same
      held-out rows;
    - "same split": refitted on its own rows of the training split, scored on the same held-out rows;
    - "recorded": too few of its rows could be rebuilt, so its metrics recorded at its fit are used.
    """
    split = hashed_holdout(union.row_hashes, fraction=HOLDOUT_FRACTION, seed=seed)
    test = np.zeros(len(union), dtype=bool)
    test[split.test] = True
    test_table = union.table[test].reset_index(drop=True)
    n_test = int(test.sum())
    basis, incumbent_train = _incumbent_basis(union, candidate_rows, incumbent, test)

    def run(task: Callable[..., dict[str, float]], *args: Any, **kwargs: Any) -> Future[dict[str, float]]:
        if executor is not None:
            return executor.submit(task, *args, **kwargs)
        done: Future[dict[str, float]] = Future()
        done.set_result(task(*args, **kwargs))
        return done

    candidate_side = run(_fit_and_score, union, ~test & candidate_rows, test_table, fit=fit, seed=seed,
                         keep=keep)  # fmt: skip
    incumbent_side = None
    if incumbent_train is not None:
        incumbent_side = run(_fit_and_score, union, incumbent_train, test_table, fit=fit, seed=seed)

    def finish() -> Comparison:
        kept = incumbent.kept_fit if basis == KEPT_FIT and incumbent is not None else None
        # Scored here, while the candidate's fit may still run: ~1.3 s of loading and predicting in the
        # caller, who has scikit-learn and skops loaded already, where a worker process of its own would
        # first spend ~2 s importing them beside the two fits.
        kept_metrics = _score_kept_fit(kept, test_table) if kept is not None else None
        candidate_metrics = candidate_side.result() | {"n_test": n_test}
        unmeasured = candidate_metrics.pop(UNMEASURED, None)
        if incumbent is None:
            return Comparison(
                None,
                basis,
                n_test,
                candidate_metrics,
                None,
                True,
                split=split_of(seed),
                unmeasured=unmeasured,
            )
        if kept_metrics is not None:
            incumbent_metrics = kept_metrics | {"n_test": n_test}
        elif incumbent_side is not None:
            incumbent_metrics = incumbent_side.result() | {"n_test": n_test}
            incumbent_metrics.pop(UNMEASURED, None)  # its metrics are missing: "cannot be measured"
        elif basis == SAME_ROWS:
            incumbent_metrics = dict(candidate_metrics)
        else:
            incumbent_metrics = {k: float(v) for k, v in incumbent.recorded_metrics.items()}
        verdict = not_worse(candidate_metrics, incumbent_metrics, tolerance)
        return Comparison(
            incumbent.version, basis, n_test, candidate_metrics, incumbent_metrics, verdict.not_worse,
            verdict.reasons, split_of(seed), unmeasured,
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
    same_rows = np.array_equal(incumbent_rows, candidate_rows)
    # The kept fit was fitted on all its rows of the split, whether or not they could be rebuilt here; only
    # on exactly the candidate's rows is the candidate's own fit as good (and already made).
    if incumbent.kept_fit is not None and not (same_rows and rebuilt == 1.0):
        return KEPT_FIT, None
    if rebuilt < MIN_REBUILT_SHARE:
        return f"recorded (only {rebuilt:.0%} of its rows could be rebuilt)", None
    if same_rows:
        return SAME_ROWS, None
    return "same split", ~test & incumbent_rows


def _fit_and_score(
    union: TrainingData,
    train: np.ndarray,
    test_table: pd.DataFrame,
    *,
    fit: FitFunction,
    seed: int,
    keep: Path | None = None,
) -> dict[str, Any]:
    if not train.any():
        return {"n_train": 0}
    # Without the power model: `score` compares no power, and its fits would cost each side ~0.6 s of CPU.
    try:
        model = fit(union.table[train].reset_index(drop=True), union.weights[train], seed=seed, power=False)
    except TooFewRuns as exc:  # the version had enough rows, the split's training part has not
        return {"n_train": int(train.sum()), UNMEASURED: str(exc)}
    result = score(model, test_table)
    result["n_train"] = int(train.sum())
    if keep is not None:
        write_parts(model, keep)
    return result


def _score_kept_fit(kept: KeptFit, test_table: pd.DataFrame) -> dict[str, float]:
    """A version's kept comparison fit, loaded (verified, trusted types only) and scored."""
    model = ModelRegistry(kept.registry_root).load_comparison_fit(kept.version, kept.manifest_sha256)
    return score(model, test_table) | {"n_train": kept.n_train}


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
