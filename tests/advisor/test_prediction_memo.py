"""Predictions remembered per configuration (advisor.prediction_memo): only new rows reach the models."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from advisor import prediction_memo
from advisor.prediction_memo import Predicted, PredictionMemo
from twin.domain import JobConfig


def config(gpus: int, batch: int) -> JobConfig:
    return JobConfig("llama3-8b", "lora", "NVIDIA-A100-SXM4-80GB", gpus, 1, batch, 2048)


class Models:
    """Deterministic predictions from the configuration alone; records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[list[JobConfig]] = []

    def __call__(self, configs: Sequence[JobConfig]) -> Predicted:
        self.asked.append(list(configs))
        gpus = np.array([c.number_gpus for c in configs], dtype=float)
        batch = np.array([c.batch_size for c in configs], dtype=float)
        return Predicted(
            p_valid=1.0 / gpus,
            tps=np.column_stack([batch * 90, batch * 100, batch * 110]),
            watts=gpus * 10,
            notes=[f"note {c.number_gpus}" if c.number_gpus == 8 else None for c in configs],
        )


def test_only_rows_not_seen_before_are_predicted_and_answers_match() -> None:
    models, memo = Models(), PredictionMemo("v1", max_rows=100)
    first = [config(1, 8), config(2, 8), config(1, 8), config(8, 16)]
    got = memo.predict(first, models)
    assert models.asked == [[config(1, 8), config(2, 8), config(8, 16)]]  # duplicates asked once
    second = [config(8, 16), config(4, 8), config(2, 8)]
    again = memo.predict(second, models)
    assert models.asked[1:] == [[config(4, 8)]] and memo.predicted_rows == 4
    for rows, predicted in ((first, got), (second, again)):
        direct = models(rows)
        np.testing.assert_allclose(predicted.p_valid, direct.p_valid)
        np.testing.assert_allclose(predicted.tps, direct.tps)
        np.testing.assert_allclose(predicted.watts, direct.watts)
        assert predicted.notes == direct.notes
    memo.predict(first, models)
    assert len(models.asked) == 4  # the memo's two and the two direct calls above: nothing new


def test_bounded_least_recently_used_first_out() -> None:
    models, memo = Models(), PredictionMemo("v1", max_rows=3)
    memo.predict([config(1, 8), config(2, 8), config(4, 8)], models)
    memo.predict([config(1, 8)], models)  # used again: the oldest is now 2 GPUs
    memo.predict([config(8, 8)], models)
    assert len(memo) == 3
    memo.predict([config(1, 8), config(4, 8), config(8, 8)], models)
    assert len(models.asked) == 2  # all three still remembered
    memo.predict([config(2, 8)], models)
    assert models.asked[-1] == [config(2, 8)]  # it was the one evicted


def test_a_failing_model_call_remembers_nothing() -> None:
    memo = PredictionMemo("v1", max_rows=10)

    def broken(configs: Sequence[JobConfig]) -> Predicted:
        raise ValueError("cannot predict")

    with pytest.raises(ValueError, match="cannot predict"):
        memo.predict([config(1, 8)], broken)
    assert len(memo) == 0 and memo.predicted_rows == 0


def test_prefetched_rows_ride_along_with_a_call_and_never_cause_one() -> None:
    models, memo = Models(), PredictionMemo("v1", max_rows=100)
    memo.predict([config(1, 8)], models, prefetch=[config(2, 16)])
    memo.predict([config(1, 8)], models, prefetch=[config(4, 16)])  # all known: no call for the prefetch
    assert models.asked == [[config(1, 8), config(2, 16)]] and config(4, 16) not in memo._rows
    prefetched = memo.predict([config(2, 16)], models)
    assert len(models.asked) == 1 and prefetched.tps[0, 1] == 1600  # answered from the ride-along


def test_no_prefetch_into_a_large_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prediction_memo, "PREFETCH_MAX_ROWS", 3)
    models, memo = Models(), PredictionMemo("v1", max_rows=100)
    memo.predict([config(1, 8), config(2, 8)], models, prefetch=[config(4, 8), config(8, 8)])  # 4 > 3 rows
    assert models.asked == [[config(1, 8), config(2, 8)]]
    memo.predict([config(1, 16)], models, prefetch=[config(4, 8), config(8, 8)])  # 3 rows: ride along
    assert models.asked[1] == [config(1, 16), config(4, 8), config(8, 8)]
