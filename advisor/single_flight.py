"""One run at a time of a costly job, shared by whoever asks while it runs.

A steering run evaluates every candidate action with the twin's ensemble: seconds to minutes of two cores. Two
operators pressing "run steering now", or one pressing it while the scheduled run is under way, ran it twice
at once, each at half speed, to the same answer. Whoever asks while a run is under way now waits for that
run and gets its outcome (its result, or the exception it raised) — or, with `start`, does not wait: the
run goes on in a thread of its own and the caller learns what is under way (`under_way`), to look again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    value: T
    joined: bool  # True: another caller's run, under way when this one asked


class _Run(Generic[T]):
    def __init__(self, about: dict[str, Any]) -> None:
        self.about = about
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None


class SingleFlight(Generic[T]):
    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._run: _Run[T] | None = None
        self.callers = 0  # of the run under way, its own caller included (0 when none is)

    def run(self, job: Callable[[], T], about: dict[str, Any] | None = None) -> Outcome[T]:
        """`job`'s outcome, run here unless a run is under way, whose outcome it then waits for. `about`:
        what `under_way` says of the run while it lasts (who started it, when)."""
        current, joined = self._join_or_begin(about)
        if not joined:
            self._execute(current, job)
        current.done.wait()
        if current.error is not None:
            raise current.error
        return Outcome(current.value, joined)  # type: ignore[arg-type]

    def start(self, job: Callable[[], T], about: dict[str, Any] | None = None) -> tuple[dict[str, Any], bool]:
        """`job` begun in a thread of its own, unless a run is under way; returns immediately with what
        is under way (`about` of whichever run) and whether it was already (True: `job` is not run). The
        outcome is the job's own business: nobody waits for it here."""
        current, joined = self._join_or_begin(about, waits=False)
        if not joined:
            worker = threading.Thread(target=self._execute, args=(current, job), name="single-flight")
            worker.daemon = True  # a run abandoned at exit is stopped by the job's own checks, not joined
            worker.start()
        return current.about, joined

    def under_way(self) -> dict[str, Any] | None:
        """`about` of the run under way; None when none is."""
        with self._lock:
            return None if self._run is None else self._run.about

    def wait_for_callers(self, count: int, timeout_s: float) -> bool:
        """Whether `count` callers share the run under way within `timeout_s` (for tests)."""
        with self._lock:
            return self._lock.wait_for(lambda: self.callers >= count, timeout_s)

    def wait_until_idle(self, timeout_s: float) -> bool:
        """Whether no run is under way within `timeout_s`: the run's outcome is then kept wherever its job
        keeps it, and `under_way` says None (for tests and pollers that must not read between the two)."""
        with self._lock:
            return self._lock.wait_for(lambda: self._run is None, timeout_s)

    def _join_or_begin(self, about: dict[str, Any] | None, waits: bool = True) -> tuple[_Run[T], bool]:
        """The run under way (True), or a new one (False). A caller that `waits` for the run under way is
        one of its callers; one that does not is not counted."""
        with self._lock:
            current = self._run
            if current is not None and not waits:
                return current, True
            self.callers += 1
            self._lock.notify_all()
            if current is not None:
                return current, True
            current = self._run = _Run(dict(about or {}))
            return current, False

    def _execute(self, current: _Run[T], job: Callable[[], T]) -> None:
        try:
            current.value = job()
        except BaseException as exc:
            current.error = exc
        finally:
            with self._lock:
                self._run = None
                self.callers = 0
                self._lock.notify_all()
            current.done.set()
