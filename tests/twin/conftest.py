"""Twin fixtures: deterministic stand-ins for the calibrated models (unit tests only) and small clusters."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from twin.cluster import Cluster, cluster_from_spec
from twin.domain import JobConfig
from twin.workload import Workload

A100 = "NVIDIA-A100-SXM4-80GB"
L40S = "L40S"


class RuleModels:
    """Throughput = per_gpu x GPUs (band ±20 %); runs (p_valid = 1) up to `max_batch`, else `p_fail_valid`."""

    def __init__(self, per_gpu: float = 1000.0, max_batch: int = 64, p_fail_valid: float = 0.0) -> None:
        self.per_gpu, self.max_batch, self.p_fail_valid = per_gpu, max_batch, p_fail_valid
        self.calls = 0

    def predict_throughput(self, configs: Sequence[JobConfig]) -> np.ndarray:
        self.calls += 1
        speed = np.array([self.per_gpu * c.number_gpus * (1.5 if c.fast_kernels else 1.0) for c in configs])
        return np.column_stack([0.8 * speed, speed, 1.25 * speed]) if len(speed) else np.zeros((0, 3))

    def predict_failure(self, configs: Sequence[JobConfig]) -> np.ndarray:
        return np.array([1.0 if c.batch_size <= self.max_batch else self.p_fail_valid for c in configs])

    def predict_power_watts(self, configs: Sequence[JobConfig]) -> np.ndarray:
        return np.full(len(configs), 300.0)


@pytest.fixture
def models() -> RuleModels:
    return RuleModels()


def one_node(gpus: int = 8, gpu_model: str = A100) -> Cluster:
    return cluster_from_spec({"nodes": [{"gpu_model": gpu_model, "count": 1, "gpus_per_node": gpus}]})


def mixed_cluster() -> Cluster:
    return cluster_from_spec({"nodes": [{"gpu_model": A100, "count": 4}, {"gpu_model": L40S, "count": 2}]})


def config_workload(
    rng: np.random.Generator, n: int, span_s: float, *, gpu_choices: Sequence[int] = (1, 2, 4, 8, 16, 32)
) -> Workload:
    """Jobs with configurations on A100 and L40S: some break a rule (batch not a multiple of the GPUs),
    some are too big for the L40S pool, batches above 64 fail at runtime under RuleModels."""
    catalog: list[JobConfig] = []
    idx: list[int] = []
    gpus: list[int] = []
    models: list[str] = []
    for _ in range(n):
        g = int(rng.choice(gpu_choices))
        gpu_model = A100 if rng.random() < 0.75 else L40S
        batch = int(rng.choice([g * 4, g * 16, g * 4 + 1]))
        cfg = JobConfig("llama3-8b", "lora", gpu_model, g, max(1, g // 8), batch, 1024)
        catalog.append(cfg)
        idx.append(len(catalog) - 1)
        gpus.append(g)
        models.append(gpu_model)
    return Workload(
        job_ids=[f"job-{i}" for i in range(n)],
        arrival_s=np.sort(rng.uniform(0, span_s, n)),
        gpus=np.array(gpus),
        gpu_models=models,
        duration_s=np.full(n, np.nan),
        work_tokens=rng.uniform(1e6, 2e7, n),
        config_idx=np.array(idx),
        catalog=catalog,
    )
