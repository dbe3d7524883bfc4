"""How much of the throughput model's error is shared within an error family, and how that error is
distributed, from held-out residuals.

The twin's ensemble draws one error per family and run (`twin.plan`), mixed with each job's own:
z = sqrt(rho) z_family + sqrt(1 - rho) z_job. rho is measured here on out-of-fold residuals, standardized
by the band (a residual at the band's p90 is z = 1.2816), as the intra-family correlation of z: the mean
product of two different rows of one family over the mean square of all rows. Each family counts by its
rows (not by its pairs, which would let the biggest family decide alone). Residuals are measured per
novelty level, because a family the model has seen shares little error (the trees learned its bias) and a
family it has not seen shares most of it.
"""

from __future__ import annotations

import numpy as np

from twin.families import ERROR_QUANTILE_LEVELS

# z of the band's p10/p90 (the band holds the 10th-90th percentile of the residuals).
Z90 = 1.2815515655446004
# Standardized residuals beyond this are outliers of the band's tails, not evidence of shared error.
Z_CLIP = 3.0
MIN_FAMILY_ROWS = 2
MIN_FAMILIES = 5
MAX_SHARE = 0.95
# Fewer residuals than this do not describe a distribution's tails: the twin keeps a normal's.
MIN_QUANTILE_ROWS = 50


def standardize(
    residuals: np.ndarray, low: np.ndarray, high: np.ndarray, clip: float | None = Z_CLIP
) -> np.ndarray:
    """Residuals of log(tokens/s) in the band's standard units: `low` < 0 < `high` are the band's offsets."""
    low = np.minimum(np.asarray(low, dtype=float), -1e-9)
    high = np.maximum(np.asarray(high, dtype=float), 1e-9)
    r = np.asarray(residuals, dtype=float)
    z = np.where(r < 0, r / -low, r / high) * Z90
    return z if clip is None else np.clip(z, -clip, clip)


def error_quantiles(z: np.ndarray) -> np.ndarray | None:
    """The standardized errors' quantiles at ERROR_QUANTILE_LEVELS (None with too few): the twin reads a
    job's error from them, tails as heavy as the held-out residuals had them."""
    z = np.asarray(z, dtype=float)
    z = z[np.isfinite(z)]
    if len(z) < MIN_QUANTILE_ROWS:
        return None
    return np.maximum.accumulate(np.quantile(z, ERROR_QUANTILE_LEVELS))


def shared_share(z: np.ndarray, families: np.ndarray) -> float | None:
    """The intra-family correlation of `z` (None when fewer than MIN_FAMILIES families have two rows)."""
    z = np.asarray(z, dtype=float)
    families = np.asarray(families)
    if len(z) == 0:
        return None
    total = float(np.mean(z**2))
    if total <= 0:
        return 0.0
    _, inverse, counts = np.unique(families, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=z)
    squares = np.bincount(inverse, weights=z**2)
    usable = counts >= MIN_FAMILY_ROWS
    if usable.sum() < MIN_FAMILIES:
        return None
    n = counts[usable].astype(float)
    per_family = (sums[usable] ** 2 - squares[usable]) / (n * (n - 1))  # mean product of distinct pairs
    share = float(np.sum(n * per_family) / n.sum()) / total
    return float(np.clip(share, 0.0, MAX_SHARE))
