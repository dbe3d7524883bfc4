"""Group commit for work whose fixed cost per call dwarfs its cost per item (the models' one call).

Requests that arrive while a batch is being computed wait for the next one and are computed together, in
one call of `compute` in the thread pool: one waiting request costs what it costs alone, fifty cost
little more than one. Identical requests in flight (the same key) share one computation. Nothing waits
on a timer: a lone request starts at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from fastapi.concurrency import run_in_threadpool

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
class _LoopState(Generic[Item]):
    pending: list[tuple[Hashable, Item, asyncio.Future]] = field(default_factory=list)
    in_flight: dict[Hashable, asyncio.Future] = field(default_factory=dict)
    draining: bool = False


class Batcher(Generic[Item, Result]):
    """`await batcher.submit(key, item)` -> `compute([...items])[i]` for that item.

    `compute` takes a list of items and returns one entry per item, in order: a result, or an exception
    that is raised to that item's callers alone. An exception raised by `compute` itself goes to every
    caller of the batch. At most `max_batch` items go into one call.
    """

    def __init__(
        self, compute: Callable[[list[Item]], Sequence[Result | BaseException]], max_batch: int
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.compute = compute
        self.max_batch = max_batch
        self.calls: int = 0  # how many times compute ran (for tests and metrics)
        # Futures belong to one event loop: an app served by one loop has one state; a test client that
        # starts a loop per request gets a fresh state each time instead of futures of a closed loop.
        self._states: dict[asyncio.AbstractEventLoop, _LoopState[Item]] = {}

    async def submit(self, key: Hashable, item: Item) -> Result:
        loop = asyncio.get_running_loop()
        state = self._states.get(loop)
        if state is None:
            self._states = {k: v for k, v in self._states.items() if not k.is_closed()}
            state = self._states[loop] = _LoopState()
        future = state.in_flight.get(key)
        if future is None:
            future = loop.create_future()
            state.in_flight[key] = future
            state.pending.append((key, item, future))
            if not state.draining:
                state.draining = True
                loop.create_task(self._drain(state))
        # Shielded: a caller that goes away must not cancel the answer others with the same key await.
        return await asyncio.shield(future)

    async def _drain(self, state: _LoopState[Item]) -> None:
        try:
            while state.pending:
                batch = state.pending[: self.max_batch]
                del state.pending[: self.max_batch]
                try:
                    self.calls += 1
                    results = await run_in_threadpool(self.compute, [item for _, item, _ in batch])
                    if len(results) != len(batch):
                        raise RuntimeError(f"compute returned {len(results)} results for {len(batch)} items")
                except Exception as exc:  # noqa: BLE001 - handed to every caller of the batch, not swallowed
                    results = [exc] * len(batch)
                for (key, _, future), result in zip(batch, results, strict=True):
                    state.in_flight.pop(key, None)
                    if future.done():
                        continue
                    if isinstance(result, BaseException):
                        future.set_exception(result)
                        future.exception()  # retrieved here: a caller that left must not log a warning
                    else:
                        future.set_result(result)
        finally:
            state.draining = False
