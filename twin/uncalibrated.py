"""A rough, uncalibrated stand-in for the models, used ONLY when no calibrated model exists yet (a fresh
install runs `finetwin forecast` before `finetwin calibrate`). Forecasts made with it say so
(`"models": "fallback"`); calibrate a model for numbers worth acting on.

Throughput: the paper's single-GPU A100-SXM figures (about 6,600 tokens/s at batch 8 for an 8B model, about
+1,000 tokens/s per doubling of the batch), scaled inversely with model size, by GPU type, method and GPU
count (near-linear in a node, worse across nodes without RoCE). Band: ±30 %. Runtime failures: as the
cluster's own runs failed where the telemetry has ended runs (`twin.observed_outcomes`), else none (p_valid =
1). It draws 75 % of the GPU's board power.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from twin.domain import GPU_TYPES, GPUS_PER_NODE, JobConfig, gpu_or_unknown, model_params_b
from twin.observed_outcomes import ObservedOutcomes

# The figures above are the A100-SXM's; other GPUs scale by the catalogue's relative speeds.
_REFERENCE_SPEED = GPU_TYPES["NVIDIA-A100-SXM4-80GB"].relative_speed
_METHOD_SPEED = {"full": 1.0, "lora": 1.3, "gptq-lora": 0.8}
_BAND = (0.7, 1.0, 1.3)
FALLBACK_LABEL = "fallback"  # a forecast's `models` when these stood in for a calibrated version


class FallbackModels:
    """Implements twin.protocols.JobModels without any fitted state; `outcomes`: the cluster's ended runs."""

    def __init__(self, outcomes: ObservedOutcomes | None = None) -> None:
        self.outcomes = outcomes

    def predict_throughput(self, configs: Sequence[JobConfig]) -> np.ndarray:
        p50 = np.array([self._tokens_per_second(c) for c in configs], dtype=float)
        return np.column_stack([p50 * b for b in _BAND]) if len(p50) else np.zeros((0, 3))

    def predict_failure(self, configs: Sequence[JobConfig]) -> np.ndarray:
        return np.ones(len(configs)) if self.outcomes is None else self.outcomes.p_valid(configs)

    def predict_power_watts(self, configs: Sequence[JobConfig]) -> np.ndarray:
        return np.array([gpu_or_unknown(c.gpu_model).tdp_watts * 0.75 for c in configs], dtype=float)

    @staticmethod
    def _tokens_per_second(config: JobConfig) -> float:
        params = model_params_b(config.model_name) or 8.0
        per_gpu_batch = max(config.batch_size / max(config.number_gpus, 1), 1.0)
        single = (6600.0 + 1000.0 * (math.log2(per_gpu_batch) - 3.0)) * 8.0 / max(params, 0.1)
        single = max(single, 50.0)
        speed = gpu_or_unknown(config.gpu_model).relative_speed / _REFERENCE_SPEED
        speed *= _METHOD_SPEED.get(config.method, 1.0)
        speed *= 1.15 if config.fast_kernels else 1.0
        gpus = max(config.number_gpus, 1)
        scaling = gpus * 0.97 ** math.log2(gpus)
        if gpus > GPUS_PER_NODE:
            scaling *= 0.72 if config.enable_roce else 0.3  # the paper's inter-node efficiencies
        return single * speed * scaling
