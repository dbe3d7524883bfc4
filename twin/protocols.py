"""What the twin needs from calibrated models, as small protocols.

`calibrate` implements them with fitted estimators; the twin never imports scikit-learn or the registry.
Every method is vectorized over a sequence of configurations because the simulator asks in bulk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from twin.domain import JobConfig


@runtime_checkable
class PerformanceModel(Protocol):
    def predict_throughput(self, configs: Sequence[JobConfig]) -> np.ndarray:
        """Whole-job `dataset_tokens_per_second`, shape (n, 3): the p10, p50 and p90 of each config."""
        ...


@runtime_checkable
class FailureModel(Protocol):
    def predict_failure(self, configs: Sequence[JobConfig]) -> np.ndarray:
        """Probability that each config runs without failing at runtime (`p_valid`), shape (n,).

        The actuator's admission rules are not part of it: callers check `twin.domain.config_rule` first.
        """
        ...


@runtime_checkable
class PowerModel(Protocol):
    def predict_power_watts(self, configs: Sequence[JobConfig]) -> np.ndarray:
        """Average power per GPU in watts while the job runs, shape (n,)."""
        ...


@runtime_checkable
class JobModels(PerformanceModel, FailureModel, PowerModel, Protocol):
    """Everything the twin and the advisor ask of the calibrated models."""


@runtime_checkable
class ErrorCorrelationModel(Protocol):
    def predict_error_correlation(self, configs: Sequence[JobConfig]) -> np.ndarray:
        """Per config, the share of its throughput error (in the band's standard units) that it shares with
        the other configurations of its error family (`twin.families`), shape (n,), in [0, 1): 0 means
        independent errors per job, as a model without this method is taken to have."""
        ...


@runtime_checkable
class ErrorDistributionModel(Protocol):
    def predict_error_quantiles(self, configs: Sequence[JobConfig]) -> np.ndarray:
        """Per config, its standardized throughput error (in units of its band: -1.2816 at p10, +1.2816 at
        p90) at `twin.families.ERROR_QUANTILE_LEVELS`, shape (n, levels), non-decreasing along a row. A
        model without this method is taken to have normal errors."""
        ...


@runtime_checkable
class ErrorRangeModel(Protocol):
    def predict_error_range(self, configs: Sequence[JobConfig]) -> np.ndarray:
        """Per config, shape (n, 2): the most negative and the most positive error of log(tokens/s) (actual
        over the band's p50) its model has been seen to make, -inf and inf where unknown. The twin draws no
        throughput beyond them. A model without this method is taken to have unbounded errors."""
        ...


@runtime_checkable
class FailureCorrelationModel(Protocol):
    def predict_failure_correlation(self, configs: Sequence[JobConfig]) -> np.ndarray:
        """Per config, the share of its runtime-failure error (the residual ran - p_valid over its standard
        deviation) that it shares with the other configurations of its error family, shape (n,), in [0, 1):
        whether a job fails is then drawn with a family shock shared by the run's jobs of that family. A
        model without this method is taken to have independent failures."""
        ...


@runtime_checkable
class FailureMembersModel(Protocol):
    def predict_failure_members(self, configs: Sequence[JobConfig]) -> np.ndarray:
        """Per config, the p_valid of each member of the failure model's ensemble, whose mean is
        `predict_failure`, shape (n, members): how unsure the model is of p itself. The twin takes p_valid as
        the members' mean (without asking `predict_failure` too), and each run takes one member's p for all
        its jobs, so that the band of jobs completed and failed carries that uncertainty; a model without
        this method is taken to know its p."""
        ...


@runtime_checkable
class PowerErrorModel(Protocol):
    def predict_power_error(self, configs: Sequence[JobConfig]) -> np.ndarray:
        """Per config, shape (n, 2): the standard deviation of the error of log(`predict_power_watts`), and
        the share of it (in [0, 1)) that it shares with the other configurations of its error family. Each
        run draws a job's power from it, with one shock per family and run, so that an energy forecast's band
        carries the power model's error where it does not average out. A model without this method is taken
        to know each job's power."""
        ...
