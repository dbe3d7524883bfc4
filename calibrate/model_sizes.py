"""What a model's name says about it: its total and active parameters (the known models' from the
benchmark's notes, an unseen one's from a size token in its name), its family and its vocabulary."""

from __future__ import annotations

import math
import re
from functools import lru_cache

import numpy as np

from twin.domain import MODEL_PARAMS_B, model_params_b

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

UNSEEN_NAME_NOTE = "unseen model name: size from name"
UNKNOWN_SIZE_NOTE = "unknown model size"
FALLBACK_PARAMS_B = 7.0  # a typical size, used only when a name says nothing about it (and flagged)


def model_sizes(names: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str]]:
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
def model_family(name: str) -> str:
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
