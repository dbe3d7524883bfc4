"""How the cluster's own runs ended, by configuration: what the twin knows of runtime failures before a
failure model is calibrated.

The uncalibrated fallback (`twin.uncalibrated`) has no failure model: without this, it forecast that no job
fails (the first standing forecast of `finetwin up`, made before its first calibration, forecast 0 failures
an hour where the replayed cluster had 17). The telemetry says better: each configuration's p_valid is the
share of its own ended runs that ran, shrunk towards the cluster's share by `PRIOR_RUNS` runs' worth, so a
configuration seen once is not called certain either way, and one never seen takes the cluster's share.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from twin.domain import JobConfig
from twin.workload import catalog_key

# How many runs the cluster's share counts for against a configuration's own (a beta prior's weight).
PRIOR_RUNS = 2.0


@dataclass(frozen=True)
class ObservedOutcomes:
    """Ended runs (ran to completion, or failed at runtime; never a rejection) by configuration."""

    by_config: dict[Hashable, tuple[int, int]]  # `catalog_key` -> (ran, failed)
    ran: int
    failed: int

    @classmethod
    def of(
        cls, configs: Sequence[JobConfig], config_idx: np.ndarray, ran: np.ndarray
    ) -> ObservedOutcomes | None:
        """From each ended run's configuration (its index into `configs`) and whether it ran; None when no
        run ended. Counted per configuration, not per run: a week of a busy cluster is a million runs."""
        if not len(config_idx):
            return None
        ran_counts = np.bincount(config_idx[ran], minlength=len(configs))
        failed_counts = np.bincount(config_idx[~ran], minlength=len(configs))
        by_config = {
            catalog_key(configs[k]): (int(ran_counts[k]), int(failed_counts[k]))
            for k in np.flatnonzero(ran_counts + failed_counts).tolist()
        }
        return cls(by_config, int(ran_counts.sum()), int(failed_counts.sum()))

    @property
    def cluster_p_valid(self) -> float:
        """The cluster's share of runs that ran (Laplace's rule: never exactly 0 or 1)."""
        return (self.ran + 1.0) / (self.ran + self.failed + 2.0)

    def p_valid(self, configs: Sequence[JobConfig]) -> np.ndarray:
        prior = self.cluster_p_valid
        out = np.empty(len(configs))
        for k, config in enumerate(configs):
            ran, failed = self.by_config.get(catalog_key(config), (0, 0))
            out[k] = (ran + PRIOR_RUNS * prior) / (ran + failed + PRIOR_RUNS)
        return out

    def note(self) -> str:
        ended = self.ran + self.failed
        return (
            f"no calibrated model: runtime failures as this cluster's runs failed ({self.failed:,} of "
            f"{ended:,} ended runs; each configuration by its own runs where it ran before)"
        )
