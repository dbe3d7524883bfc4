"""The domain vocabulary shared by every part of finetwin: GPU types, LLM sizes, job configurations,
outcomes and the actuator's admission rules.

Kept free of pandas, Kafka, HTTP and scikit-learn so that the simulator and the store can use it
without pulling in the rest.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Annotated, Any, Literal, get_args

import numpy as np
from pydantic import Field

from twin.limits import STORE_INT_MAX, StorableText


@dataclass(frozen=True, slots=True)
class GpuType:
    """What finetwin knows of a GPU model: the one catalogue the twin, the features and the fallback read."""

    name: str  # as it appears in the benchmark's gpu_model column (GPU feature discovery's spelling)
    short: str  # as the paper names it
    memory_gb: float
    tdp_watts: float  # board power, used for energy when a run has no power telemetry
    dense_tflops: float  # dense bf16, from the data sheet
    # Fine-tuning speed relative to an A100-PCIe as the paper's matched pairs measure it (A100-SXM 1.18x,
    # L40S 0.68x); H100-PCIe has no pairs: 1.6x is an estimate between the A100-SXM and its data-sheet ratio,
    # corrected by the regressor where H100 runs exist. A type the benchmark never ran gets
    # `data_sheet_speed` from a measured type of its architecture.
    relative_speed: float
    intra_node_gbs: float  # GPU-to-GPU bandwidth inside a node as collectives achieve it (NVLink on SXM)
    memory_tbs: float  # memory bandwidth, from the data sheet
    # False for a type the benchmark never ran: its numbers are its data sheet's, the models know none of its
    # runs, and a prediction for it says so (calibrating on its own runs, `--observed`, makes it known).
    benchmarked: bool = True


def data_sheet_speed(measured: GpuType, dense_tflops: float, memory_tbs: float) -> float:
    """The fine-tuning speed of a GPU the benchmark did not run, from a measured type of its architecture:
    that type's speed scaled by the geometric mean of the two data-sheet ratios, compute and memory
    bandwidth. A fine-tuning step is part matrix products (bound by compute) and part element-wise and
    optimizer work (bound by memory bandwidth). From the A100-PCIe this rule gives the L40S 0.72x (the paper
    measures 0.68x over 103 pairs) and the H100-PCIe 1.58x (the sample's 5 pairs with the A100-SXM: 1.63x)."""
    return measured.relative_speed * math.sqrt(
        dense_tflops / measured.dense_tflops * memory_tbs / measured.memory_tbs
    )


_A100_SXM = GpuType("NVIDIA-A100-SXM4-80GB", "A100-SXM", 80.0, 400.0, 312.0, 1.18, 200.0, 2.039)
_A100_PCIE = GpuType("NVIDIA-A100-80GB-PCIe", "A100-PCIe", 80.0, 300.0, 312.0, 1.0, 16.0, 1.935)
_L40S = GpuType("L40S", "L40S", 48.0, 350.0, 362.0, 0.68, 16.0, 0.864)
_H100_PCIE = GpuType("NVIDIA-H100-PCIe", "H100-PCIe", 80.0, 350.0, 756.0, 1.6, 16.0, 2.0)


def _data_sheet(
    name: str, short: str, memory_gb: float, tdp_watts: float, dense_tflops: float, memory_tbs: float,
    *, like: GpuType, intra_node_gbs: float,
) -> GpuType:  # fmt: skip
    speed = data_sheet_speed(like, dense_tflops, memory_tbs)
    specs = (memory_gb, tdp_watts, dense_tflops, speed, intra_node_gbs, memory_tbs)
    return GpuType(name, short, *specs, benchmarked=False)


# The benchmark's four types, then common types it never ran, so that a cluster of them is modelled with
# its own memory, board power and speed rather than as an A100-PCIe (an L4 is not 80 GB, nor 400 W).
# Names as GPU feature discovery writes them (nvidia-smi's with hyphens); NVLink on SXM boards (H100 and
# H200: 900 GB/s against the A100's 600, so 1.5x the A100-SXM's achieved 200).
GPU_TYPES: dict[str, GpuType] = {
    g.name: g
    for g in (
        _A100_SXM,
        _A100_PCIE,
        _L40S,
        _H100_PCIE,
        _data_sheet("NVIDIA-H100-80GB-HBM3", "H100-SXM", 80.0, 700.0, 989.0, 3.35, like=_H100_PCIE,
                    intra_node_gbs=300.0),
        _data_sheet("NVIDIA-H200", "H200", 141.0, 700.0, 989.0, 4.8, like=_H100_PCIE, intra_node_gbs=300.0),
        _data_sheet("NVIDIA-A100-SXM4-40GB", "A100-SXM-40GB", 40.0, 400.0, 312.0, 1.555, like=_A100_SXM,
                    intra_node_gbs=200.0),
        _data_sheet("NVIDIA-A100-PCIE-40GB", "A100-PCIe-40GB", 40.0, 250.0, 312.0, 1.555, like=_A100_PCIE,
                    intra_node_gbs=16.0),
        _data_sheet("NVIDIA-L40", "L40", 48.0, 300.0, 181.0, 0.864, like=_L40S, intra_node_gbs=16.0),
        _data_sheet("NVIDIA-L4", "L4", 24.0, 72.0, 121.0, 0.3, like=_L40S, intra_node_gbs=16.0),
        _data_sheet("NVIDIA-A10", "A10", 24.0, 150.0, 125.0, 0.6, like=_A100_PCIE, intra_node_gbs=16.0),
    )
}  # fmt: skip
# The spellings tools print that the name and the short name do not cover (nvidia-smi: `NVIDIA H100 80GB
# HBM3`, which `gpu_key` already folds into the name).
_MORE_GPU_NAMES = {"h100-sxm5": "NVIDIA-H100-80GB-HBM3", "h100-sxm5-80gb": "NVIDIA-H100-80GB-HBM3"}
# A GPU model the catalogue does not know computes like an A100-PCIe (the features flag it in their note) and
# draws the largest board power of the catalogue's benchmarked types, so that energy is not underestimated.
UNKNOWN_GPU = GpuType("unknown", "unknown", 80.0, 400.0, 312.0, 1.0, 16.0, 1.935)


@functools.lru_cache(maxsize=1024)  # once per job of a forecast's week of history
def gpu_key(name: str) -> str:
    """A GPU name as compared with the catalogue's: lower case, spaces and underscores as hyphens, without
    the vendor. A cluster names its GPUs the way its tools print them: nvidia-smi and DCGM's exporter say
    `NVIDIA A100-SXM4-80GB`, GPU feature discovery `NVIDIA-A100-SXM4-80GB`, people `a100-sxm4-80gb`. Each
    is the benchmark's `NVIDIA-A100-SXM4-80GB`; compared as written, all but the last were unknown GPUs."""
    key = re.sub(r"[\s_-]+", "-", name.strip().lower())
    return key.removeprefix("nvidia-")


_GPU_ALIASES = (
    {gpu_key(g.short): g.name for g in GPU_TYPES.values()}
    | {gpu_key(g.name): g.name for g in GPU_TYPES.values()}
    | _MORE_GPU_NAMES
)

GPUS_PER_NODE = 8


class UnknownGpuModel(ValueError):
    """A GPU name the catalogue does not know; the message suggests the closest known names."""


def unknown_gpu_message(name: str) -> str:
    """`unknown GPU model 'X'; did you mean 'Y'? (known: ...)`: the one wording for every input."""
    import difflib

    key = gpu_key(name)
    # A family name (`A100`, `H100`) means one of its members: every one, in the catalogue's order, before
    # names that are merely spelled alike (`A10` is one letter from `A100`, and another GPU).
    members = [alias for alias in _GPU_ALIASES if alias.startswith(f"{key}-")]
    close = members or difflib.get_close_matches(key, list(_GPU_ALIASES), n=3, cutoff=0.5)
    named = [_GPU_ALIASES[c] for c in close]
    suggestions = [g for g in GPU_TYPES if g in named] if members else list(dict.fromkeys(named))
    hint = f"; did you mean {' or '.join(repr(s) for s in suggestions)}?" if suggestions else ""
    return f"unknown GPU model {name!r}{hint} (known: {', '.join(GPU_TYPES)})"


def known_gpu_name(name: str) -> str:
    """The benchmark's spelling of a known GPU name in any spelling; an unknown one raises UnknownGpuModel."""
    canonical = _GPU_ALIASES.get(gpu_key(name))
    if canonical is None:
        raise UnknownGpuModel(unknown_gpu_message(name))
    return canonical


def gpu_type(name: str) -> GpuType:
    """The GPU type for a benchmark name or the paper's short name; unknown names raise KeyError."""
    canonical = _GPU_ALIASES.get(gpu_key(name))
    if canonical is None:
        raise KeyError(unknown_gpu_message(name))
    return GPU_TYPES[canonical]


def canonical_gpu_name(name: str) -> str:
    """The benchmark's spelling of a GPU name when it is known, otherwise the name unchanged."""
    return _GPU_ALIASES.get(gpu_key(name), name)


def gpu_or_unknown(name: str) -> GpuType:
    """The catalogue's entry for a GPU name in any known spelling, else `UNKNOWN_GPU`."""
    return GPU_TYPES.get(canonical_gpu_name(name), UNKNOWN_GPU)


# Billions of parameters (MoE: total), from the benchmark's schema notes.
MODEL_PARAMS_B: dict[str, float] = {
    "allam-1-13b": 13,
    "granite-13b-v2": 13,
    "granite-20b-v2": 20,
    "granite-3-8b": 8.1,
    "granite-3.1-2b": 2.5,
    "granite-3.1-3b-a800m-instruct": 3.3,
    "granite-3.1-8b-instruct": 8.1,
    "granite-3.3-8b": 8.1,
    "granite-34b-code-base": 34,
    "granite-3b-code-base-128k": 3,
    "granite-4.0-1b": 1.6,
    "granite-4.0-350m": 0.35,
    "granite-4.0-h-1b": 1.5,
    "granite-4.0-h-micro": 3,
    "granite-4.0-h-small": 32,
    "granite-4.0-h-tiny": 7,
    "granite-4.0-micro": 3,
    "granite-7b-base": 7,
    "granite-8b-code-base": 8,
    "granite-8b-japanese": 8,
    "llama-13b": 13,
    "llama-7b": 6.7,
    "llama2-70b": 70,
    "llama3-70b": 70,
    "llama3-8b": 8,
    "llama3.1-405b": 405,
    "llama3.1-70b": 70,
    "llama3.1-8b": 8,
    "llama3.2-1b": 1.2,
    "llama3.2-3b": 3.2,
    "mistral-123b-v2": 123,
    "mistral-7b-v0.1": 7.2,
    "mixtral-8x7b-instruct-v0.1": 46.7,
}
MOE_MODELS = frozenset(
    {
        "granite-3.1-3b-a800m-instruct",
        "granite-4.0-h-small",
        "granite-4.0-h-tiny",
        "mixtral-8x7b-instruct-v0.1",
    }
)

Method = Literal["full", "lora", "gptq-lora"]
METHODS: tuple[str, ...] = get_args(Method)


class Outcome(StrEnum):
    VALID = "valid"
    REJECTED = "rejected"
    RUNTIME = "runtime"  # failed at runtime: out of memory or an illegal memory access


class Rule(StrEnum):
    """The actuator's admission rules, in the order the paper checks them."""

    BATCH_NOT_MULTIPLE_OF_GPUS = "batch_size_not_multiple_of_gpus"
    GPUS_NOT_MULTIPLE_OF_EXPERT_PARALLEL = "gpus_not_multiple_of_expert_parallel_degree"
    GPUS_NOT_MULTIPLE_OF_NODES = "gpus_not_multiple_of_nodes"


RULE_ORDER: tuple[Rule, ...] = tuple(Rule)


# A count finetwin accepts: a whole JSON number (not 4.0, not "4"), at least 1, that the store holds.
# The store's bound is the only upper one: the models answer for any size, and the code that searches over a
# count (repairing the nodes of a job) does so in O(sqrt(n)).
Count = Annotated[int, Field(ge=1, le=STORE_INT_MAX, strict=True)]
# A flag is a JSON boolean: not 0, 1 or "true".
Flag = Annotated[bool, Field(strict=True)]
# A time cap finetwin accepts: a number of seconds (a JSON integer will do), at most about 31 years.
MAX_TIME_LIMIT_S = 1e9
Seconds = Annotated[float, Field(gt=0, le=MAX_TIME_LIMIT_S, allow_inf_nan=False, strict=True)]


def fewest_nodes(config: dict[str, Any]) -> int:
    """`number_nodes` of a configuration that does not say: the fewest nodes, of at most 8 GPUs each, that
    its GPUs divide evenly (1 for up to 8, as the jobs of the benchmark run; 2 for 16, 3 for 9). The fewest
    nodes of 8 that hold them broke the admission rule the nodes must keep for any count not a multiple of
    8 (9 GPUs on 2 nodes): a job was rejected for a number it never gave."""
    gpus = config.get("number_gpus")
    if not isinstance(gpus, int) or gpus <= 0:
        return 1
    return nodes_dividing(gpus, -(-gpus // GPUS_PER_NODE))


@dataclass(frozen=True, slots=True)
class JobConfig:
    """One fine-tuning configuration in the benchmark's own terms.

    The one declaration of a configuration's fields: their types, bounds and defaults (the `Field`
    metadata). The models at the boundaries (the telemetry payload, the API's requests and answers, the
    advice file) derive from it (`twin.job_config`); `predict`'s CSV columns and the feature converter's
    columns too. Inside finetwin a JobConfig states every field (plain dataclass, no validation: the
    simulator and the advisor build many); only at a boundary does `number_nodes` default.
    """

    model_name: Annotated[StorableText, Field(min_length=1, max_length=200, examples=["llama3-8b"])]
    method: Method
    gpu_model: Annotated[
        StorableText, Field(min_length=1, max_length=100, examples=["NVIDIA-A100-SXM4-80GB"])
    ]
    number_gpus: Count
    number_nodes: Annotated[
        Count,
        Field(
            default_factory=fewest_nodes,
            description="default: the fewest nodes of at most 8 GPUs that divide them",
        ),
    ]
    batch_size: Count
    tokens_per_sample: Count
    enable_roce: Flag = False
    fast_moe: Annotated[
        int, Field(ge=0, le=STORE_INT_MAX, strict=True, description="expert-parallel degree, 0 = off")
    ] = 0
    fast_kernels: Flag = False
    time_limit_s: Seconds | None = None
    # The benchmark's descriptors of the run (experiment_id, identifier, ...) when known: they feed the
    # protocol features, and are not part of what makes two configurations the same.
    extra: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def batch_per_gpu(self) -> float:
        return self.batch_size / self.number_gpus

    @property
    def run_limit_s(self) -> float | None:
        """How long the run may last (`run_time_limit`): its time limit, else its protocol's cap."""
        return run_time_limit(self.time_limit_s, self.extra.get("experiment_id"))

    @property
    def gpus_per_node(self) -> float:
        return self.number_gpus / self.number_nodes

    def with_changes(self, **changes: object) -> JobConfig:
        return replace(self, **changes)  # type: ignore[arg-type]


# A benchmark protocol that stops its trainer after N seconds says so in its experiment id.
_STOP_AFTER_SECONDS = re.compile(r"stop_after_seconds\.(\d+(?:\.\d+)?)")


@functools.lru_cache(maxsize=1024)
def protocol_time_limit(experiment_id: str | None) -> float | None:
    """The time cap of a benchmark protocol, `stop_after_seconds.N` in its experiment id; None without one,
    and for an N no time limit could be (0, or past MAX_TIME_LIMIT_S: 400 digits read as infinity, which
    then reached the advice's JSON)."""
    found = _STOP_AFTER_SECONDS.search(experiment_id) if experiment_id else None
    cap = float(found.group(1)) if found else None
    return cap if cap is not None and 0 < cap <= MAX_TIME_LIMIT_S else None


def run_time_limit(time_limit_s: float | None, experiment_id: str | None) -> float | None:
    """How long a run may last: the time limit it was given, else the cap of its protocol (its trainer stops
    itself there, as the benchmark's capped runs did), else None. The one rule of the loader's rows, the
    models' features, the twin's runs and advice: a live job whose telemetry names a capped protocol and no
    limit ran uncapped in the twin while the models were asked about it as capped."""
    return time_limit_s if time_limit_s is not None else protocol_time_limit(experiment_id)


def broken_rule(number_gpus: int, batch_size: int, fast_moe: int, number_nodes: int) -> Rule | None:
    """The first admission rule a configuration breaks, in the paper's order, or None."""
    if number_gpus <= 0 or batch_size % number_gpus != 0:
        return Rule.BATCH_NOT_MULTIPLE_OF_GPUS
    if fast_moe > 0 and number_gpus % fast_moe != 0:
        return Rule.GPUS_NOT_MULTIPLE_OF_EXPERT_PARALLEL
    if number_nodes <= 0 or number_gpus % number_nodes != 0:
        return Rule.GPUS_NOT_MULTIPLE_OF_NODES
    return None


def broken_rules(number_gpus: Any, batch_size: Any, fast_moe: Any, number_nodes: Any) -> np.ndarray:
    """`broken_rule` of every row, a column at a time (integer arrays of one length): each row's first broken
    rule's value, or None, as an object array. A Python call per row cost ~0.1 s on 100,000 rows."""
    gpus, batch, moe, nodes = (
        np.asarray(c, dtype=np.int64) for c in (number_gpus, batch_size, fast_moe, number_nodes)
    )
    first = (gpus <= 0) | (batch % np.where(gpus > 0, gpus, 1) != 0)
    second = ~first & (moe > 0) & (gpus % np.where(moe > 0, moe, 1) != 0)
    third = ~first & ~second & ((nodes <= 0) | (gpus % np.where(nodes > 0, nodes, 1) != 0))
    rules = np.full(len(gpus), None, dtype=object)
    rules[first] = Rule.BATCH_NOT_MULTIPLE_OF_GPUS.value
    rules[second] = Rule.GPUS_NOT_MULTIPLE_OF_EXPERT_PARALLEL.value
    rules[third] = Rule.GPUS_NOT_MULTIPLE_OF_NODES.value
    return rules


def nearest_multiple(value: int, step: int) -> int:
    """The multiple of `step` nearest to `value` (at least `step`); ties go up (a batch is rarely cut).

    How a batch is repaired to satisfy the first admission rule, by the twin's admission control and by the
    advisor alike."""
    down = (value // step) * step
    up = down + step
    if down < step:
        return up
    return down if value - down < up - value else up


def nodes_dividing(gpus: int, wanted: int) -> int:
    """The node count nearest to `wanted` (ties: fewer) that divides `gpus` with at most 8 GPUs per node: how
    a configuration that breaks the third admission rule is repaired. O(sqrt(gpus)): a count may be as large
    as the store holds."""
    divisors = set()
    for small in range(1, math.isqrt(gpus) + 1):
        if gpus % small == 0:
            divisors.update((small, gpus // small))
    options = [n for n in divisors if gpus // n <= GPUS_PER_NODE]
    return min(options, key=lambda n: (abs(n - wanted), n))


def config_rule(config: JobConfig) -> Rule | None:
    return broken_rule(config.number_gpus, config.batch_size, config.fast_moe, config.number_nodes)


@functools.lru_cache(maxsize=4096)  # on the twin's path once per job of every run
def name_key(name: str) -> str:
    """A model's or a method's name as the models read it: trimmed and lower-cased, as the benchmark writes
    every one ('Llama3-8B ' is llama3-8b, and gets its numbers); a model the benchmark measured, named as
    Hugging Face names it, is that model ('meta-llama/Meta-Llama-3-8B' is llama3-8b)."""
    key = str(name).strip().lower()
    return _MEASURED_BY_SPELLING.get(_spelling_key(key), key)


def _spelling_key(name: str) -> str:
    """What is left of a lower-case model name when its spelling is left out: the organisation of a Hugging
    Face id, Meta's own prefix, the `-hf` of a converted checkpoint, and every separator. The benchmark's
    llama3.1-8b and Meta's meta-llama/Llama-3.1-8B are both `llama318b`."""
    name = name.rsplit("/", 1)[-1]
    name = re.sub(r"^meta-(?=llama)", "", name).removesuffix("-hf")
    return re.sub(r"[\s_.-]+", "", name)


# Each measured model by its spelling key: a name that differs from the benchmark's only in spelling gets
# that model's numbers, and advice ranked on what its runs showed (read as written, it was a model never
# measured, and its advice fell back on the failure model's bound for new models: no recommendation).
_MEASURED_BY_SPELLING: dict[str, str] = {_spelling_key(name): name for name in MODEL_PARAMS_B}
assert len(_MEASURED_BY_SPELLING) == len(MODEL_PARAMS_B), "two measured models spelled alike"


def unseen_model_warning(name: str) -> str | None:
    """None for a model the benchmark measured (whatever its case); otherwise what to tell the person up
    front: the numbers are extrapolated from the name, and (for a likely typo) the closest measured names."""
    import difflib

    key = name_key(name)
    if key in MODEL_PARAMS_B:
        return None
    close = difflib.get_close_matches(key, list(MODEL_PARAMS_B), n=2, cutoff=0.75)
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    # A name that says no size ('x', 'my-model') is modelled at a typical size, not from its name.
    sized = params_from_name(key) is not None
    basis = "the size in its name" if sized else "a typical size (its name says none)"
    return (
        f"{name!r} is not a model the benchmark measured{hint}: what follows is extrapolated from {basis}, "
        "not learned from runs of it"
    )


def model_params_b(model_name: str) -> float | None:
    """Parameters in billions for a known model, else a guess from a size token in the name, else None.

    A name never seen before ("acme-13b-chat") still says its size; that is what lets the models
    generalize to new LLMs.
    """
    known = MODEL_PARAMS_B.get(name_key(model_name))
    if known is not None:
        return known
    return params_from_name(model_name)


def params_from_name(model_name: str) -> float | None:
    import re

    best: float | None = None
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([bm])(?![a-z])", model_name.lower()):
        value = float(number) / (1000.0 if unit == "m" else 1.0)
        # "8x7b" means eight experts of 7B: the total is what sizes the memory.
        expert = re.search(r"(\d+)x" + re.escape(number) + unit, model_name.lower())
        if expert:
            value *= int(expert.group(1)) * 0.83  # shared attention: Mixtral 8x7B is 46.7B, not 56B
        best = value if best is None else max(best, value)
    return best
