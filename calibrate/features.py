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

import math
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from twin.domain import GPU_TYPES, METHODS, MODEL_PARAMS_B, JobConfig, canonical_gpu_name, model_params_b

# Active parameters (billions) of the benchmark's mixture-of-experts models: what a token computes with.
# Total parameters (MODEL_PARAMS_B) size the memory; active ones size the FLOPs.
MOE_ACTIVE_PARAMS_B: dict[str, float] = {
    "granite-3.1-3b-a800m-instruct": 0.8,
    "granite-4.0-h-small": 9.0,
    "granite-4.0-h-tiny": 1.0,
    "mixtral-8x7b-instruct-v0.1": 12.9,
}

# Vocabulary size by model family: the logits (batch x tokens x vocabulary, in fp32) are often the largest
# single activation, and llama3's 128k vocabulary is four times llama2's.
VOCABULARY_BY_FAMILY: dict[str, int] = {
    "llama": 32000,
    "llama2": 32000,
    "llama3": 128256,
    "llama3.1": 128256,
    "llama3.2": 128256,
    "mistral": 32768,
    "mixtral": 32000,
    "allam": 64000,
    "granite": 50304,
    "granite-code": 49152,
    "granite-3": 49155,
    "granite-3.1": 49155,
    "granite-3.3": 49159,
    "granite-4.0": 100352,
    "granite-4.0-h": 100352,
}
DEFAULT_VOCABULARY = 50000


# Per GPU type: dense bf16 TFLOPS (data sheet); speed relative to A100-PCIe as the paper's matched pairs
# measure it (A100-SXM 1.18x, L40S 0.68x; H100-PCIe has no pairs: 1.6x is an estimate between the A100-SXM
# and its data-sheet ratio, corrected by the regressor where H100 runs exist); GPU-to-GPU bandwidth inside a
# node in GB/s (NVLink on SXM boards, PCIe otherwise), as achieved by collectives.
GPU_SPECS: dict[str, tuple[float, float, float]] = {
    "NVIDIA-A100-SXM4-80GB": (312.0, 1.18, 200.0),
    "NVIDIA-A100-80GB-PCIe": (312.0, 1.0, 16.0),
    "L40S": (362.0, 0.68, 16.0),
    "NVIDIA-H100-PCIe": (756.0, 1.6, 16.0),
}
# A GPU type finetwin does not know is taken as an A100-PCIe (and flagged in the note).
UNKNOWN_GPU_SPEC = (80.0, 312.0, 1.0, 16.0)
_REFERENCE_TFLOPS = 312.0  # the A100-PCIe's, the unit of the relative speeds
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

UNSEEN_NAME_NOTE = "unseen model name: size from name"
UNKNOWN_SIZE_NOTE = "unknown model size"
UNKNOWN_GPU_NOTE = "unknown GPU model: taken as an A100-PCIe"
FALLBACK_PARAMS_B = 7.0  # a typical size, used only when a name says nothing about it (and flagged)

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

# Columns a frame needs for `build_features`; the others have defaults.
REQUIRED_COLUMNS: tuple[str, ...] = (
    "model_name",
    "method",
    "gpu_model",
    "number_gpus",
    "number_nodes",
    "batch_size",
    "tokens_per_sample",
)
_DEFAULTS: dict[str, Any] = {
    "enable_roce": False,
    "fast_moe": 0,
    "fast_kernels": False,
    "time_limit_s": np.nan,
    "experiment_id": "",
    "identifier": "",
    "fms_hf_tuning_version": "",
    "torch_dtype": "bfloat16",
}
_PROTOCOL_KEYS = (
    "protocol",
    "data_parallel_only",
    "hybrid_shard",
    "auto_stop",
    "gradient_accumulation",
    "reentrant",
)
_EXTRA_KEYS = ("experiment_id", "identifier", "fms_hf_tuning_version", "torch_dtype")
_SETTING_SPLIT = re.compile(r"-(?=[a-z_]+\.)")
_PROTOCOL_VERSION = re.compile(r"-v\d+(?:\.\d+)*$")
_IDENTIFIER_SETTINGS = {
    key: re.compile(rf"(?:^|-){key}\.([A-Za-z0-9_.]+?)(?=-[a-z_]+\.|$)")
    for key in (
        "fsdp_sharding_strategy",
        "gradient_accumulation_steps",
        "gradient_checkpointing_use_reentrant",
    )
}


