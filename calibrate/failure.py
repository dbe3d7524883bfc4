"""The runtime-failure model: the probability that a configuration that passes the admission rules runs
without failing (out of memory, illegal memory access), `p_valid`.

The admission rules themselves are not learned: `twin.domain.broken_rule` applies them exactly. This model
sees only rows that pass them.

Gradient-boosted trees on the memory physics of `calibrate.features` (state, activations and logits per GPU
against its memory), cross-fitted: each of a few members is trained on all folds but one and calibrated
(Platt scaling) on the fold it did not see; `p_valid` is the mean of the calibrated members. That gives
calibrated probabilities without a separate calibration set and smooths the trees a little.

`p_valid_low` is a lower bound on the chance to run, for advice an operator can follow (issue 14): the
weakest member's p_valid, mapped through a bound calibrated on out-of-fold data. Every row is held out from
exactly one member; its calibrated prediction there is binned, and each bin's share of rows that ran gets its
one-sided Clopper-Pearson lower bound (95 %). The bound's knots are made monotone (a higher prediction never
gets a lower bound) and the result is capped at the point estimate.

Those folds are random, so nearly every held-out row has rows of its LLM and method in its member's
training rows: the bound they give holds there, and is too kind where they lack them (on held-out blocks of
the benchmark, 92 % of repairs in unseen regions ran against 100 % in seen ones; the ones that failed were
of an LLM and method the block's training rows never had: llama3.1-405b with GPTQ-LoRA, known only from
LoRA, and granite-4.0 models never seen at all). The method changes what a GPU holds (16 bytes of state per
parameter for full fine-tuning, 2 for LoRA, 0.55 for GPTQ-LoRA) and which kernels run, so an LLM never
tuned with a method is new ground for the memory physics. A second bound is fitted for such novel pairs, on
predictions for contiguous blocks of the rows (the table is sorted by configuration) from members that
never saw the block, counting only held-out rows whose LLM and method their member's training rows lacked;
`predict_with_low(X, novel)` uses it for the rows the caller says are novel (`novel(model_names,
methods)`). Not the protocol or the GPU: a question about a job has no protocol of the benchmark, and a
known LLM and method on another GPU is still well predicted.

`error_correlation` is how much of the model's error an error family (`twin.families`) shares, for the twin's
ensembles (issue 12): failures are not independent coin flips when the model misjudges the memory of a whole
model, method and GPU. It is the intra-family correlation of the standardized out-of-fold residuals
(ran - p) / sqrt(p (1 - p)), measured by `calibrate.correlation.shared_share` as for throughput. The random
folds see the error where the members know the family (0.02-0.04 on the bundled sample); for an LLM-method
pair the version never saw, `novel_error_correlation` is measured on the novel bound's held-out blocks,
over the rows of pairs their member lacked (0.45 on the sample: a whole novel family is misjudged at once).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from calibrate import boosting
from calibrate.compiled import CompiledTrees
from calibrate.correlation import Z_CLIP, shared_share
from calibrate.encoding import columns
from calibrate.features import MEMORY_FEATURES
from calibrate.loader import each_distinct
from calibrate.too_few_runs import TooFewRuns
from twin.domain import name_key

if TYPE_CHECKING:  # imported where the model is fitted: predicting from compiled trees never needs them
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression

# A random 30 % of the features at each split: with many overlapping memory features, it keeps the trees
# from leaning on one proxy (better balanced accuracy on unseen blocks of the benchmark).
CLASSIFIER_PARAMS: dict[str, Any] = {
    "max_iter": 100,
    "learning_rate": 0.15,
    "max_leaf_nodes": 15,
    "min_samples_leaf": 10,
    "max_features": 0.3,
    "early_stopping": False,
}
MEMBERS = 4
# Each member trains on at most this many rows (a different random subset each), which bounds the fit time
# on the full benchmark; together the members still see most rows.
MEMBER_MAX_TRAIN_ROWS = 8000
VALID_THRESHOLD = 0.5  # p_valid at or above: predicted to run
_EPSILON = 1e-6
# The lower bound: one-sided confidence of each bin's Clopper-Pearson bound, and rows per bin (enough rows
# that a bin of all-valid runs earns a bound near its prediction, few enough to follow the curve).
LOWER_BOUND_CONFIDENCE = 0.95
LOWER_BOUND_BIN_ROWS = 200
# The novel bound: contiguous blocks held out one at a time, and the held-out rows of novel LLM-method pairs
# it needs at least (fewer: the one bound for all rows).
NOVEL_BLOCKS = 3
MIN_NOVEL_ROWS = 2 * LOWER_BOUND_BIN_ROWS
# Residuals of predictions this sure are not standardized beyond it: a 1-in-1000 surprise is one surprise,
# not evidence that a whole family is misjudged.
_RESIDUAL_P_FLOOR = 0.02
_MEMORY_COLUMNS = columns(MEMORY_FEATURES)


@dataclass
class RuntimeFailureModel:
    members: list[HistGradientBoostingClassifier]
    # One per member: logit(member's p) -> calibrated p; as (slope, intercept) where the version was loaded
    # from its serving snapshot (`calibrate.serving`), without scikit-learn.
    calibrators: list[LogisticRegression | tuple[float, float]]
    # (predicted p, lower bound) knots fitted on out-of-fold predictions; None for models saved before them,
    # which then bound by the weakest member alone.
    lower_bound: tuple[list[float], list[float]] | None = None
    # Share of the (standardized) error shared within an error family; 0: independent (older versions).
    error_correlation: float = 0.0
    # The lower bound's knots for LLM-method pairs the training rows lack; None: `lower_bound` for all.
    novel_lower_bound: tuple[list[float], list[float]] | None = None
    # The LLM-method pairs ("model|method") of the training rows, to tell a novel one.
    known_pairs: frozenset[str] = frozenset()
    # The share of error a family shares where its LLM-method pair is novel; None: `error_correlation` for
    # all (versions saved before it).
    novel_error_correlation: float | None = None

    def __post_init__(self) -> None:
        self._compiled = [CompiledTrees(member) for member in self.members]
        # Platt scaling is one logistic function: its two numbers, not a scikit-learn call per member.
        self._platt = [
            (float(c[0]), float(c[1]))
            if isinstance(c, tuple)
            else (float(c.coef_[0, 0]), float(c.intercept_[0]))
            for c in self.calibrators
        ]

    def platt(self) -> list[tuple[float, float]]:
        """Each member's calibration as (slope, intercept) of the logistic function."""
        return list(self._platt)

    def compiled_trees(self) -> list[CompiledTrees]:
        return list(self._compiled)

    def predict(self, X: np.ndarray, *, reference: bool = False) -> np.ndarray:
        """p_valid per row of the encoded feature matrix. `reference`: through scikit-learn instead of the
        compiled trees and the closed-form calibration (the same numbers, slower)."""
        return np.mean(self.member_predictions(X, reference=reference), axis=0)

    def predict_with_low(
        self, X: np.ndarray, novel: np.ndarray | None = None, *, reference: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """(p_valid, p_valid_low) per row; p_valid_low <= p_valid. `novel`: rows of LLM-method pairs the
        training rows lack, bounded by the novel bound where the version has one."""
        members = self.member_predictions(X, reference=reference)
        point = np.mean(members, axis=0) if len(members) else np.zeros(0)
        weakest = np.min(members, axis=0) if members.size else np.zeros(0)
        low = weakest
        if self.lower_bound is not None:
            knots_p, knots_low = self.lower_bound
            low = np.interp(weakest, knots_p, knots_low)
        if self.novel_lower_bound is not None and novel is not None and np.any(novel):
            knots_p, knots_low = self.novel_lower_bound
            novel = np.asarray(novel, dtype=bool)
            low = np.where(novel, np.minimum(low, np.interp(weakest, knots_p, knots_low)), low)
        return point, np.minimum(low, point)

    def novel(self, model_names: np.ndarray, methods: np.ndarray) -> np.ndarray:
        """Whether each row's LLM and method are a pair the training rows lack (all False when the version
        does not know its pairs: saved before the novel bound)."""
        if not self.known_pairs:
            return np.zeros(len(model_names), dtype=bool)
        return ~np.isin(model_method(model_names, methods), list(self.known_pairs))

    def error_correlation_of(self, novel: np.ndarray) -> np.ndarray:
        """The share of error each row's family shares: the novel pairs' where the row's pair is novel."""
        novel = np.asarray(novel, dtype=bool)
        novel_share = self.novel_error_correlation
        shared = self.error_correlation if novel_share is None else novel_share
        return np.where(novel, shared, self.error_correlation).astype(float)

    def member_predictions(self, X: np.ndarray, *, reference: bool = False) -> np.ndarray:
        """(members, n) calibrated p_valid of each member."""
        if len(X) == 0:
            return np.zeros((len(self.members), 0))
        X = X[:, _MEMORY_COLUMNS]
        if reference:
            return np.array(
                [
                    calibrator.predict_proba(_logit(member.predict_proba(X)[:, 1]))[:, 1]
                    for member, calibrator in zip(self.members, self.calibrators, strict=True)
                ]
            )
        return np.array(
            [
                _sigmoid(slope * _logit(trees.predict(X))[:, 0] + intercept)
                for trees, (slope, intercept) in zip(self._compiled, self._platt, strict=True)
            ]
        )


def fit_failure(
    X: np.ndarray, ran: np.ndarray, weight: np.ndarray | None, *, seed: int,
    families: np.ndarray | None = None, pairs: np.ndarray | None = None,
) -> RuntimeFailureModel:  # fmt: skip
    """Fit on rows (of the encoded feature matrix) that pass the admission rules; `ran` is True for valid
    runs, False for runtime failures; `families`, each row's error family (to measure shared error);
    `pairs`, each row's LLM and method (`model_method`, for the novel bound)."""
    ran = np.asarray(ran, dtype=bool)
    counts = np.bincount(ran.astype(int), minlength=2)
    if counts.min() < MEMBERS:
        raise TooFewRuns(
            f"need at least {MEMBERS} valid runs and {MEMBERS} runtime failures to fit the failure model, "
            f"got {counts[1]} and {counts[0]}"
        )
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold

    X = X[:, _MEMORY_COLUMNS]
    folds = StratifiedKFold(MEMBERS, shuffle=True, random_state=seed).split(np.zeros(len(ran)), ran)
    members: list[HistGradientBoostingClassifier] = []
    calibrators: list[LogisticRegression] = []
    out_of_fold = np.full(len(ran), np.nan)
    rng = np.random.default_rng(seed)
    for k, (train, held_out) in enumerate(folds):
        if len(train) > MEMBER_MAX_TRAIN_ROWS:
            train = np.sort(rng.choice(train, MEMBER_MAX_TRAIN_ROWS, replace=False))
        member = boosting.classifier(MEMORY_FEATURES, seed + k, CLASSIFIER_PARAMS)
        member.fit(
            boosting.trainable(X[train], MEMORY_FEATURES),
            ran[train],
            sample_weight=None if weight is None else weight[train],
        )
        scores = _logit(member.predict_proba(X[held_out])[:, 1])
        calibrator = LogisticRegression(C=100.0).fit(
            scores, ran[held_out], sample_weight=None if weight is None else weight[held_out]
        )
        out_of_fold[held_out] = calibrator.predict_proba(scores)[:, 1]
        members.append(member)
        calibrators.append(calibrator)
    correlation = failure_error_correlation(out_of_fold, ran, families) if families is not None else 0.0
    bound = fit_lower_bound(out_of_fold, ran)
    novel_bound = None
    novel_correlation = None
    known: frozenset[str] = frozenset()
    if pairs is not None:
        pairs = np.asarray(pairs).astype(str)
        predicted, outcome, rows = _novel_pair_predictions(X, ran, weight, pairs, seed=seed)
        if len(rows) >= MIN_NOVEL_ROWS:
            novel_bound = fit_lower_bound(predicted, outcome)
            if families is not None:
                # A novel pair's family never shares less than a known one's (the members learned less).
                shared = failure_error_correlation(predicted, outcome, np.asarray(families)[rows])
                novel_correlation = max(shared, correlation)
        known = frozenset(str(p) for p in pairs)
    return RuntimeFailureModel(
        members, calibrators, bound, correlation, novel_bound, known, novel_correlation
    )


def model_method(model_names: np.ndarray, methods: np.ndarray) -> np.ndarray:
    """'model|method' per row, each as the features read it (trimmed, lower-cased): the pairs the novel bound
    is about. As written, 'Llama3-8B' with full fine-tuning was a pair the version never saw, and its advice
    took the novel bound (0.64 where llama3-8b's was 0.97), for the same p_valid."""
    names = each_distinct(np.asarray(model_names, dtype=object), name_key).astype(str)
    kinds = each_distinct(np.asarray(methods, dtype=object), name_key).astype(str)
    return np.char.add(np.char.add(names, "|"), kinds)


def _novel_pair_predictions(
    X: np.ndarray, ran: np.ndarray, weight: np.ndarray | None, pairs: np.ndarray, *, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(calibrated p_valid, ran, row) of contiguous blocks' held-out rows whose LLM and method the block's
    member never saw: what the novel bound's knots and the novel pairs' shared error are measured on. Each
    block's member is made as the members are: trained on all but a random 1/MEMBERS of the other rows and
    calibrated on that part, so that its predictions are like theirs and the knots map their weakest
    prediction to what held for novel pairs."""
    from sklearn.linear_model import LogisticRegression

    n = len(ran)
    part = np.arange(n) * NOVEL_BLOCKS // n
    predicted: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    rng = np.random.default_rng(seed + 1)
    for k in range(NOVEL_BLOCKS):
        held_out, rest = np.flatnonzero(part == k), rng.permutation(np.flatnonzero(part != k))
        novel = held_out[~np.isin(pairs[held_out], pairs[rest])]
        calibration, train = rest[: len(rest) // MEMBERS], np.sort(rest[len(rest) // MEMBERS :])
        if len(novel) == 0 or len(set(ran[train])) < 2 or len(set(ran[calibration])) < 2:
            continue
        if len(train) > MEMBER_MAX_TRAIN_ROWS:
            train = np.sort(rng.choice(train, MEMBER_MAX_TRAIN_ROWS, replace=False))
        member = boosting.classifier(MEMORY_FEATURES, seed + MEMBERS + k, CLASSIFIER_PARAMS)
        member.fit(
            boosting.trainable(X[train], MEMORY_FEATURES),
            ran[train],
            sample_weight=None if weight is None else weight[train],
        )
        calibrator = LogisticRegression(C=100.0).fit(
            _logit(member.predict_proba(X[calibration])[:, 1]), ran[calibration]
        )
        predicted.append(calibrator.predict_proba(_logit(member.predict_proba(X[novel])[:, 1]))[:, 1])
        rows.append(novel)
    if not rows:
        return np.zeros(0), np.zeros(0, dtype=bool), np.zeros(0, dtype=np.intp)
    found = np.concatenate(rows)
    return np.concatenate(predicted), ran[found], found


def failure_error_correlation(predicted: np.ndarray, ran: np.ndarray, families: np.ndarray) -> float:
    """The intra-family correlation of standardized out-of-fold residuals (0 with too few families)."""
    p = np.clip(np.asarray(predicted, dtype=float), _RESIDUAL_P_FLOOR, 1.0 - _RESIDUAL_P_FLOOR)
    z = np.clip((np.asarray(ran, dtype=float) - p) / np.sqrt(p * (1.0 - p)), -Z_CLIP, Z_CLIP)
    share = shared_share(z, np.asarray(families))
    return round(float(share), 4) if share is not None else 0.0


def fit_lower_bound(
    predicted: np.ndarray, ran: np.ndarray, *, bin_rows: int = LOWER_BOUND_BIN_ROWS
) -> tuple[list[float], list[float]]:
    """Knots (predicted p, lower bound on the share that ran) from out-of-fold predictions: bins of
    `bin_rows` rows by predicted p, each bin's one-sided Clopper-Pearson lower bound, monotone."""
    from scipy.stats import beta

    order = np.argsort(predicted, kind="stable")
    p, ok = np.asarray(predicted, dtype=float)[order], np.asarray(ran, dtype=bool)[order]
    n_bins = max(1, len(p) // bin_rows)
    knots_p: list[float] = []
    knots_low: list[float] = []
    for chunk_p, chunk_ok in zip(np.array_split(p, n_bins), np.array_split(ok, n_bins), strict=True):
        k, n = int(chunk_ok.sum()), len(chunk_ok)
        low = float(beta.ppf(1 - LOWER_BOUND_CONFIDENCE, k, n - k + 1)) if k > 0 else 0.0
        knots_p.append(float(chunk_p.mean()))
        knots_low.append(low)
    # Monotone and conservative: a bin's bound is the least of its own and every bin above it.
    monotone = np.minimum.accumulate(np.asarray(knots_low)[::-1])[::-1]
    return [0.0, *knots_p, 1.0], [0.0, *map(float, monotone), float(monotone[-1])]


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, _EPSILON, 1.0 - _EPSILON)
    return np.log(p / (1.0 - p)).reshape(-1, 1)
