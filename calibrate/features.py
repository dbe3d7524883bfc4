"""Feature building for the calibrated models, in ONE place: training and prediction both call
`build_features`, whether the rows come from a benchmark CSV, a configs CSV or `JobConfig` objects.

The features are physics first (what decides memory and speed), names second:
- memory: the training state each GPU holds (weights, gradients, optimizer state by method, sharded over the
  GPUs that FSDP spreads it across) and the activations (batch per GPU x tokens x model width x depth),
  against the GPU's memory;
- speed: the FLOPs a token costs (about 6 x active parameters for full fine-tuning, plus attention), against
  the GPUs' peak FLOPs, so the regressor learns an efficiency, which carries over to model sizes and GPU
  counts it has not seen;
- the protocol: tuning-stack version, time cap, auto-stop, gradient checkpointing and accumulation, parsed
  from `experiment_id` and the identifier so that a protocol never seen before still says what it does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from twin.domain import GPU_TYPES, JobConfig, canonical_gpu_name, model_params_b

# Active parameters (billions) of the benchmark's mixture-of-experts models: what a token actually
# computes with. Total parameters (MODEL_PARAMS_B) size the memory; active ones size the FLOPs.
MOE_ACTIVE_PARAMS_B: dict[str, float] = {
    "granite-3.1-3b-a800m-instruct": 0.8,
    "granite-4.0-h-small": 9.0,
    "granite-4.0-h-tiny": 1.0,
    "mixtral-8x7b-instruct-v0.1": 12.9,
}

# Dense bf16 tensor-core peak (TFLOPS) and memory bandwidth (GB/s) from the vendors' data sheets.
GPU_PEAK_TFLOPS: dict[str, float] = {
    "NVIDIA-A100-SXM4-80GB": 312.0,
    "NVIDIA-A100-80GB-PCIe": 312.0,
    "L40S": 362.0,
    "NVIDIA-H100-PCIe": 756.0,
}
GPU_BANDWIDTH_GBS: dict[str, float] = {
    "NVIDIA-A100-SXM4-80GB": 2039.0,
    "NVIDIA-A100-80GB-PCIe": 1935.0,
    "L40S": 864.0,
    "NVIDIA-H100-PCIe": 2000.0,
}

# Bytes of training state per parameter. Full: bf16 weights and gradients, fp32 master weights and two
# Adam moments (2 + 2 + 4 + 8). LoRA: frozen bf16 weights (the adapters are negligible). GPTQ-LoRA: 4-bit
# weights plus scales.
STATE_BYTES_PER_PARAM: dict[str, float] = {"full": 16.0, "lora": 2.0, "gptq-lora": 0.55}
# FLOPs per parameter per token: forward 2, backward 4 (LoRA skips the weight gradients: 2 + 2).
FLOPS_PER_PARAM: dict[str, float] = {"full": 6.0, "lora": 4.0, "gptq-lora": 4.0}

# Width x depth of a dense transformer grows as about params^0.7 (1B: 16 x 2048, 7B: 32 x 4096,
# 70B: 80 x 8192); activations and attention FLOPs scale with it.
_WIDTH_DEPTH_AT_7B = 32 * 4096
_WIDTH_DEPTH_EXPONENT = 0.7
# Bytes of activations per token per unit of width x depth without recomputation (Korthikanti et al.).
_ACTIVATION_BYTES = 34.0

UNSEEN_NAME_NOTE = "unseen model name: size from name"
UNKNOWN_SIZE_NOTE = "unknown model size"
UNKNOWN_GPU_NOTE = "unknown GPU model"
FALLBACK_PARAMS_B = 7.0  # a typical size, used only when a name says nothing about it (and flagged)

CATEGORICAL_FEATURES: tuple[str, ...] = (
    "method",
    "gpu_model",
    "model_family",
    "protocol",
    "tuning_version",
)
NUMERIC_FEATURES: tuple[str, ...] = (
    "log_params",
    "log_active_params",
    "is_moe",
    "hybrid_mamba",
    "log_gpu_memory",
    "log_gpu_tflops",
    "log_gpu_bandwidth",
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
    "log_memory_ratio",
    "memory_headroom_gb",
    "log_flops_per_token",
    "log_peak_tokens_per_second",
)
FEATURE_NAMES: tuple[str, ...] = CATEGORICAL_FEATURES + NUMERIC_FEATURES

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
_EXTRA_KEYS = ("experiment_id", "identifier", "fms_hf_tuning_version", "torch_dtype")
_SETTING_SPLIT = re.compile(r"-(?=[a-z_]+\.)")
_PROTOCOL_VERSION = re.compile(r"-v\d+(?:\.\d+)*$")


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
    columns = list(REQUIRED_COLUMNS) + list(_DEFAULTS)
    return pd.DataFrame(rows, columns=columns)


def build_features(table: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The feature frame (FEATURE_NAMES, same index as `table`) and a note per row saying what was guessed.

    `table` is loader output (benchmark or configs) or `configs_to_frame` output; missing optional columns
    take their defaults.
    """
    missing = [c for c in REQUIRED_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"missing configuration columns: {', '.join(missing)}")
    frame = table.copy()
    for column, default in _DEFAULTS.items():
        if column not in frame.columns:
            frame[column] = default
    n = len(frame)
    out = pd.DataFrame(index=table.index)

    names = frame["model_name"].astype(str).str.strip().str.lower().to_numpy()
    params, active, notes = _model_sizes(names)
    methods = frame["method"].astype(str).str.strip().str.lower().to_numpy()
    gpus_named = np.array([canonical_gpu_name(str(g)) for g in frame["gpu_model"]], dtype=object)
    gpu_known = np.array([g in GPU_TYPES for g in gpus_named])
    for i in np.flatnonzero(~gpu_known):
        notes[i] = "; ".join(x for x in (notes[i], UNKNOWN_GPU_NOTE) if x)

    memory = np.array([GPU_TYPES[g].memory_gb if g in GPU_TYPES else np.nan for g in gpus_named])
    tflops = np.array([GPU_PEAK_TFLOPS.get(g, np.nan) for g in gpus_named])
    bandwidth = np.array([GPU_BANDWIDTH_GBS.get(g, np.nan) for g in gpus_named])
    gpus = frame["number_gpus"].to_numpy(dtype=float)
    nodes = frame["number_nodes"].to_numpy(dtype=float)
    batch = frame["batch_size"].to_numpy(dtype=float)
    tokens = frame["tokens_per_sample"].to_numpy(dtype=float)
    roce = frame["enable_roce"].astype(bool).to_numpy(dtype=float)
    expert_parallel = frame["fast_moe"].to_numpy(dtype=float)
    fast_kernels = frame["fast_kernels"].astype(bool).to_numpy(dtype=float)
    time_limit = pd.to_numeric(frame["time_limit_s"], errors="coerce").to_numpy(dtype=float)

    protocols = [
        _protocol(str(e), str(i)) for e, i in zip(frame["experiment_id"], frame["identifier"], strict=True)
    ]
    data_parallel_only = np.array([p["data_parallel_only"] for p in protocols], dtype=float)
    hybrid_shard = np.array([p["hybrid_shard"] for p in protocols], dtype=float)

    gpus_per_node = gpus / nodes
    batch_per_gpu = batch / gpus
    # FSDP shards the training state over every GPU of the job; HYBRID_SHARD only within a node; plain
    # data parallelism keeps a full copy on each GPU.
    shard_degree = np.where(data_parallel_only == 1, 1.0, np.where(hybrid_shard == 1, gpus_per_node, gpus))
    state_bytes = np.array([STATE_BYTES_PER_PARAM.get(m, np.nan) for m in methods])
    state_gb = params * state_bytes / shard_degree
    width_depth = _WIDTH_DEPTH_AT_7B * (active / 7.0) ** _WIDTH_DEPTH_EXPONENT
    activation_gb = _ACTIVATION_BYTES * batch_per_gpu * tokens * width_depth / 1e9
    flops_per_token = (
        np.array([FLOPS_PER_PARAM.get(m, np.nan) for m in methods]) * active * 1e9
        + 12.0 * width_depth * tokens  # attention scores and values, forward and backward
    )
    peak_tokens_per_second = gpus * tflops * 1e12 / flops_per_token

    out["method"] = methods
    out["gpu_model"] = gpus_named
    out["model_family"] = [_family(name) for name in names]
    out["protocol"] = [p["protocol"] for p in protocols]
    out["tuning_version"] = frame["fms_hf_tuning_version"].astype(str).str.strip().to_numpy()
    out["log_params"] = np.log(params)
    out["log_active_params"] = np.log(active)
    out["is_moe"] = (active < params * 0.95).astype(float)
    out["hybrid_mamba"] = np.array(["-h-" in name for name in names], dtype=float)
    out["log_gpu_memory"] = np.log(memory)
    out["log_gpu_tflops"] = np.log(tflops)
    out["log_gpu_bandwidth"] = np.log(bandwidth)
    out["number_gpus"] = gpus
    out["log_gpus"] = np.log(gpus)
    out["number_nodes"] = nodes
    out["gpus_per_node"] = gpus_per_node
    out["multi_node"] = (nodes > 1).astype(float)
    out["enable_roce"] = roce
    out["roce_multi_node"] = roce * (nodes > 1)
    out["log_batch"] = np.log(batch)
    out["log_batch_per_gpu"] = np.log(batch_per_gpu)
    out["log_tokens"] = np.log(tokens)
    out["log_tokens_per_gpu_step"] = np.log(batch_per_gpu * tokens)
    out["expert_parallel"] = expert_parallel
    # How many GPUs each expert group spans: the communication fast MoE pays for.
    out["experts_spread"] = np.where(expert_parallel > 0, np.minimum(expert_parallel, gpus), 0.0)
    out["fast_kernels"] = fast_kernels
    out["time_limited"] = (~np.isnan(time_limit)).astype(float)
    out["auto_stop"] = np.array([p["auto_stop"] for p in protocols], dtype=float)
    out["data_parallel_only"] = data_parallel_only
    out["hybrid_shard"] = hybrid_shard
    out["shard_degree"] = shard_degree
    out["gradient_accumulation"] = np.array([p["gradient_accumulation"] for p in protocols], dtype=float)
    out["reentrant_checkpointing"] = np.array([p["reentrant"] for p in protocols], dtype=float)
    out["version_number"] = [version_number(v) for v in out["tuning_version"]]
    out["state_bytes_per_param"] = state_bytes
    out["log_state_gb"] = np.log(state_gb)
    out["log_activation_gb"] = np.log(activation_gb)
    out["log_memory_ratio"] = np.log((state_gb + activation_gb) / memory)
    out["memory_headroom_gb"] = memory - state_gb - activation_gb
    out["log_flops_per_token"] = np.log(flops_per_token)
    out["log_peak_tokens_per_second"] = np.log(peak_tokens_per_second)
    assert len(out) == n and tuple(out.columns) == FEATURE_NAMES
    return out, notes


