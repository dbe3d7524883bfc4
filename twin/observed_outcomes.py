"""How the cluster's own runs ended, by configuration: what the twin knows of runtime failures before a
failure model is calibrated.

The uncalibrated fallback (`twin.uncalibrated`) has no failure model: without this, it forecast that no job
fails (the first standing forecast of `finetwin up`, made before its first calibration, forecast 0 failures
an hour where the replayed cluster had 17). The telemetry says better: each configuration's p_valid is the
share of its own ended runs that ran, shrunk towards the cluster's share by `PRIOR_RUNS` runs' worth, so a
configuration seen once is not called certain either way, and one never seen takes the cluster's share.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
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
    def of(cls, ended: Iterable[tuple[JobConfig, bool]]) -> ObservedOutcomes | None:
        """From (configuration, whether it ran) of each ended run; None when none ended."""
        counts: dict[Hashable, list[int]] = {}
        for config, ran in ended:
            counts.setdefault(catalog_key(config), [0, 0])[0 if ran else 1] += 1
        if not counts:
            return None
        by_config = {key: (ran, failed) for key, (ran, failed) in counts.items()}
        return cls(by_config, sum(r for r, _ in by_config.values()), sum(f for _, f in by_config.values()))

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
