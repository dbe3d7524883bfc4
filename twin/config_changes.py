"""Changes to job configurations that a policy or a what-if applies before the models are asked:
admission control (reject or repair), optimizations switched on, batch right-sizing.

Each works on the catalog of distinct configurations, not on jobs, so a 100k-job workload costs one
model call per distinct configuration.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated

import numpy as np
from pydantic import BeforeValidator

from twin.domain import (
    GPUS_PER_NODE,
    MOE_MODELS,
    JobConfig,
    Rule,
    config_rule,
    nearest_multiple,
    nodes_dividing,
)
from twin.protocols import FailureModel

# Below this predicted chance of running, admission control `reject` turns the job away, and batch
# right-sizing looks for a smaller batch.
DEFAULT_MIN_P_VALID = 0.5


class Admission(StrEnum):
    OFF = "off"  # the actuator still rejects rule-breaking configs; likely OOMs run (and may fail)
    REJECT = "reject"  # also turn away jobs the failure model expects to fail at runtime
    REPAIR = "repair"  # fix rule-breaking configs (batch to a multiple of the GPUs, ...) instead of rejecting


def _admission_as_written(value: object) -> object:
    """A bare `admission: off` in a YAML file is false to YAML 1.1 (as `on` is true): the word written."""
    return Admission.OFF if value is False else value


# Admission in a document people write: `off` whether YAML read it as a word or as false.
WrittenAdmission = Annotated[Admission, BeforeValidator(_admission_as_written)]


class Optimization(StrEnum):
    FAST_KERNELS = "fast_kernels"
    ROCE = "roce"  # only multi-node jobs exchange data across nodes
    FAST_MOE = "fast_moe"  # only mixture-of-experts models


def repair_config(config: JobConfig) -> JobConfig:
    """The nearest configuration the actuator accepts, as the paper suggests (round the batch to a multiple
    of the GPUs; an expert-parallel degree that divides the GPUs; nodes that divide the GPUs).

    Unlike the advisor's repair (which proposes another GPU count to the user), admission control keeps the
    job's GPUs: the cluster has already sized the job's request, so it lowers the expert-parallel degree."""
    cfg = config
    gpus = max(1, cfg.number_gpus)
    if config_rule(cfg) is Rule.BATCH_NOT_MULTIPLE_OF_GPUS:
        cfg = cfg.with_changes(batch_size=nearest_multiple(cfg.batch_size, gpus))
    if config_rule(cfg) is Rule.GPUS_NOT_MULTIPLE_OF_EXPERT_PARALLEL:
        cfg = cfg.with_changes(fast_moe=math.gcd(cfg.fast_moe, gpus))
    if config_rule(cfg) is Rule.GPUS_NOT_MULTIPLE_OF_NODES:
        # The fewest nodes that divide the GPUs with at most 8 per node.
        cfg = cfg.with_changes(number_nodes=nodes_dividing(gpus, math.ceil(gpus / GPUS_PER_NODE)))
    return cfg


def optimize_config(config: JobConfig, optimizations: frozenset[Optimization]) -> JobConfig:
    changes: dict[str, object] = {}
    if Optimization.FAST_KERNELS in optimizations and not config.fast_kernels:
        changes["fast_kernels"] = True
    if Optimization.ROCE in optimizations and config.number_nodes > 1 and not config.enable_roce:
        changes["enable_roce"] = True
    if Optimization.FAST_MOE in optimizations and config.model_name in MOE_MODELS and config.fast_moe == 0:
        # The largest expert-parallel degree of the benchmark's range that divides the GPUs.
        changes["fast_moe"] = next(d for d in (8, 4, 2, 1) if config.number_gpus % d == 0)
    return config.with_changes(**changes) if changes else config


def right_size_batches(
    configs: Sequence[JobConfig], failure: FailureModel, min_p_valid: float = DEFAULT_MIN_P_VALID
) -> list[JobConfig]:
    """For each config likely to fail at runtime, the largest smaller batch (halving, kept a multiple of the
    GPUs) that the failure model expects to run; unchanged when none does. The paper's finding: large
    batches add little throughput and most of the runtime failures."""
    configs = list(configs)
    if not configs:
        return []
    p_valid = np.asarray(failure.predict_failure(configs), dtype=float)
    candidates: list[tuple[int, JobConfig]] = []
    for i, cfg in enumerate(configs):
        if p_valid[i] >= min_p_valid or config_rule(cfg) is not None:
            continue
        batch = cfg.batch_size // 2
        while batch >= cfg.number_gpus and batch >= 1:
            if batch % cfg.number_gpus == 0:
                candidates.append((i, cfg.with_changes(batch_size=batch)))
            batch //= 2
    if not candidates:
        return configs
    p_candidates = np.asarray(failure.predict_failure([c for _, c in candidates]), dtype=float)
    out = list(configs)
    chosen: set[int] = set()
    for (i, cfg), p in zip(candidates, p_candidates, strict=True):
        # Candidates of one config come largest batch first: the first that runs wins.
        if i not in chosen and p >= min_p_valid:
            out[i] = cfg
            chosen.add(i)
    return out
