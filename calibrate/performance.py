"""The throughput model: whole-job `dataset_tokens_per_second` with an adaptive p10-p90 band.

A gradient-boosted regressor learns log(tokens/s) minus the physics bound of `calibrate.features`
(`log_physics_tokens_per_second`): an efficiency, which carries over to model sizes and GPU counts the
benchmark never ran, where a model of raw names would be lost.

The band is normalized split conformal: out-of-fold residuals (from random folds and from contiguous blocks
of the table, so that some rows are of configuration regions their fold never saw) teach a second,
small regressor how large the error is where (the difficulty: log |residual| from the features plus how
many training rows share the row's region, its siblings and its configuration); the band is the prediction
plus the residual-over-difficulty quantiles times the row's difficulty. Narrow where the model has seen many
neighbours, wide where it has not, with the coverage of the quantiles. The quantiles are kept apart by
novelty level: whether the training rows hold the configuration's region (the same model under the same
protocol) and, if they do, one of its siblings (the same GPU count and sequence length).

The same out-of-fold residuals, in units of each row's band, say how much of the error the rows of one
error family share, and how the error is distributed (`calibrate.correlation`, per novelty level): the
twin's ensembles draw the shared share once per family and run, and read each job's error from that
distribution.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from calibrate import boosting
from calibrate.compiled import CompiledTrees
from calibrate.correlation import error_quantiles, shared_share, standardize
from calibrate.encoding import column, columns
from calibrate.features import CATEGORICAL_FEATURES, FEATURE_NAMES, THROUGHPUT_OFFSET
from calibrate.loader import combined_codes, first_rows
from calibrate.too_few_runs import TooFewRuns
from twin.families import ERROR_QUANTILE_LEVELS

if TYPE_CHECKING:  # imported where the model is fitted: predicting from compiled trees never needs it
    from sklearn.ensemble import HistGradientBoostingRegressor

# Trees on a random half of the features at each split: the physics features carry most of the signal, and
# the block cross-validation (unseen configuration regions) prefers the smoother fit. 1,000 trees of up to 31
# leaves, not 500 of 15: the smaller model underfit (bench/accuracy.py, throughput MdAPE on random rows /
# unseen blocks: 500x15 4.47 / 8.85 %, 1000x15 3.77 / 8.61, 700x31 3.62 / 8.80, 1000x31 3.45 / 8.75 %),
# for ~2 s more of the final fit on the full benchmark and ~1 ms more per advice answer.
REGRESSOR_PARAMS: dict[str, Any] = {
    "max_iter": 1000,
    "learning_rate": 0.05,
    "max_leaf_nodes": 31,
    "min_samples_leaf": 10,
    "max_features": 0.5,
    "early_stopping": False,
}
# The random folds' fits are the final model's: their residuals size the band of a seen region, and a weaker
# model's errors made it too wide. bench/accuracy.py, coverage / median width / interval score: random rows
# 0.87 / 0.20 / 0.599 with the cheap fits below, 0.83 / 0.165 / 0.594 with these; with 500 trees at 0.1 (half
# their CPU: +2 s against +3.9 s per fit on 30,920 rows) 0.85 / 0.17 / 0.600, but unseen blocks' interval
# score rose to 1.73 from 1.60. The block folds' fits, which only say how much larger the error is in regions
# the trees never saw, take fewer and larger steps (fitted as the final model, blocks' coverage fell to 0.68).
RANDOM_RESIDUAL_PARAMS: dict[str, Any] = REGRESSOR_PARAMS
RESIDUAL_PARAMS: dict[str, Any] = REGRESSOR_PARAMS | {"max_iter": 100, "learning_rate": 0.2}
# The residuals come from a few folds of a split of the rows into RESIDUAL_PARTS parts: random parts, and
# contiguous blocks spread over the table (each fold holds out one part, so its model sees most rows).
RESIDUAL_PARTS = 6
# The fewest valid runs a throughput fit takes: its errors are measured on each part of RESIDUAL_PARTS held
# out in turn, and each fold's fit needs 10 rows (12 - 2 held out). With 10 or 11 runs no fold could be
# fitted, and the calibration failed on an empty list of residuals.
MIN_VALID_RUNS = 12
RANDOM_FOLDS = 2
BLOCK_FOLDS = 3
# Each out-of-fold fit sees at most this many rows, so the band costs no more on the full benchmark than on
# the sample (on 30,920 rows the band is then slightly conservative); there, one random fit stands for all
# the random folds (`_out_of_fold_residuals`).
RESIDUAL_MAX_TRAIN_ROWS = 4000
# The difficulty regressor: few, large-leaved trees (it learns a scale, not a value).
DIFFICULTY_PARAMS: dict[str, Any] = {
    "max_iter": 60,
    "learning_rate": 0.1,
    "max_leaf_nodes": 8,
    "min_samples_leaf": 40,
    "early_stopping": False,
}
# Residuals smaller than this (1 % in tokens/s) are noise between repeats: the difficulty never goes below.
MIN_ABS_RESIDUAL = 0.01
BAND_QUANTILES = (0.10, 0.90)
# Novel configurations take a wider nominal band: the held-out blocks of one table are less novel than the
# regions a prediction meets later, so their residuals understate the error there.
NOVEL_BAND_QUANTILES = (0.05, 0.95)
MIN_RESIDUALS_PER_LEVEL = 30

# Whether the training rows hold the configuration's region: the same model under the same protocol (tuning
# stack, method, GPU, time cap, nodes, RoCE). A model new to a protocol and a new protocol are pooled: the
# benchmark has too few rows of the first kind to size a band of its own.
SEEN_REGION, NEW_REGION = 0, 1
# A seen region's edge: the training rows hold the region but no sibling of the configuration (see
# _SIBLING_KEY), as for a held-out block's rows. Its error is about twice a seen row's and no feature
# told the two apart to the difficulty model, so it takes quantiles of its own.
EDGE_REGION = 2
LEVELS = (SEEN_REGION, EDGE_REGION, NEW_REGION)  # from the narrowest band to the widest
_REGION_KEY = (
    "method",
    "gpu_model",
    "protocol",
    "tuning_version",
    "time_limited",
    "multi_node",
    "enable_roce",
    "model_family",
    "log_params",
)
# The configuration inside its region: rows with the same key are repeats or near-repeats of one job.
_CONFIG_KEY = (*_REGION_KEY, "number_gpus", "number_nodes", "log_batch", "log_tokens", "fast_kernels",
               "expert_parallel")  # fmt: skip
# The configuration's siblings: the same region, GPU count, node count and sequence length (other batch sizes
# or repeats). A row of a seen region without siblings sits at its edge, where the error is larger.
_SIBLING_KEY = (*_REGION_KEY, "number_gpus", "number_nodes", "log_tokens")
_REGION_COLUMNS = columns(_REGION_KEY)
_SIBLING_COLUMNS = columns(_SIBLING_KEY)
_CONFIG_COLUMNS = columns(_CONFIG_KEY)
_OFFSET = column(THROUGHPUT_OFFSET)
DIFFICULTY_FEATURES: tuple[str, ...] = (
    *FEATURE_NAMES, "region_seen", "log_region_rows", "log_config_rows", "log_sibling_rows",
)  # fmt: skip
# A version fitted before the sibling count (params without "sibling_rows") has a difficulty model without
# its column; `neighbourhood` then leaves it out too (no version-specific code: the trees take the columns
# they were fitted on, in order).


@dataclass
class ThroughputModel:
    regressor: HistGradientBoostingRegressor
    difficulty: HistGradientBoostingRegressor  # log |residual| of log(tokens/s)
    band: dict[str, list[float]]  # level -> [low, high] quantiles of residual / difficulty
    region_rows: dict[str, int]  # training rows per region key
    config_rows: dict[str, int]  # training rows per configuration key
    # level -> share of the (standardized) error shared within an error family (twin.families)
    error_correlation: dict[str, float] = field(default_factory=dict)
    # level -> the standardized error at twin.families.ERROR_QUANTILE_LEVELS (absent: a normal's)
    error_quantiles: dict[str, list[float]] = field(default_factory=dict)
    sibling_rows: dict[str, int] | None = None  # training rows per sibling key (None: an older version)
    # level -> [the most negative, the most positive] held-out error of log(tokens/s) (absent: unbounded)
    error_range: dict[str, list[float]] = field(default_factory=dict)
    # level -> [low, high] of log(tokens/s) around p50: the band with one width for every row of a novelty
    # level, the same out-of-fold residuals' quantiles as `band` without the difficulty model (None: an
    # older version). The baseline `bench/accuracy.py` compares the adaptive band with.
    one_width_band: dict[str, list[float]] | None = None

    def __post_init__(self) -> None:
        self._center = CompiledTrees(self.regressor)
        self._difficulty = CompiledTrees(self.difficulty)

    def compiled_trees(self) -> list[CompiledTrees]:
        return [self._center, self._difficulty]

    def predict(self, X: np.ndarray, *, reference: bool = False) -> np.ndarray:
        """(n, 3) tokens/s: p10, p50, p90, for rows of the encoded feature matrix. `reference`: through
        scikit-learn instead of the compiled trees (the same numbers, slower)."""
        if len(X) == 0:
            return np.zeros((0, 3))
        center_trees = self._center.reference_predict if reference else self._center.predict
        scale_trees = self._difficulty.reference_predict if reference else self._difficulty.predict
        center = center_trees(X) + X[:, _OFFSET]
        context = self._neighbourhood(X)
        scale = np.exp(scale_trees(np.column_stack([X, context])))
        level = levels_of(context)
        # A version fitted before the edge level has no band for it (nor, without sibling counts, edge rows).
        low, high = at_levels(self.band, level, self.band[str(SEEN_REGION)]).T
        return np.exp(np.column_stack([center + low * scale, center, center + high * scale]))

    def levels(self, X: np.ndarray) -> np.ndarray:
        """Each row's novelty level (`levels_of`)."""
        return levels_of(self._neighbourhood(X))

    def _neighbourhood(self, X: np.ndarray) -> np.ndarray:
        return neighbourhood(X, self.region_rows, self.config_rows, self.sibling_rows)

    def error_correlation_at(self, levels: np.ndarray) -> np.ndarray:
        """(n,) per row of novelty `levels` (`levels_of`), the share of its error its error family shares
        (0 where it was not measured: independent errors)."""
        return at_levels(self.error_correlation, levels, 0.0)

    def error_quantiles_at(self, levels: np.ndarray) -> np.ndarray:
        """(n, levels) per row of novelty `levels`, its standardized error at ERROR_QUANTILE_LEVELS (a
        normal's where its level's distribution was not measured)."""
        normal = [NormalDist().inv_cdf(level) for level in ERROR_QUANTILE_LEVELS]
        return at_levels(self.error_quantiles, levels, normal)

    def error_range_at(self, levels: np.ndarray) -> np.ndarray:
        """(n, 2) per row of novelty `levels`, the most negative and the most positive error of log(tokens/s)
        held out at its level (-inf, inf where the version did not measure them)."""
        return at_levels(self.error_range, levels, [-np.inf, np.inf])

    def params(self) -> dict[str, Any]:
        return (
            {
                "band": self.band,
                "region_rows": self.region_rows,
                "config_rows": self.config_rows,
                "error_correlation": self.error_correlation,
                "error_quantiles": self.error_quantiles,
                "error_range": self.error_range,
            }
            | ({} if self.sibling_rows is None else {"sibling_rows": self.sibling_rows})
            | ({} if self.one_width_band is None else {"one_width_band": self.one_width_band})
        )

    def one_width_predict(self, X: np.ndarray, p50: np.ndarray) -> np.ndarray | None:
        """(n, 2) tokens/s for rows of the encoded feature matrix: the one-width band's p10 and p90 around
        their predictions `p50` (None for a version fitted before it was recorded)."""
        if self.one_width_band is None:
            return None
        bands = at_levels(self.one_width_band, self.levels(X), self.one_width_band[str(SEEN_REGION)])
        return np.asarray(p50, dtype=float)[:, None] * np.exp(bands)

    @classmethod
    def from_params(
        cls, regressor: HistGradientBoostingRegressor, difficulty: HistGradientBoostingRegressor,
        params: Mapping[str, Any],
    ) -> ThroughputModel:  # fmt: skip
        return cls(
            regressor,
            difficulty,
            {str(k): [float(v) for v in pair] for k, pair in params["band"].items()},
            {str(k): int(v) for k, v in params["region_rows"].items()},
            {str(k): int(v) for k, v in params["config_rows"].items()},
            {str(k): float(v) for k, v in (params.get("error_correlation") or {}).items()},
            {str(k): [float(x) for x in v] for k, v in (params.get("error_quantiles") or {}).items()},
            None if "sibling_rows" not in params
            else {str(k): int(v) for k, v in params["sibling_rows"].items()},
            {str(k): [float(v) for v in pair] for k, pair in (params.get("error_range") or {}).items()},
            None if params.get("one_width_band") is None
            else {str(k): [float(v) for v in pair] for k, pair in params["one_width_band"].items()},
        )  # fmt: skip


