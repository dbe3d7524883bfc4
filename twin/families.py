"""Error families: the configurations whose model errors move together.

A throughput model that is 20 % slow on one 70B LoRA job on A100s is slow on all of them: its error comes
from what it does not know about that model, method and GPU, not from the job. So the twin draws one shared
error per family and run (`twin.plan`), and calibration measures how much of the error is shared within a
family from held-out residuals (`calibrate`), both with this one definition of a family.
"""

from __future__ import annotations

import numpy as np

from twin.domain import JobConfig, canonical_gpu_name, name_key

# The levels at which a model describes the distribution of its standardized throughput error (z = the
# error in units of its band, 1.2816 at the band's p90): the tails are where a forecast of GPU-hours is
# decided (one 32-GPU job four times slower than predicted outweighs a hundred small ones), and held-out
# residuals have far heavier tails than a normal distribution (6 % beyond |z| = 3 instead of 0.3 %).
ERROR_QUANTILE_LEVELS = np.array(
    [0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5,
     0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.9975, 0.999]
)  # fmt: skip


def error_family(model_name: str, method: str, gpu_model: str) -> str:
    """Names as the models read them: 'Llama3-8B' and llama3-8b jobs share the error the models make on it."""
    return f"{name_key(model_name)}|{name_key(method)}|{canonical_gpu_name(gpu_model)}"


def family_of(config: JobConfig) -> str:
    return error_family(config.model_name, config.method, config.gpu_model)
