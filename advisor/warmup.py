"""Warm the prediction memo with the families the models were fitted on.

A family is a (model, method, GPU type, sequence length) of the benchmark the version in use learned from:
what a provider actually runs. Once its rows are in the memo (`advisor.prediction_memo`), a first question
about any configuration of the family (any batch, GPUs, nodes or amount of work) is answered without a
model call: a few milliseconds instead of ~50. It runs in the background when a version comes into use,
a few families per model call, and stops when asked to.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from advisor.advice_plan import candidate_rows
from advisor.advice_predict import predict
from advisor.prediction_memo import PredictionMemo
from calibrate.loader import load_benchmark
from twin.domain import JobConfig

log = logging.getLogger(__name__)

FAMILY_COLUMNS = ["model_name", "method", "gpu_model", "tokens_per_sample"]
# Families per model call: ~65-130 rows each plus as many prefetched, so a call stays within the memo's
# prefetch limit and holds the memo (and a waiting request) for tens of milliseconds, not seconds.
FAMILIES_PER_CALL = 4
# A family's representative: any batch and GPU count would do (its answer searches every batch x GPUs x
# nodes of the family); the other fields keep JobConfig's defaults, as a user's request does (no time cap).
_REPRESENTATIVE = {"number_gpus": 1, "number_nodes": 1, "batch_size": 8}


def benchmark_families(paths: Iterable[Path]) -> list[JobConfig]:
    """One representative configuration per family of the benchmark files, in first-seen order."""
    seen: dict[tuple[str, str, str, int], None] = {}
    for path in paths:
        table = load_benchmark(path)
        for row in table[FAMILY_COLUMNS].drop_duplicates().itertuples(index=False):
            key = (str(row.model_name), str(row.method), str(row.gpu_model), int(row.tokens_per_sample))
            seen[key] = None
    return [
        JobConfig(model_name=m, method=method, gpu_model=gpu, tokens_per_sample=tokens, **_REPRESENTATIVE)
        for m, method, gpu, tokens in seen
    ]


def warm(
    memo: PredictionMemo, models: Any, families: Sequence[JobConfig], stop: threading.Event | None = None
) -> int:
    """Predicts every family's rows into `memo`; returns the rows the models were asked for."""
    before = memo.predicted_rows
    for start in range(0, len(families), FAMILIES_PER_CALL):
        if stop is not None and stop.is_set():
            break
        rows: list[JobConfig] = []
        prefetch: list[JobConfig] = []
        for family in families[start : start + FAMILIES_PER_CALL]:
            family_rows, family_prefetch = candidate_rows(family)
            rows += family_rows
            prefetch += family_prefetch
        memo.predict(rows, lambda missing: predict(models, missing), prefetch)
    return memo.predicted_rows - before


def warm_in_background(
    memo: PredictionMemo,
    models: Any,
    benchmarks: Callable[[], list[Path]],
    stop: threading.Event,
) -> threading.Thread:
    """`warm` on a daemon thread, then `memo.warmed` is set; a failure is logged, never raised (the memo
    only stays colder)."""

    def run() -> None:
        try:
            families = benchmark_families(benchmarks())
            rows = warm(memo, models, families, stop)
            log.info("advice memo of %s warmed: %d families, %d rows", memo.version, len(families), rows)
        except Exception:  # noqa: BLE001 - a cold memo is slower, not wrong
            log.exception("warming the advice memo of %s failed", memo.version)
        finally:
            memo.warmed.set()

    thread = threading.Thread(target=run, name=f"warm-advice-{memo.version}", daemon=True)
    thread.start()
    return thread