def fit_throughput(
    X: np.ndarray,
    tokens_per_second: np.ndarray,
    weight: np.ndarray | None,
    *,
    seed: int,
    families: np.ndarray | None = None,
) -> ThroughputModel:
    """Fit on valid runs: rows of the encoded feature matrix and their measured tokens/s (positive);
    `families`, each row's error family (`twin.families`), to measure how much error a family shares."""
    if len(X) < MIN_VALID_RUNS:
        raise TooFewRuns(f"need at least {MIN_VALID_RUNS} valid runs to fit throughput, got {len(X)}")
    target = np.log(tokens_per_second) - X[:, _OFFSET]
    regressor = boosting.regressor(FEATURE_NAMES, seed, REGRESSOR_PARAMS)
    regressor.fit(boosting.trainable(X, FEATURE_NAMES), target, sample_weight=weight)
    residuals, contexts, rows = _out_of_fold_residuals(X, target, weight, seed=seed)
    levels = levels_of(contexts)
    difficulty, band, scores = _difficulty_and_band(X[rows], contexts, levels, residuals, seed=seed)
    row_families = np.asarray(families)[rows] if families is not None else None
    correlation, quantiles = _error_structure(scores, levels, row_families, band)
    return ThroughputModel(
        regressor, difficulty, band, _counts(keys(X, _REGION_COLUMNS)), _counts(keys(X, _CONFIG_COLUMNS)),
        correlation, quantiles, _counts(keys(X, _SIBLING_COLUMNS)), _error_range(residuals, levels),
        level_quantiles(residuals, levels),
    )  # fmt: skip


