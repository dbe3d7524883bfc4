"""Matched pairs, the way the paper measures an effect.

A pair is one configuration run at two settings of one factor, with every other configuration column
equal, plus the settings found only in the identifier (dataset, sharding strategy, optimizer, gradient
accumulation, ...) and the protocol: the experiment_id without the factor's own token (a run
with `fast_kernels.['True', ...]` in its experiment_id pairs with the same experiment without it). Only
valid runs take part. Repeated runs of one setting count once: the pair's ratio divides the MEDIAN
throughputs of its two settings, so a configuration measured five times weighs as much as one measured once.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from calibrate.loader import identifier_settings
from calibrate.report.stats import MEMORY_PEAK, THROUGHPUT
from twin.domain import METHODS, Outcome

# The configuration columns a pair must agree on, unless the factor changes them. identifier and
# experiment_id are replaced by what they add: the identifier-only settings and the protocol.
MATCH_COLUMNS: tuple[str, ...] = (
    "method", "model_name", "number_nodes", "gpu_model", "number_gpus", "tokens_per_sample", "batch_size",
    "enable_roce", "fast_moe", "fast_kernels", "fms_hf_tuning_version", "torch_dtype",
)  # fmt: skip

# The settings written only in the identifier that change how a job trains; the identifier's other keys
# restate a column (model_name, number_gpus, model_max_length, ...) and are matched through it. Not listed:
# fsdp_state_dict_type (how a checkpoint is written, not how a step runs) and the LoRA rank and alpha
# (written in the LoRA experiment's name, so they are part of the protocol already).
IDENTIFIER_ONLY_SETTINGS: tuple[str, ...] = (
    "dataset_id", "fsdp_sharding_strategy", "fsdp_use_orig_params", "accelerate_config_mixed_precision",
    "gradient_accumulation_steps", "optim", "gradient_checkpointing_use_reentrant",
)  # fmt: skip
# Full sharding is the default when an identifier names no strategy, and hybrid sharding (shard within a
# node, replicate across nodes) is full sharding on one node, as the actuator documents.
_FULL_SHARD = "FULL_SHARD"
_TOKEN_SPLIT = re.compile(r"-(?=[a-z_]+\.)")
# The method is written inside the experiment's name (finetune_full_benchmark, finetune-lora-fsdp-...).
_METHOD_WORD = re.compile(r"(?<=[._-])(" + "|".join(sorted(METHODS, key=len, reverse=True)) + r")(?=[._-])")
_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")


@dataclass(frozen=True, slots=True)
class Factor:
    """What a comparison varies: the configuration columns it changes and its experiment_id tokens."""

    name: str
    columns: tuple[str, ...]
    tokens: tuple[str, ...] = ()
    method_in_name: bool = False  # the method factor: its token is a word of the experiment's name


ROCE = Factor("enable_roce", ("enable_roce",), ("enable_roce",))
FAST_KERNELS = Factor("fast_kernels", ("fast_kernels",), ("fast_kernels",))
FAST_MOE = Factor("fast_moe", ("fast_moe",), ("fast_moe",))
GPU_MODEL = Factor("gpu_model", ("gpu_model",), ("gpu_model",))
METHOD = Factor("method", ("method",), ("method",), method_in_name=True)
# Scaling changes the GPU count, hence the batch (weak scaling keeps the batch per GPU), the nodes
# (the fewest 8-GPU nodes) and, across nodes, whether RoCE is on.
GPU_COUNT = Factor(
    "number_gpus",
    ("number_gpus", "batch_size", "number_nodes", "enable_roce"),
    ("number_gpus", "batch_size", "number_nodes", "enable_roce"),
)


def identifier_only(identifier: str, number_nodes: int = 1) -> str:
    """The identifier-only settings of a run, canonical (1.0 == 1, sharding normalized), as one string."""
    found = identifier_settings(identifier or "")
    parts = []
    for key in IDENTIFIER_ONLY_SETTINGS:
        value = found.get(key)
        if key == "fsdp_sharding_strategy" and (
            value in (None, _FULL_SHARD) or (value == "HYBRID_SHARD" and number_nodes == 1)
        ):
            value = _FULL_SHARD
        if value is None:
            continue
        if _NUMBER.match(value):
            value = f"{float(value):g}"
        parts.append(f"{key}={value}")
    return ";".join(parts)


def protocol(experiment_id: str, factor: Factor) -> str:
    """The experiment_id without the factor's own token(s)."""
    name, *overrides = _TOKEN_SPLIT.split(experiment_id or "")
    kept = [t for t in overrides if t.partition(".")[0] not in factor.tokens]
    if factor.method_in_name:
        # The experiment's name (before its first key.value override) is where the method is written.
        name = _METHOD_WORD.sub("{method}", name)
    return "-".join([name, *kept])


def settings_table(table: pd.DataFrame, factor: Factor) -> pd.DataFrame:
    """One row per (configuration, factor setting) over valid runs: median throughput, run count and median
    GPU-memory peak of its runs (NaN without telemetry); `key` is equal exactly for rows that may pair."""
    valid = table[(table["outcome"] == Outcome.VALID.value) & table[THROUGHPUT].notna()]
    columns = ["identifier_only", "protocol", *MATCH_COLUMNS, "time_limit_s"]
    if valid.empty:
        return pd.DataFrame(columns=[*columns, "key", "throughput", "runs", "memory_peak"])
    frame = valid.assign(
        identifier_only=[
            identifier_only(i, n) for i, n in zip(valid["identifier"], valid["number_nodes"], strict=True)
        ],
        protocol=valid["experiment_id"].map(lambda e: protocol(e, factor)),
        memory_peak=valid.get(MEMORY_PEAK, np.nan),
    )
    grouped = frame.groupby([*columns[:-1]], dropna=False, sort=False)
    settings = grouped.agg(
        throughput=(THROUGHPUT, "median"),
        runs=(THROUGHPUT, "size"),
        memory_peak=("memory_peak", "median"),
        time_limit_s=("time_limit_s", "first"),
    ).reset_index()
    key_columns = [c for c in ("identifier_only", "protocol", *MATCH_COLUMNS) if c not in factor.columns]
    key = settings[key_columns[0]].astype(str)
    for column in key_columns[1:]:
        key = key + "|" + settings[column].astype(str)
    settings["key"] = key
    return settings


def pair_up(
    settings: pd.DataFrame,
    base: pd.Series,
    treatment: pd.Series,
    *,
    where: Callable[[pd.DataFrame], pd.Series] | None = None,
) -> pd.DataFrame:
    """Every (base, treatment) pair of settings with the same key; columns end in `_a` (base) and `_b`
    (treatment); `ratio` = throughput_b / throughput_a."""
    left = settings[base.to_numpy(dtype=bool)]
    right = settings[treatment.to_numpy(dtype=bool)]
    pairs = left.merge(right, on="key", suffixes=("_a", "_b"))
    if where is not None and not pairs.empty:
        pairs = pairs[where(pairs).to_numpy(dtype=bool)]
    pairs = pairs.reset_index(drop=True)
    pairs["ratio"] = pairs["throughput_b"] / pairs["throughput_a"]
    return pairs
