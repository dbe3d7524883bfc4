"""One run at a time of a costly job, shared by whoever asks while it runs.

A steering run evaluates every candidate action with the twin's ensemble: about 40 s of both cores. Two
operators pressing "run steering now", or one pressing it while the scheduled run is under way, ran it twice
at once, each at half speed, to the same answer. Whoever asks while a run is under way now waits for that
run and gets its outcome (its result, or the exception it raised).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    value: T
    joined: bool  # True: another caller's run, under way when this one asked


class _Run(Generic[T]):
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None


class SingleFlight(Generic[T]):
    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._run: _Run[T] | None = None
        self.callers = 0  # of the run under way, its own caller included (0 when none is)

    def run(self, job: Callable[[], T]) -> Outcome[T]:
        with self._lock:
            current = self._run
            self.callers += 1
            self._lock.notify_all()
            if current is None:
                current = self._run = _Run()
                joined = False
            else:
                joined = True
        if not joined:
            try:
                current.value = job()
            except BaseException as exc:
                current.error = exc
            finally:
                with self._lock:
                    self._run = None
                    self.callers = 0
                current.done.set()
        current.done.wait()
        if current.error is not None:
            raise current.error
        return Outcome(current.value, joined)  # type: ignore[arg-type]

    def wait_for_callers(self, count: int, timeout_s: float) -> bool:
        """Whether `count` callers share the run under way within `timeout_s` (for tests)."""
        with self._lock:
            return self._lock.wait_for(lambda: self.callers >= count, timeout_s)
