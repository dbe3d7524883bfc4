"""The benchmark's protocol of a run, parsed from its `experiment_id` and `identifier`: the recipe family,
tuning-stack version, time cap, auto-stop, sharding, gradient accumulation and checkpointing, so that a
protocol never seen before still says what it does."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import numpy as np

from calibrate.loader import distinct_values

_PROTOCOL_KEYS = (
    "protocol",
    "data_parallel_only",
    "hybrid_shard",
    "auto_stop",
    "gradient_accumulation",
    "reentrant",
)
_SETTING_SPLIT = re.compile(r"-(?=[a-z_]+\.)")
_PROTOCOL_VERSION = re.compile(r"-v\d+(?:\.\d+)*$")
_PART_DIGITS = 9
_IDENTIFIER_SETTINGS = {
    key: re.compile(rf"(?:^|-){key}\.([A-Za-z0-9_.]+?)(?=-[a-z_]+\.|$)")
    for key in (
        "fsdp_sharding_strategy",
        "gradient_accumulation_steps",
        "gradient_checkpointing_use_reentrant",
    )
}


@lru_cache(maxsize=256)
def version_number(version: str) -> float:
    """A number that orders tuning-stack versions, including the benchmark's mangled ones
    (`0.4.0.1.0` is older than `2.0.1`; `3` is `3.0.0`); NaN when there is none."""
    parts = re.findall(r"\d+", version)
    if not parts:
        return float("nan")
    # A part read from its first digits only: int() refuses 4,300 digits and more (a traceback of predict),
    # and no version has a part past a few digits.
    return float(sum(int(p[:_PART_DIGITS]) / 100.0**i for i, p in enumerate(parts[:4])))


def protocol_columns(experiment_ids: np.ndarray, identifiers: np.ndarray) -> dict[str, np.ndarray]:
    """The protocol columns of every row: parsed once per distinct experiment and per distinct identifier
    (for settings the experiment does not state); the full benchmark repeats both."""
    experiment_codes, experiments = distinct_values(experiment_ids)
    parsed = [dict(_experiment(e)) for e in experiments]
    columns = {key: np.array([p[key] for p in parsed])[experiment_codes] for key in _PROTOCOL_KEYS}
    identifier_codes, distinct_identifiers = distinct_values(identifiers)
    found = [_identifier_settings(i) for i in distinct_identifiers]
    for column, key in (("gradient_accumulation", "gradient_accumulation_steps"),
                        ("reentrant", "gradient_checkpointing_use_reentrant")):  # fmt: skip
        stated = columns[column].astype(float)
        named = np.array([_number(f[key]) for f in found], dtype=float)[identifier_codes]
        columns[column] = np.where(np.isnan(stated), named, stated)
    hybrid = np.array([f["fsdp_sharding_strategy"] == "HYBRID_SHARD" for f in found], dtype=bool)
    columns["hybrid_shard"] = columns["hybrid_shard"].astype(bool) | hybrid[identifier_codes]
    return columns


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