def version_number(version: str) -> float:
    """A number that orders tuning-stack versions, including the benchmark's mangled ones
    (`0.4.0.1.0` is older than `2.0.1`; `3` is `3.0.0`)."""
    parts = re.findall(r"\d+", version)
    if not parts:
        return float("nan")
    return float(sum(int(p) / 100.0**i for i, p in enumerate(parts[:4])))


def _model_sizes(names: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str]]:
    params = np.empty(len(names))
    active = np.empty(len(names))
    notes: list[str] = []
    cache: dict[str, tuple[float, float, str]] = {}
    for i, name in enumerate(names):
        if name not in cache:
            cache[name] = _model_size(name)
        params[i], active[i], note = cache[name]
        notes.append(note)
    return params, active, notes


def _model_size(name: str) -> tuple[float, float, str]:
    from twin.domain import MODEL_PARAMS_B

    total = model_params_b(name)
    note = "" if name in MODEL_PARAMS_B else UNSEEN_NAME_NOTE
    if total is None or not math.isfinite(total) or total <= 0:
        return FALLBACK_PARAMS_B, FALLBACK_PARAMS_B, UNKNOWN_SIZE_NOTE
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


def _protocol(experiment_id: str, identifier: str) -> dict[str, Any]:
    experiment = experiment_id.removeprefix("SFTTrainer.")
    base, *overrides = _SETTING_SPLIT.split(experiment) if experiment else [""]
    settings: dict[str, str] = {}
    for part in overrides:
        key, _, value = part.partition(".")
        settings[key] = value
    for part in _SETTING_SPLIT.split(identifier) if identifier else []:
        key, _, value = part.partition(".")
        settings.setdefault(key, value)
    # The method's own words and the recipe's version say nothing the other columns do not.
    family = _PROTOCOL_VERSION.sub("", base.split("-v1.0.0")[0] if "_benchmark" in base else base)
    family = re.sub(r"(gptq-lora|lora|full)", "M", family).replace("-r-4-a-16-tm-default", "")
    return {
        "protocol": family,
        "data_parallel_only": "-dp" in family,
        "hybrid_shard": settings.get("fsdp_sharding_strategy", "") == "HYBRID_SHARD",
        "auto_stop": "auto_stop_method" in settings,
        "gradient_accumulation": _number(settings.get("gradient_accumulation_steps")),
        "reentrant": _number(settings.get("gradient_checkpointing_use_reentrant")),
    }


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


__all__ = [
    "CATEGORICAL_FEATURES",
    "FEATURE_NAMES",
    "NUMERIC_FEATURES",
    "build_features",
    "config_from_row",
    "configs_to_frame",
    "version_number",
]