def _error_range(residuals: np.ndarray, levels: np.ndarray) -> dict[str, list[float]]:
    """Per novelty level, the most negative and the most positive held-out residual of log(tokens/s): how
    far from its prediction a run of that level has ever been seen to land. The twin draws no further (a
    wide band times a heavy-tailed draw in band units reached runs 24,000 times slower than predicted, where
    the slowest held-out run of the sample was 5.5 times slower). A level with too few residuals takes all
    of them, and each level's range holds the one before it in LEVELS."""
    out: dict[str, list[float]] = {}
    if not len(residuals):
        return out
    previous = [0.0, 0.0]
    for level in LEVELS:
        pool = residuals[levels == level]
        chosen = pool if pool.size >= MIN_RESIDUALS_PER_LEVEL else residuals
        previous = [min(float(chosen.min()), previous[0]), max(float(chosen.max()), previous[1])]
        out[str(level)] = [round(previous[0], 4), round(previous[1], 4)]
    return out


def _error_structure(
    scores: np.ndarray,
    levels: np.ndarray,
    families: np.ndarray | None,
    band: dict[str, list[float]],
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Per novelty level, from the residuals (over each row's difficulty) the level's band came from: the
    share of error a family shares, and the distribution of the error in band units."""
    shares: dict[str, float | None] = {}
    quantiles: dict[str, list[float]] = {}
    for level in LEVELS:
        mask = levels == level
        low, high = band[str(level)]
        raw = standardize(scores[mask], np.full(mask.sum(), low), np.full(mask.sum(), high), clip=None)
        table = error_quantiles(raw)
        if table is not None:
            quantiles[str(level)] = [round(float(x), 4) for x in table]
        clipped = standardize(scores[mask], np.full(mask.sum(), low), np.full(mask.sum(), high))
        shares[str(level)] = shared_share(clipped, families[mask]) if families is not None else None
    if families is None:
        return {}, quantiles
    # A more novel family never shares less error than a less novel one (the model learned less about it);
    # a level without enough families takes the one before it's (seen: 0 when it has none).
    correlation: dict[str, float] = {}
    previous = 0.0
    for level in LEVELS:
        share = shares[str(level)]
        previous = max(share if share is not None else previous, previous)
        correlation[str(level)] = round(previous, 4)
    return correlation, quantiles


def keys(X: np.ndarray, key_columns: np.ndarray) -> np.ndarray:
    """A text key per row from some of its matrix columns (codes and numbers rounded to 3 decimals, hashed
    from their bytes: formatting each number cost more than the trees for an advice-sized call), built
    once per distinct row."""
    distinct, group = _distinct_keys(X, key_columns)
    return distinct[group]


def _distinct_keys(X: np.ndarray, key_columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`keys` as (the key of each distinct row, each row's index into them)."""
    if len(X) == 0:
        return np.zeros(0, dtype=object), np.zeros(0, dtype=np.intp)
    part = np.nan_to_num(np.round(X[:, key_columns], 3), nan=-1.0) + 0.0  # + 0.0: -0.0 is 0.0
    if len(part) <= HASH_EACH_ROW_BELOW:  # an answer's rows: hashing each costs less than grouping them
        return _hashed(part), np.arange(len(part))
    group = _row_groups(part)
    # A row of each group stands for it: equal values (no NaN, no -0.0 left) have equal bytes.
    return _hashed(part[first_rows(group)]), group


def _hashed(rows: np.ndarray) -> np.ndarray:
    """Each row's key: its bytes' 8-byte BLAKE2b digest in hex. The bytes of all rows are taken at once and
    sliced (a `tobytes` per row cost as much as the hashing)."""
    data = np.ascontiguousarray(rows, dtype=np.float64).tobytes()
    width = rows.shape[1] * 8
    return np.array(
        [
            hashlib.blake2b(data[start : start + width], digest_size=8).hexdigest()
            for start in range(0, len(data), width)
        ],
        dtype=object,
    )


# Up to this many rows, `keys` hashes every row (~0.6 µs each) rather than grouping equal rows first (~0.6 ms
# of factorize calls whatever the rows, which pays off on a CSV's thousands of repeats).
HASH_EACH_ROW_BELOW = 1_000


def _row_groups(part: np.ndarray) -> np.ndarray:
    """A group number per row, equal for rows with equal values (no NaN: `keys` replaced them). Column by
    column on integer codes, hashed rather than sorted: `np.unique(axis=0)` sorts the rows as opaque byte
    strings, and even column by column np.unique's sorts cost ~0.25 s per key on 100,000 distinct
    configurations, where pandas' hash tables take ~0.02 s."""
    return combined_codes((pd.factorize(part[:, j]) for j in range(part.shape[1])), len(part))


def at_levels(table: Mapping[str, Any], levels: np.ndarray, default: Any) -> np.ndarray:
    """Per row of novelty `levels`, its level's entry of `table` (keyed by the level's number as text;
    `default` where the version has none): (n,) for numbers, (n, k) for lists of k. Indexed by the level's
    number, not its place in LEVELS (which runs 0, 2, 1 from the narrowest band to the widest)."""
    entries = np.array([table.get(str(k), default) for k in range(len(LEVELS))], dtype=float)
    return entries[np.asarray(levels, dtype=np.intp)]


def levels_of(context: np.ndarray) -> np.ndarray:
    """Each row's novelty level from its `neighbourhood`: NEW_REGION when the training rows do not hold its
    region, EDGE_REGION when they hold it but none of its siblings, else SEEN_REGION (a context without the
    sibling count, of an older version, has no edge)."""
    seen = context[:, 0] == 1.0
    edge = seen & (context[:, 3] == 0.0) if context.shape[1] > 3 else np.zeros(len(context), dtype=bool)
    return np.where(seen, np.where(edge, EDGE_REGION, SEEN_REGION), NEW_REGION)


def neighbourhood(
    X: np.ndarray,
    region_rows: Mapping[str, int],
    config_rows: Mapping[str, int],
    sibling_rows: Mapping[str, int] | None,
) -> np.ndarray:
    """(n, 4): whether the training rows hold the row's region, and log(1 + training rows) of its region, of
    its configuration and of its siblings ((n, 3) without `sibling_rows`: a version fitted before them)."""
    # The keys nest (a configuration's holds its siblings', which holds its region's): a row whose region
    # the training rows lack has no siblings there, and one without siblings no configuration, so the
    # narrower keys are hashed only where the wider one was found (a sweep of new sequence lengths skips
    # most of the configuration keys).
    regions = _counts_of(X, _REGION_COLUMNS, region_rows, np.ones(len(X), dtype=bool))
    if sibling_rows is None:
        configs = _counts_of(X, _CONFIG_COLUMNS, config_rows, regions > 0)
        parts = [(regions > 0).astype(float), np.log1p(regions), np.log1p(configs)]
    else:
        siblings = _counts_of(X, _SIBLING_COLUMNS, sibling_rows, regions > 0)
        configs = _counts_of(X, _CONFIG_COLUMNS, config_rows, siblings > 0)
        parts = [(regions > 0).astype(float), np.log1p(regions), np.log1p(configs), np.log1p(siblings)]
    return np.column_stack(parts)


def _counts_of(
    X: np.ndarray, key_columns: np.ndarray, rows: Mapping[str, int], where: np.ndarray
) -> np.ndarray:
    """Per row, the training rows of its key (of `key_columns`), looked up for the rows `where` (0 elsewhere
    and where the key is not among `rows`)."""
    counts = np.zeros(len(X), dtype=float)
    if where.any():
        # Looked up once per distinct key, not per row (~25 ms of 100,000 rows' lookups).
        distinct, group = _distinct_keys(X if where.all() else X[where], key_columns)
        counts[where] = np.array([rows.get(k, 0) for k in distinct.tolist()], dtype=float)[group]
    return counts


def held_out_residuals(
    X: np.ndarray, target: np.ndarray, weight: np.ndarray | None, train: np.ndarray, held_out: np.ndarray,
    params: dict[str, Any], *, seed: int,
) -> np.ndarray:  # fmt: skip
    """A regressor of `params` fitted on the rows `train` (a mask or row numbers), and the residuals of
    `target` on the rows `held_out`."""
    model = boosting.regressor(FEATURE_NAMES, seed, params)
    model.fit(
        boosting.trainable(X[train], FEATURE_NAMES),
        target[train],
        sample_weight=None if weight is None else weight[train],
    )
    return target[held_out] - CompiledTrees(model).predict(X[held_out])


def fold_neighbourhood(X_train: np.ndarray, X_held_out: np.ndarray) -> np.ndarray:
    """`neighbourhood` of held-out rows in a fold's training rows (`levels_of` gives their novelty)."""
    return neighbourhood(
        X_held_out,
        _counts(keys(X_train, _REGION_COLUMNS)),
        _counts(keys(X_train, _CONFIG_COLUMNS)),
        _counts(keys(X_train, _SIBLING_COLUMNS)),
    )


def _counts(found: np.ndarray) -> dict[str, int]:
    values, counts = np.unique(found.astype(str), return_counts=True)
    return {str(v): int(c) for v, c in zip(values, counts, strict=True)}


def _out_of_fold_residuals(
    X: np.ndarray, target: np.ndarray, weight: np.ndarray | None, *, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Residuals of log(tokens/s), each held-out row's neighbourhood in its fold's training rows, and its
    row number.

    On a table so large that a random fold's fit sees only RESIDUAL_MAX_TRAIN_ROWS of its training rows, one
    fit holds out as many rows as all the random folds would, drawn from the rows it did not see: the same
    number of residuals of the same kind of fit, for one final-model fit instead of RANDOM_FOLDS (on 30,920
    benchmark rows, ~3.6 s of CPU saved per calibration fit)."""
    n = len(X)
    rng = np.random.default_rng(seed)
    random_part = rng.permutation(n) % RESIDUAL_PARTS
    block_part = np.arange(n) * RESIDUAL_PARTS // n
    spread = np.linspace(0, RESIDUAL_PARTS - 1, BLOCK_FOLDS).round().astype(int)
    folds = [(random_part == k, False) for k in range(RANDOM_FOLDS)] + [
        (block_part == k, True) for k in spread
    ]
    random_wanted = int((random_part < RANDOM_FOLDS).sum())
    random_done = 0
    residuals: list[np.ndarray] = []
    contexts: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    for held_out, is_block in folds:
        if not is_block and random_done >= random_wanted:
            continue
        train = ~held_out
        if train.sum() < 10 or held_out.sum() == 0:
            continue
        if train.sum() > RESIDUAL_MAX_TRAIN_ROWS:
            keep = rng.choice(np.flatnonzero(train), RESIDUAL_MAX_TRAIN_ROWS, replace=False)
            train = np.zeros(n, dtype=bool)
            train[keep] = True
            unseen = np.flatnonzero(~train)
            if not is_block and len(unseen) >= random_wanted:
                held_out = np.zeros(n, dtype=bool)
                held_out[rng.choice(unseen, random_wanted, replace=False)] = True
        if not is_block:
            random_done += int(held_out.sum())
        params = RESIDUAL_PARAMS if is_block else RANDOM_RESIDUAL_PARAMS
        residuals.append(held_out_residuals(X, target, weight, train, held_out, params, seed=seed))
        contexts.append(fold_neighbourhood(X[train], X[held_out]))
        rows.append(np.flatnonzero(held_out))
    return np.concatenate(residuals), np.concatenate(contexts), np.concatenate(rows)


def _difficulty_and_band(
    X: np.ndarray, contexts: np.ndarray, levels: np.ndarray, residuals: np.ndarray, *, seed: int
) -> tuple[HistGradientBoostingRegressor, dict[str, list[float]], np.ndarray]:
    """The difficulty regressor (on all out-of-fold rows), the band's quantiles of residual / difficulty,
    and each out-of-fold row's residual / difficulty.

    The quantiles come from difficulties cross-fitted in two halves (each half's from a regressor that did
    not see it): scored on its own training rows, a difficulty model would look surer than it is.

    Each novelty level (`levels_of`) takes its quantiles from its own out-of-fold rows, of the random folds
    and of the blocks alike: a seen region's edge is as much a place predictions go as its middle, and its
    errors are larger (with seen rows' quantiles from the random folds alone, the band covered 0.80 of
    random held-out rows but 0.70 of unseen blocks). A level with too few residuals borrows all of them, and
    each level's band holds the one before it in LEVELS.
    """
    design = np.column_stack([X, contexts])
    target = np.log(np.maximum(np.abs(residuals), MIN_ABS_RESIDUAL))
    half = np.random.default_rng(seed).permutation(len(residuals)) % 2 == 0
    scale = np.empty(len(residuals))
    for part in (half, ~half):
        if part.all() or not part.any():
            scale[:] = np.exp(np.mean(target))
            continue
        model = _difficulty_regressor(seed).fit(boosting.trainable(design[~part], DIFFICULTY_FEATURES),
                                               target[~part])  # fmt: skip
        scale[part] = np.exp(CompiledTrees(model).predict(design[part]))
    scores = residuals / scale
    band = level_quantiles(scores, levels)
    difficulty = _difficulty_regressor(seed).fit(boosting.trainable(design, DIFFICULTY_FEATURES), target)
    return difficulty, band, scores


def level_quantiles(values: np.ndarray, levels: np.ndarray) -> dict[str, list[float]]:
    """Per novelty level, the band's quantiles of `values` (its out-of-fold rows'; all of them for a level
    with too few), each level's holding the one before it in LEVELS."""
    band: dict[str, list[float]] = {}
    previous = [0.0, 0.0]
    for level in LEVELS:
        pool = values[levels == level]
        quantiles = NOVEL_BAND_QUANTILES if level == NEW_REGION else BAND_QUANTILES
        chosen = pool if pool.size >= MIN_RESIDUALS_PER_LEVEL else values
        low, high = (float(q) for q in np.quantile(chosen, quantiles))
        band[str(level)] = previous = [min(low, previous[0]), max(high, previous[1])]
    return band


def _difficulty_regressor(seed: int) -> HistGradientBoostingRegressor:
    from sklearn.ensemble import HistGradientBoostingRegressor

    return HistGradientBoostingRegressor(
        categorical_features=[name in CATEGORICAL_FEATURES for name in DIFFICULTY_FEATURES],
        random_state=seed,
        **DIFFICULTY_PARAMS,
    )
