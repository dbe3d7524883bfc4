"""Feature building for the calibrated models, in ONE place: training and prediction both call
`build_features`, whether the rows come from a benchmark CSV, a configs CSV or `JobConfig` objects.

The features are physics first (what decides memory and speed), names second:
- memory: the training state each GPU holds (weights, gradients and optimizer state by method, sharded over
  the GPUs FSDP spreads it across), the activations (batch per GPU x tokens x model width x depth) and the
  logits (batch per GPU x tokens x vocabulary), against the GPU's memory;
- speed: the FLOPs a token costs (about 6 x active parameters for full fine-tuning, plus attention) against
  the GPUs' effective speed, slowed by the time each step spends moving weights and gradients between GPUs
  (NVLink, PCIe, RoCE or plain TCP across nodes). `log_physics_tokens_per_second` is that bound; the
  regressor learns the efficiency on top of it, which carries over to sizes and GPU counts it has not seen;
- the protocol: tuning-stack version, time cap, auto-stop, gradient checkpointing and accumulation, parsed
  from `experiment_id` and the identifier, so that a protocol never seen before still says what it does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from calibrate.config_frame import Table, validated_configs
from calibrate.experiment_protocol import protocol_columns, version_number
from calibrate.loader import distinct_values
from calibrate.model_sizes import DEFAULT_VOCABULARY, VOCABULARY_BY_FAMILY, model_family, model_sizes
from twin.domain import GPU_TYPES, UNKNOWN_GPU, canonical_gpu_name

_REFERENCE_TFLOPS = GPU_TYPES["NVIDIA-A100-80GB-PCIe"].dense_tflops  # the unit of the relative speeds
# Between nodes: RoCE moves data NIC to NIC without the CPU; without it, collectives go over TCP.
INTER_NODE_GBS = {True: 25.0, False: 3.0}
# The share of peak FLOPs a well-fed GPU reaches; only sets the scale of compute time against
# communication time (the regressor learns the real efficiency).
NOMINAL_UTILIZATION = 0.4

# Bytes of training state per parameter. Full: bf16 weights and gradients, fp32 master weights and two
# Adam moments (2 + 2 + 4 + 8). LoRA: frozen bf16 weights (the adapters are negligible). GPTQ-LoRA: 4-bit
# weights plus scales.
STATE_BYTES_PER_PARAM: dict[str, float] = {"full": 16.0, "lora": 2.0, "gptq-lora": 0.55}
# Bytes of weights FSDP gathers per parameter, and of gradients it reduces (LoRA: only the adapters').
WEIGHT_BYTES_PER_PARAM: dict[str, float] = {"full": 2.0, "lora": 2.0, "gptq-lora": 0.55}
GRADIENT_BYTES_PER_PARAM: dict[str, float] = {"full": 2.0, "lora": 0.0, "gptq-lora": 0.0}
# FLOPs per parameter per token: forward 2, backward 4 (LoRA and GPTQ-LoRA skip the weight gradients).
FLOPS_PER_PARAM: dict[str, float] = {"full": 6.0, "lora": 4.0, "gptq-lora": 4.0}

# Width x depth of a dense transformer grows as about params^0.7 (1B: 16 x 2048, 7B: 32 x 4096,
# 70B: 80 x 8192); activations and attention FLOPs scale with it.
_WIDTH_DEPTH_AT_7B = 32 * 4096
_WIDTH_DEPTH_EXPONENT = 0.7
# Bytes of activations per token per unit of width x depth without recomputation (Korthikanti et al.).
_ACTIVATION_BYTES = 34.0
# fp32 logits and their gradient.
_LOGIT_BYTES = 8.0

UNKNOWN_GPU_NOTE = "unknown GPU model: taken as an A100-PCIe"
# A type of the catalogue the benchmark never ran: its memory, power and speed are its data sheet's, and
# the models have seen none of its runs (one GPU type held out: `docs/models.md`).
DATA_SHEET_GPU_NOTE = "GPU model not in the benchmark: predicted from its data sheet"

CATEGORICAL_FEATURES: tuple[str, ...] = ("method", "gpu_model", "model_family", "protocol", "tuning_version")
NUMERIC_FEATURES: tuple[str, ...] = (
    "log_params",
    "log_active_params",
    "is_moe",
    "hybrid_mamba",
    "log_vocabulary",
    "log_gpu_memory",
    "log_gpu_tflops",
    "log_gpu_relative_speed",
    "number_gpus",
    "log_gpus",
    "number_nodes",
    "gpus_per_node",
    "multi_node",
    "enable_roce",
    "roce_multi_node",
    "log_batch",
    "log_batch_per_gpu",
    "log_tokens",
    "log_tokens_per_gpu_step",
    "expert_parallel",
    "experts_spread",
    "fast_kernels",
    "time_limited",
    "auto_stop",
    "data_parallel_only",
    "hybrid_shard",
    "shard_degree",
    "gradient_accumulation",
    "reentrant_checkpointing",
    "version_number",
    "state_bytes_per_param",
    "log_state_gb",
    "log_activation_gb",
    "log_logits_gb",
    "log_memory_ratio",
    "memory_headroom_gb",
    "log_flops_per_token",
    "log_communication_ratio",
    "log_physics_tokens_per_second",
)
FEATURE_NAMES: tuple[str, ...] = CATEGORICAL_FEATURES + NUMERIC_FEATURES
# What decides whether a run fits in memory; the speed features only add noise to that question (measured:
# lower balanced accuracy on unseen blocks with them).
SPEED_ONLY_FEATURES: tuple[str, ...] = (
    "log_gpu_tflops",
    "log_gpu_relative_speed",
    "log_flops_per_token",
    "log_communication_ratio",
    "log_physics_tokens_per_second",
)
MEMORY_FEATURES: tuple[str, ...] = tuple(f for f in FEATURE_NAMES if f not in SPEED_ONLY_FEATURES)
# The throughput regressor learns log(tokens/s) minus this bound.
THROUGHPUT_OFFSET = "log_physics_tokens_per_second"


def build_features(table: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The feature frame (FEATURE_NAMES, same index as `table`) and a note per row saying what was guessed.

    `table` is loader output (benchmark or configs) or `configs_to_frame` output; missing optional columns
    take their defaults. Raises ValueError naming the row (position) and column of an impossible value.
    """
    columns, notes = feature_columns(table)
    return pd.DataFrame(columns, index=table.index, columns=list(FEATURE_NAMES)), notes