def config_from_row(row: Mapping[str, Any]) -> JobConfig:
    """A JobConfig from one loader row (a pandas row or a dict); protocol columns go to `extra`."""
    limit = row.get("time_limit_s")
    extra = {key: str(row[key]) for key in _EXTRA_KEYS if key in row and _present(row[key])}
    return JobConfig(
        model_name=str(row["model_name"]),
        method=str(row["method"]),
        gpu_model=str(row["gpu_model"]),
        number_gpus=int(row["number_gpus"]),
        number_nodes=int(row["number_nodes"]),
        batch_size=int(row["batch_size"]),
        tokens_per_sample=int(row["tokens_per_sample"]),
        enable_roce=bool(row.get("enable_roce", False)),
        fast_moe=int(row.get("fast_moe", 0)),
        fast_kernels=bool(row.get("fast_kernels", False)),
        time_limit_s=float(limit) if _present(limit) else None,
        extra=extra,
    )


def configs_to_frame(configs: Sequence[JobConfig]) -> pd.DataFrame:
    """The loader's column layout for a list of JobConfigs, so they go through the same features."""
    rows = []
    for config in configs:
        row: dict[str, Any] = {
            "model_name": config.model_name,
            "method": config.method,
            "gpu_model": config.gpu_model,
            "number_gpus": config.number_gpus,
            "number_nodes": config.number_nodes,
            "batch_size": config.batch_size,
            "tokens_per_sample": config.tokens_per_sample,
            "enable_roce": config.enable_roce,
            "fast_moe": config.fast_moe,
            "fast_kernels": config.fast_kernels,
            "time_limit_s": np.nan if config.time_limit_s is None else float(config.time_limit_s),
        }
        for key in _EXTRA_KEYS:
            row[key] = config.extra.get(key, _DEFAULTS[key])
        rows.append(row)
    return pd.DataFrame(rows, columns=[*REQUIRED_COLUMNS, *_DEFAULTS])


