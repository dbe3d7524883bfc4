"""Group commit of advice requests (advisor.batching): concurrent requests share one compute call."""

from __future__ import annotations

import asyncio
import threading

import pytest

from advisor.batching import Batcher


class Gate:
    """A compute function whose first call blocks until released, recording what each call received."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.first_started = threading.Event()
        self.release = threading.Event()

    def __call__(self, items: list[int]) -> list[int | BaseException]:
        self.batches.append(list(items))
        if len(self.batches) == 1:
            self.first_started.set()
            self.release.wait(timeout=30)
        return [ValueError(f"odd {i}") if i % 2 else i * 10 for i in items]


def _submit_during_first_batch(
    gate: Gate, batcher: Batcher[int, int], first: tuple[str, int], later: list[tuple[str, int]]
) -> list[object]:
    """Submits `first`; once its batch is computing, submits `later`, then lets the computation go on.
    Returns every caller's result (or exception), `first` first."""

    async def scenario() -> list[object]:
        submitted = [asyncio.ensure_future(batcher.submit(*first))]
        await asyncio.to_thread(gate.first_started.wait, 30)
        submitted += [asyncio.ensure_future(batcher.submit(*item)) for item in later]
        gate.release.set()
        return await asyncio.gather(*submitted, return_exceptions=True)

    return asyncio.run(scenario())


def test_requests_arriving_during_a_batch_go_together_into_the_next() -> None:
    gate = Gate()
    batcher: Batcher[int, int] = Batcher(gate, max_batch=3)
    results = _submit_during_first_batch(gate, batcher, ("k0", 0), [(f"k{i}", i) for i in (2, 4, 6, 8, 1)])
    assert gate.batches == [[0], [2, 4, 6], [8, 1]]  # lone request at once; then at most max_batch per call
    assert results[:5] == [0, 20, 40, 60, 80]
    assert isinstance(results[5], ValueError) and "odd 1" in str(results[5])  # its own error, nobody else's
    assert batcher.calls == 3


def test_the_same_key_in_flight_is_computed_once() -> None:
    gate = Gate()
    batcher: Batcher[int, int] = Batcher(gate, max_batch=10)
    assert _submit_during_first_batch(gate, batcher, ("same", 4), [("same", 4)] * 5) == [40] * 6
    assert gate.batches == [[4]]


def test_a_failing_compute_fails_its_whole_batch_and_the_next_batch_still_runs() -> None:
    calls: list[list[int]] = []

    def compute(items: list[int]) -> list[int]:
        calls.append(items)
        if len(calls) == 1:
            raise RuntimeError("models unusable")
        return items

    batcher: Batcher[int, int] = Batcher(compute, max_batch=10)

    async def scenario() -> tuple[list[object], int]:
        failed = await asyncio.gather(batcher.submit(1, 1), batcher.submit(2, 2), return_exceptions=True)
        return failed, await batcher.submit(3, 3)

    failed, after = asyncio.run(scenario())
    assert all(isinstance(r, RuntimeError) and "models unusable" in str(r) for r in failed)
    assert calls == [[1, 2], [3]] and after == 3


def test_max_batch_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        Batcher(lambda items: items, max_batch=0)