def _row_notes(
    name_notes: np.ndarray, name_codes: np.ndarray, gpu_notes: list[str], gpu_codes: np.ndarray
) -> list[str]:
    """Each row's notes, its LLM's and its GPU's, joined once per distinct pair of the two (joining them
    row by row cost 0.1 s of `finetwin predict` on 100,000 rows)."""
    gpus = len(gpu_notes)
    pairs, rows = np.unique(name_codes * gpus + gpu_codes, return_inverse=True)
    joined = [
        "; ".join(x for x in (str(name_notes[pair // gpus]), gpu_notes[pair % gpus]) if x)
        for pair in pairs.tolist()
    ]
    return np.array(joined, dtype=object)[rows.reshape(-1)].tolist()


@dataclass(frozen=True)
class _Llms:
    """What each row's LLM name says, worked out once per distinct name and taken row by row."""

    codes: np.ndarray  # the row's distinct name (`distinct_values`)
    notes: np.ndarray  # per distinct name: what was guessed about its size
    params: np.ndarray  # billions of parameters
    active: np.ndarray  # billions active per token (below `params` for a mixture of experts)
    families: np.ndarray
    vocabulary: np.ndarray
    hybrid_mamba: np.ndarray
    width_depth: np.ndarray  # layers x hidden width, from the active parameters


def _llms(names: np.ndarray) -> _Llms:
    codes, distinct_names = distinct_values(names)
    params, active, notes = (np.asarray(x) for x in model_sizes(distinct_names))
    distinct_families = [model_family(name) for name in distinct_names]
    vocabulary = [VOCABULARY_BY_FAMILY.get(f, DEFAULT_VOCABULARY) for f in distinct_families]
    active = active[codes]
    return _Llms(
        codes=codes,
        notes=notes,
        params=params[codes],
        active=active,
        families=np.array(distinct_families, dtype=object)[codes],
        vocabulary=np.array(vocabulary, dtype=float)[codes],
        hybrid_mamba=np.array(["-h-" in name for name in distinct_names], dtype=float)[codes],
        width_depth=_WIDTH_DEPTH_AT_7B * (active / 7.0) ** _WIDTH_DEPTH_EXPONENT,
    )


@dataclass(frozen=True)
class _Gpus:
    """Each row's GPU type from the catalogue (an unknown name taken as an A100-PCIe, and said)."""

    codes: np.ndarray  # the row's distinct GPU name (`distinct_values`)
    notes: list[str]  # per distinct name: unknown, from its data sheet, or nothing
    named: np.ndarray  # the catalogue's name for it
    memory_gb: np.ndarray
    tflops: np.ndarray
    relative_speed: np.ndarray
    intra_node_gbs: np.ndarray


def _gpus(names: np.ndarray) -> _Gpus:
    codes, distinct_gpus = distinct_values(names)
    named = np.array([canonical_gpu_name(g) for g in distinct_gpus], dtype=object)
    known = [GPU_TYPES.get(g) for g in named]
    catalogue = [g or UNKNOWN_GPU for g in known]
    memory, tflops, relative_speed, intra_node_gbs = (
        np.array([getattr(g, spec) for g in catalogue], dtype=float)[codes]
        for spec in ("memory_gb", "dense_tflops", "relative_speed", "intra_node_gbs")
    )
    return _Gpus(
        codes=codes,
        notes=[
            UNKNOWN_GPU_NOTE if g is None else "" if g.benchmarked else DATA_SHEET_GPU_NOTE for g in known
        ],
        named=named[codes],
        memory_gb=memory,
        tflops=tflops,
        relative_speed=relative_speed,
        intra_node_gbs=intra_node_gbs,
    )


def _physics_tokens_per_second(
    frame: dict[str, np.ndarray],
    llms: _Llms,
    gpus: _Gpus,
    per_method: Callable[[Mapping[str, float]], np.ndarray],
    data_parallel_only: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The speed bound of each row: the compute time of one step on one GPU, slowed by the time the step
    spends moving weights and gradients between GPUs. (FLOPs per token, communication / compute time, the
    bound in tokens/s.)"""
    number_gpus, nodes, tokens = frame["number_gpus"], frame["number_nodes"], frame["tokens_per_sample"]
    flops_per_token = (
        per_method(FLOPS_PER_PARAM) * llms.active * 1e9
        + 12.0 * llms.width_depth * tokens  # attention scores and values, forward and backward
    )
    effective_flops = _REFERENCE_TFLOPS * 1e12 * gpus.relative_speed
    compute_s = (
        flops_per_token
        * (frame["batch_size"] / number_gpus)
        * tokens
        / (effective_flops * NOMINAL_UTILIZATION)
    )
    weight_bytes = per_method(WEIGHT_BYTES_PER_PARAM) * llms.params * 1e9
    gradient_bytes = per_method(GRADIENT_BYTES_PER_PARAM) * llms.params * 1e9
    # FSDP gathers the weights for the forward and again for the backward pass and reduce-scatters the
    # gradients; plain data parallelism all-reduces the gradients only.
    step_bytes = np.where(data_parallel_only == 1, 2.0 * gradient_bytes, 2.0 * weight_bytes + gradient_bytes)
    step_bytes = step_bytes * (number_gpus - 1.0) / number_gpus
    roce = frame["enable_roce"].astype(bool)
    link_gbs = np.where(
        nodes > 1, np.where(roce, INTER_NODE_GBS[True], INTER_NODE_GBS[False]), gpus.intra_node_gbs
    )
    communication_s = step_bytes / (link_gbs * 1e9)
    bound = (
        number_gpus
        * effective_flops
        * NOMINAL_UTILIZATION
        / flops_per_token
        * compute_s
        / (compute_s + communication_s)
    )
    return flops_per_token, (communication_s + 1e-6) / compute_s, bound


def feature_columns(table: Table) -> tuple[dict[str, np.ndarray], list[str]]:
    """`build_features` as one array per feature (FEATURE_NAMES order), without the frame around them: the
    prediction path encodes these straight into a numeric matrix (`calibrate.encoding`). Building a frame
    column by column cost most of a ~100-row prediction."""
    frame = validated_configs(table)
    llms = _llms(frame["model_name"])
    gpus = _gpus(frame["gpu_model"])
    notes = _row_notes(llms.notes, llms.codes, gpus.notes, gpus.codes)
    method_codes, distinct_methods = distinct_values(frame["method"])

    def per_method(table: Mapping[str, float]) -> np.ndarray:
        return _per_method(method_codes, distinct_methods, table)

    number_gpus, nodes, batch, tokens = (
        frame[name] for name in ("number_gpus", "number_nodes", "batch_size", "tokens_per_sample")
    )
    roce = frame["enable_roce"].astype(bool)
    expert_parallel = frame["fast_moe"].astype(float)
    protocol = protocol_columns(frame["experiment_id"], frame["identifier"])
    gpus_per_node = number_gpus / nodes
    batch_per_gpu = batch / number_gpus
    data_parallel_only = protocol["data_parallel_only"].astype(float)
    hybrid_shard = protocol["hybrid_shard"].astype(float)
    # FSDP shards the training state over every GPU of the job; HYBRID_SHARD only within a node; plain
    # data parallelism keeps a full copy on each GPU.
    shard_degree = np.where(
        data_parallel_only == 1, 1.0, np.where(hybrid_shard == 1, gpus_per_node, number_gpus)
    )

    # Memory per GPU, in GB.
    state_bytes = per_method(STATE_BYTES_PER_PARAM)
    state_gb = llms.params * state_bytes / shard_degree
    activation_gb = _ACTIVATION_BYTES * batch_per_gpu * tokens * llms.width_depth / 1e9
    logits_gb = _LOGIT_BYTES * batch_per_gpu * tokens * llms.vocabulary / 1e9
    needed_gb = state_gb + activation_gb + logits_gb
    flops_per_token, communication_ratio, physics_tokens_per_second = _physics_tokens_per_second(
        frame, llms, gpus, per_method, data_parallel_only
    )

    out: dict[str, np.ndarray] = {}
    out["method"] = frame["method"]
    out["gpu_model"] = np.array(gpus.named, dtype=object)
    out["model_family"] = llms.families
    out["protocol"] = protocol["protocol"]
    out["tuning_version"] = frame["fms_hf_tuning_version"]
    out["log_params"] = np.log(llms.params)
    out["log_active_params"] = np.log(llms.active)
    out["is_moe"] = (llms.active < llms.params * 0.95).astype(float)
    out["hybrid_mamba"] = llms.hybrid_mamba
    out["log_vocabulary"] = np.log(llms.vocabulary)
    out["log_gpu_memory"] = np.log(gpus.memory_gb)
    out["log_gpu_tflops"] = np.log(gpus.tflops)
    out["log_gpu_relative_speed"] = np.log(gpus.relative_speed)
    out["number_gpus"] = number_gpus
    out["log_gpus"] = np.log(number_gpus)
    out["number_nodes"] = nodes
    out["gpus_per_node"] = gpus_per_node
    out["multi_node"] = (nodes > 1).astype(float)
    out["enable_roce"] = roce.astype(float)
    out["roce_multi_node"] = (roce & (nodes > 1)).astype(float)
    out["log_batch"] = np.log(batch)
    out["log_batch_per_gpu"] = np.log(batch_per_gpu)
    out["log_tokens"] = np.log(tokens)
    out["log_tokens_per_gpu_step"] = np.log(batch_per_gpu * tokens)
    out["expert_parallel"] = expert_parallel
    # How many GPUs each expert group spans: the token exchange fast MoE pays for.
    out["experts_spread"] = np.where(expert_parallel > 0, np.minimum(expert_parallel, number_gpus), 0.0)
    out["fast_kernels"] = frame["fast_kernels"].astype(float)
    out["time_limited"] = (~np.isnan(frame["time_limit_s"].astype(float))).astype(float)
    out["auto_stop"] = protocol["auto_stop"].astype(float)
    out["data_parallel_only"] = data_parallel_only
    out["hybrid_shard"] = hybrid_shard
    out["shard_degree"] = shard_degree
    # NaN where the protocol does not state the setting: the trees learn where "not stated" belongs.
    out["gradient_accumulation"] = protocol["gradient_accumulation"].astype(float)
    out["reentrant_checkpointing"] = protocol["reentrant"].astype(float)
    version_codes, versions = distinct_values(out["tuning_version"])
    out["version_number"] = np.array([version_number(v) for v in versions], dtype=float)[version_codes]
    out["state_bytes_per_param"] = state_bytes
    out["log_state_gb"] = np.log(state_gb)
    out["log_activation_gb"] = np.log(activation_gb)
    out["log_logits_gb"] = np.log(logits_gb)
    out["log_memory_ratio"] = np.log(needed_gb / gpus.memory_gb)
    out["memory_headroom_gb"] = gpus.memory_gb - needed_gb
    out["log_flops_per_token"] = np.log(flops_per_token)
    out["log_communication_ratio"] = np.log(communication_ratio)
    out[THROUGHPUT_OFFSET] = np.log(physics_tokens_per_second)
    return {name: out[name] for name in FEATURE_NAMES}, notes


def _per_method(codes: np.ndarray, methods: np.ndarray, table: Mapping[str, float]) -> np.ndarray:
    """`table`'s number for each row's method, of `distinct_values`' codes and distinct methods."""
    return np.array([table[m] for m in methods], dtype=float)[codes]