def build_features(table: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The feature frame (FEATURE_NAMES, same index as `table`) and a note per row saying what was guessed.

    `table` is loader output (benchmark or configs) or `configs_to_frame` output; missing optional columns
    take their defaults. Raises ValueError naming the row (position) and column of an impossible value.
    """
    columns, notes = feature_columns(table)
    return pd.DataFrame(columns, index=table.index, columns=list(FEATURE_NAMES)), notes


def feature_columns(table: pd.DataFrame) -> tuple[dict[str, np.ndarray], list[str]]:
    """`build_features` as one array per feature (FEATURE_NAMES order), without the frame around them: the
    prediction path encodes these straight into a numeric matrix (`calibrate.encoding`). Building a frame
    column by column cost most of a ~100-row prediction."""
    frame = _validated(table)
    out: dict[str, np.ndarray] = {}

    names = frame["model_name"]
    params, active, notes = _model_sizes(names)
    methods = frame["method"]
    gpus_named = [canonical_gpu_name(g) for g in frame["gpu_model"]]
    specs = [_gpu(g) for g in gpus_named]
    memory, tflops, relative_speed, intra_node_gbs = (np.array([s[i] for s in specs]) for i in range(4))
    for i, spec in enumerate(specs):
        if not spec[4]:
            notes[i] = "; ".join(x for x in (notes[i], UNKNOWN_GPU_NOTE) if x)

    gpus = frame["number_gpus"]
    nodes = frame["number_nodes"]
    batch = frame["batch_size"]
    tokens = frame["tokens_per_sample"]
    roce = frame["enable_roce"].astype(bool)
    expert_parallel = frame["fast_moe"].astype(float)
    time_limit = frame["time_limit_s"].astype(float)
    protocol = _protocols(frame["experiment_id"], frame["identifier"])
    families = np.array([_family(name) for name in names], dtype=object)
    vocabulary = np.array([VOCABULARY_BY_FAMILY.get(f, DEFAULT_VOCABULARY) for f in families], dtype=float)

    gpus_per_node = gpus / nodes
    batch_per_gpu = batch / gpus
    data_parallel_only = protocol["data_parallel_only"].astype(float)
    hybrid_shard = protocol["hybrid_shard"].astype(float)
    # FSDP shards the training state over every GPU of the job; HYBRID_SHARD only within a node; plain
    # data parallelism keeps a full copy on each GPU.
    shard_degree = np.where(data_parallel_only == 1, 1.0, np.where(hybrid_shard == 1, gpus_per_node, gpus))

    # Memory per GPU, in GB.
    state_bytes = _per_method(methods, STATE_BYTES_PER_PARAM)
    state_gb = params * state_bytes / shard_degree
    width_depth = _WIDTH_DEPTH_AT_7B * (active / 7.0) ** _WIDTH_DEPTH_EXPONENT
    activation_gb = _ACTIVATION_BYTES * batch_per_gpu * tokens * width_depth / 1e9
    logits_gb = _LOGIT_BYTES * batch_per_gpu * tokens * vocabulary / 1e9
    needed_gb = state_gb + activation_gb + logits_gb

    # Speed: compute time of one step on one GPU against the time to move weights and gradients.
    flops_per_token = (
        _per_method(methods, FLOPS_PER_PARAM) * active * 1e9
        + 12.0 * width_depth * tokens  # attention scores and values, forward and backward
    )
    effective_flops = _REFERENCE_TFLOPS * 1e12 * relative_speed
    compute_s = flops_per_token * batch_per_gpu * tokens / (effective_flops * NOMINAL_UTILIZATION)
    weight_bytes = _per_method(methods, WEIGHT_BYTES_PER_PARAM) * params * 1e9
    gradient_bytes = _per_method(methods, GRADIENT_BYTES_PER_PARAM) * params * 1e9
    # FSDP gathers the weights for the forward and again for the backward pass and reduce-scatters the
    # gradients; plain data parallelism all-reduces the gradients only.
    step_bytes = np.where(data_parallel_only == 1, 2.0 * gradient_bytes, 2.0 * weight_bytes + gradient_bytes)
    step_bytes = step_bytes * (gpus - 1.0) / gpus
    link_gbs = np.where(
        nodes > 1, np.where(roce, INTER_NODE_GBS[True], INTER_NODE_GBS[False]), intra_node_gbs
    )
    communication_s = step_bytes / (link_gbs * 1e9)
    physics_tokens_per_second = (
        gpus
        * effective_flops
        * NOMINAL_UTILIZATION
        / flops_per_token
        * compute_s
        / (compute_s + communication_s)
    )

    out["method"] = methods
    out["gpu_model"] = np.array(gpus_named, dtype=object)
    out["model_family"] = families
    out["protocol"] = protocol["protocol"]
    out["tuning_version"] = frame["fms_hf_tuning_version"]
    out["log_params"] = np.log(params)
    out["log_active_params"] = np.log(active)
    out["is_moe"] = (active < params * 0.95).astype(float)
    out["hybrid_mamba"] = np.array(["-h-" in name for name in names], dtype=float)
    out["log_vocabulary"] = np.log(vocabulary)
    out["log_gpu_memory"] = np.log(memory)
    out["log_gpu_tflops"] = np.log(tflops)
    out["log_gpu_relative_speed"] = np.log(relative_speed)
    out["number_gpus"] = gpus
    out["log_gpus"] = np.log(gpus)
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
    out["experts_spread"] = np.where(expert_parallel > 0, np.minimum(expert_parallel, gpus), 0.0)
    out["fast_kernels"] = frame["fast_kernels"].astype(float)
    out["time_limited"] = (~np.isnan(time_limit)).astype(float)
    out["auto_stop"] = protocol["auto_stop"].astype(float)
    out["data_parallel_only"] = data_parallel_only
    out["hybrid_shard"] = hybrid_shard
    out["shard_degree"] = shard_degree
    # NaN where the protocol does not state the setting: the trees learn where "not stated" belongs.
    out["gradient_accumulation"] = protocol["gradient_accumulation"].astype(float)
    out["reentrant_checkpointing"] = protocol["reentrant"].astype(float)
    out["version_number"] = np.array([version_number(v) for v in out["tuning_version"]], dtype=float)
    out["state_bytes_per_param"] = state_bytes
    out["log_state_gb"] = np.log(state_gb)
    out["log_activation_gb"] = np.log(activation_gb)
    out["log_logits_gb"] = np.log(logits_gb)
    out["log_memory_ratio"] = np.log(needed_gb / memory)
    out["memory_headroom_gb"] = memory - needed_gb
    out["log_flops_per_token"] = np.log(flops_per_token)
    out["log_communication_ratio"] = np.log((communication_s + 1e-6) / compute_s)
    out[THROUGHPUT_OFFSET] = np.log(physics_tokens_per_second)
    return {name: out[name] for name in FEATURE_NAMES}, notes


@lru_cache(maxsize=256)
def version_number(version: str) -> float:
    """A number that orders tuning-stack versions, including the benchmark's mangled ones
    (`0.4.0.1.0` is older than `2.0.1`; `3` is `3.0.0`); NaN when there is none."""
    parts = re.findall(r"\d+", version)
    if not parts:
        return float("nan")
    return float(sum(int(p) / 100.0**i for i, p in enumerate(parts[:4])))


def _validated(table: pd.DataFrame) -> dict[str, np.ndarray]:
    """The configuration columns as arrays (text stripped, numbers as floats, defaults filled). Plain
    arrays, not a frame: pandas' per-column costs dominated small (advice-sized) tables."""
    missing = [c for c in REQUIRED_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"missing configuration columns: {', '.join(missing)}")
    frame: dict[str, np.ndarray] = {}
    for column in ("model_name", "method", "gpu_model"):
        frame[column] = _text(table[column])
    frame["model_name"] = np.array([name.lower() for name in frame["model_name"]], dtype=object)
    frame["method"] = np.array([method.lower() for method in frame["method"]], dtype=object)
    _check(~np.isin(frame["method"], METHODS), "method", f"must be one of {', '.join(METHODS)}")
    _check(frame["model_name"] == "", "model_name", "is empty")
    for column in ("number_gpus", "number_nodes", "batch_size", "tokens_per_sample"):
        values = _numbers(table[column])
        _check(~(values >= 1), column, "must be a number of at least 1")
        frame[column] = values
    n = len(table)
    for column, default in _DEFAULTS.items():
        if column not in table.columns:
            frame[column] = np.full(n, default, dtype=object if isinstance(default, str) else None)
        elif column in ("enable_roce", "fast_kernels"):
            frame[column] = table[column].fillna(False).astype(bool).to_numpy()
        elif column == "fast_moe":
            values = np.nan_to_num(_numbers(table[column]), nan=0.0)
            _check(values < 0, column, "must not be negative")
            frame[column] = values
        elif column == "time_limit_s":
            frame[column] = _numbers(table[column])
        else:
            frame[column] = _text(table[column].fillna(default))
    return frame


def _text(column: pd.Series) -> np.ndarray:
    return np.array([str(value).strip() for value in column.to_numpy()], dtype=object)


def _numbers(column: pd.Series) -> np.ndarray:
    if column.dtype.kind in "iuf":
        return column.to_numpy(dtype=float)
    return pd.to_numeric(column, errors="coerce").to_numpy(dtype=float)


def _check(bad: np.ndarray, column: str, message: str) -> None:
    bad_array = np.asarray(bad, dtype=bool)
    if bad_array.any():
        row = int(np.argmax(bad_array))
        raise ValueError(f"row {row}: column {column!r} {message}")


@lru_cache(maxsize=64)
def _gpu(name: str) -> tuple[float, float, float, float, bool]:
    """(memory GB, dense bf16 TFLOPS, relative speed, GPU-to-GPU GB/s inside a node, known)."""
    spec = GPU_SPECS.get(name)
    if spec is None:
        return (*UNKNOWN_GPU_SPEC, False)
    return (GPU_TYPES[name].memory_gb, *spec, True)


def _per_method(methods: np.ndarray, table: Mapping[str, float]) -> np.ndarray:
    return np.array([table[m] for m in methods], dtype=float)


def _model_sizes(names: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str]]:
    sizes = [_model_size(str(name)) for name in names]
    params = np.array([s[0] for s in sizes], dtype=float)
    active = np.array([s[1] for s in sizes], dtype=float)
    return params, active, [s[2] for s in sizes]


