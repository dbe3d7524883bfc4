"""A stand-in for the calibrated models in UNIT tests of the advice logic: it follows the paper's trends
(throughput logarithmic in the batch, near-linear within a node, slow across nodes without RoCE, Fast
Kernels 1.12x, Fast MoE best at EP=1, memory failures growing with the batch per GPU and model size)
and counts how often it is called. Integration tests use the real calibrated models."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from twin.domain import JobConfig, gpu_type, model_params_b


class FakeModels:
    def __init__(self) -> None:
        self.calls: dict[str, int] = {"throughput": 0, "failure": 0, "power": 0}
        self.rows_seen = 0
        self.protocols_seen: list[dict[str, str]] = []  # each configuration's `extra`, as asked

    def _p50(self, c: JobConfig) -> float:
        per_gpu = c.batch_size / c.number_gpus
        base = (
            3000.0
            * (1 + 0.35 * math.log2(max(per_gpu, 1)))
            * (8 / (model_params_b(c.model_name) or 8)) ** 0.5
        )
        gpus_per_node = c.number_gpus / c.number_nodes
        total = base * c.number_gpus * 0.97 ** math.log2(max(gpus_per_node, 1))
        if c.number_nodes > 1:
            total *= 0.95 if c.enable_roce else 0.5
        if c.fast_kernels:
            total *= 1.12
        if c.fast_moe == 1:
            total *= 1.69
        elif c.fast_moe > 1:
            total *= 1.2
        return total

    def predict_throughput(self, configs: Sequence[JobConfig]) -> np.ndarray:
        self.calls["throughput"] += 1
        self.rows_seen += len(configs)
        self.protocols_seen += [c.extra for c in configs]
        p50 = np.array([self._p50(c) for c in configs])
        return np.column_stack([0.85 * p50, p50, 1.15 * p50])

    def predict_failure(self, configs: Sequence[JobConfig]) -> np.ndarray:
        self.calls["failure"] += 1
        out = []
        for c in configs:
            params = model_params_b(c.model_name) or 8
            state_gb = params * (16 if c.method == "full" else 2) / c.number_gpus
            activations_gb = c.batch_size / c.number_gpus * c.tokens_per_sample / 1024 * params / 8
            headroom = gpu_type(c.gpu_model).memory_gb - state_gb - activations_gb
            out.append(1 / (1 + math.exp(min(-headroom / 6, 50.0))))
        return np.array(out)

    def predict_power_watts(self, configs: Sequence[JobConfig]) -> np.ndarray:
        self.calls["power"] += 1
        return np.full(len(configs), 300.0)


class FakeInUse:
    """The API's models in use (`advisor.parts.ModelsInUse`): `get() -> (version, models)`."""

    def __init__(self, models: object | None, version: str = "v-test") -> None:
        self.models = models
        self.version = version

    def version_in_use(self) -> str | None:
        return None if self.models is None else self.version

    def get(self) -> tuple[str, object] | None:
        return None if self.models is None else (self.version, self.models)

    def tree_engine(self) -> str | None:
        return None