@lru_cache(maxsize=1024)
def _model_size(name: str) -> tuple[float, float, str]:
    total = model_params_b(name)
    if total is None or not math.isfinite(total) or total <= 0:
        return FALLBACK_PARAMS_B, FALLBACK_PARAMS_B, UNKNOWN_SIZE_NOTE
    note = "" if name in MODEL_PARAMS_B else UNSEEN_NAME_NOTE
    active = MOE_ACTIVE_PARAMS_B.get(name)
    if active is None:
        active = _active_from_name(name, total)
    return float(total), float(min(active, total)), note


def _active_from_name(name: str, total: float) -> float:
    """Active parameters of an unseen MoE name: `a800m` says it; `8x7b` routes each token to 2 of 8."""
    said = re.search(r"-a(\d+(?:\.\d+)?)([bm])(?![a-z])", name)
    if said:
        return float(said.group(1)) / (1000.0 if said.group(2) == "m" else 1.0)
    experts = re.search(r"(\d+)x\d+(?:\.\d+)?b", name)
    if experts and int(experts.group(1)) > 2:
        return total * 2.0 / int(experts.group(1)) * 1.1  # shared attention is always active
    return total


@lru_cache(maxsize=1024)
def _family(name: str) -> str:
    """The model family and generation (`llama3.1`, `granite-4.0-h`, `granite-code`): shared by sizes of
    one generation, so an unseen size of a known family still gets the family's tokenizer and layout."""
    found = re.match(r"([a-z]+)-?(\d+(?:\.\d+)?(?=-|$))?(-h(?=-))?", name)
    if not found:
        return name
    family, generation, hybrid = found.groups()
    if family in ("mistral", "mixtral", "allam"):
        return family
    text = family + (("-" if family == "granite" else "") + generation if generation else "")
    return text + ("-h" if hybrid else "") + ("-code" if "code" in name else "")


def _protocols(experiment_ids: np.ndarray, identifiers: np.ndarray) -> dict[str, np.ndarray]:
    """The protocol columns of every row: parsed once per distinct experiment and per distinct identifier
    (for settings the experiment does not state)."""
    experiments = _by_distinct(experiment_ids, lambda e: dict(_experiment(e)))
    columns = {key: np.array([parsed[key] for parsed in experiments]) for key in _PROTOCOL_KEYS}
    found = _by_distinct(identifiers, _identifier_settings)
    for column, key in (("gradient_accumulation", "gradient_accumulation_steps"),
                        ("reentrant", "gradient_checkpointing_use_reentrant")):  # fmt: skip
        stated = columns[column].astype(float)
        columns[column] = np.where(np.isnan(stated), np.array([_number(f[key]) for f in found]), stated)
    hybrid = np.array([f["fsdp_sharding_strategy"] == "HYBRID_SHARD" for f in found], dtype=bool)
    columns["hybrid_shard"] = columns["hybrid_shard"].astype(bool) | hybrid
    return columns


def _by_distinct(values: np.ndarray, parse: Any) -> list[Any]:
    """`parse` of each value, computed once per distinct value (the full benchmark repeats them)."""
    parsed: dict[str, Any] = {}
    return [parsed[v] if v in parsed else parsed.setdefault(v, parse(v)) for v in values]


@lru_cache(maxsize=4096)
def _identifier_settings(identifier: str) -> dict[str, str | None]:
    settings: dict[str, str | None] = {}
    for key, pattern in _IDENTIFIER_SETTINGS.items():
        match = pattern.search(identifier)
        settings[key] = match.group(1) if match else None
    return settings


@lru_cache(maxsize=256)
def _experiment(experiment_id: str) -> tuple[tuple[str, Any], ...]:
    experiment = experiment_id.removeprefix("SFTTrainer.")
    base, *overrides = _SETTING_SPLIT.split(experiment) if experiment else [""]
    settings: dict[str, str] = {}
    for part in overrides:
        key, _, value = part.partition(".")
        settings[key] = value
    # The method's own words and the recipe's version say nothing the other columns do not.
    family = _PROTOCOL_VERSION.sub("", base.split("-v1.0.0")[0] if "_benchmark" in base else base)
    family = re.sub(r"(gptq-lora|lora|full)", "M", family).replace("-r-4-a-16-tm-default", "")
    return (
        ("protocol", family),
        ("data_parallel_only", "-dp" in family),
        ("hybrid_shard", settings.get("fsdp_sharding_strategy", "") == "HYBRID_SHARD"),
        ("auto_stop", "auto_stop_method" in settings),
        ("gradient_accumulation", _number(settings.get("gradient_accumulation_steps"))),
        ("reentrant", _number(settings.get("gradient_checkpointing_use_reentrant"))),
    )


def _number(text: str | None) -> float:
    try:
        return float(text) if text is not None else float("nan")
    except ValueError:
        return float("nan")


def _present(value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, float) and math.isnan(value):
        return False
    return not (isinstance(value, str) and not value.strip())
