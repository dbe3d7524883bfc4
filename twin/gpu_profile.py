"""GPUs promised on one node over time, for conservative backfill (`twin.policies`): the running jobs until
their estimated ends and the waiting jobs' reservations, as a step function kept sorted and merged, so that
moving a reservation costs a few list operations and the earliest start that fits is one walk forward.
"""

from __future__ import annotations

import bisect
import math


class UsageProfile:
    """`use[k]` GPUs are promised on [times[k], times[k+1]); none before times[0] and from times[-1] on."""

    __slots__ = ("times", "use", "horizon")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.use: list[int] = []
        self.horizon = -math.inf  # the last `prune`'s now: what lies before it is forgotten

    def add(self, start: float, end: float, gpus: int) -> None:
        """Promises `gpus` on [start, end); a negative count takes a promise back."""
        start = max(start, self.horizon)
        if not end > start or gpus == 0:
            return
        first = self._breakpoint(start)
        last = self._breakpoint(end)
        use = self.use
        for k in range(first, last):
            use[k] += gpus
        # A breakpoint that no longer changes the count goes: the lists stay as long as the promises.
        self._merge(last)
        self._merge(first)

    def earliest(self, now: float, limit: int, duration: float) -> float:
        """The earliest t >= now at which at most `limit` GPUs are promised all through [t, t + duration);
        inf if there is none (a promise without end over the limit)."""
        times, use = self.times, self.use
        k = bisect.bisect_right(times, now) - 1
        start = now if k < 0 or use[k] <= limit else math.inf  # where the run of room in progress began
        for j in range(k + 1, len(times)):
            boundary = times[j]
            if start + duration <= boundary:  # as the promise will end: start + duration
                return start
            if use[j] > limit:
                start = math.inf
            elif start == math.inf:
                start = boundary
        return start

    def free_stretches(self, now: float, limit: int, duration: float) -> list[tuple[float, float]]:
        """The stretches from now on in which at most `limit` GPUs are promised, long enough for `duration`:
        [begin, end) in time order (`end` inf for the one that never ends). A job of that length may start
        at t when begin <= t and t + duration <= end (the arithmetic `earliest` and the promise use)."""
        times, use = self.times, self.use
        k = bisect.bisect_right(times, now) - 1
        stretches: list[tuple[float, float]] = []
        begin = now if k < 0 or use[k] <= limit else math.inf
        for j in range(k + 1, len(times)):
            if use[j] <= limit:
                if begin == math.inf:
                    begin = times[j]
                continue
            if begin + duration <= times[j]:
                stretches.append((begin, times[j]))
            begin = math.inf
        if begin < math.inf:
            stretches.append((begin, math.inf))
        return stretches

    def prune(self, now: float) -> None:
        """Forgets the past: breakpoints before the one in force at `now`."""
        self.horizon = max(self.horizon, now)
        k = bisect.bisect_right(self.times, now) - 1
        if k > 0:
            del self.times[:k]
            del self.use[:k]

    def _breakpoint(self, t: float) -> int:
        """The index of a breakpoint at t, inserted (with the count in force there) when there is none."""
        times = self.times
        k = bisect.bisect_left(times, t)
        if k == len(times) or times[k] != t:
            times.insert(k, t)
            self.use.insert(k, self.use[k - 1] if k > 0 else 0)
        return k

    def _merge(self, k: int) -> None:
        if k >= len(self.times):
            return
        before = self.use[k - 1] if k > 0 else 0
        if self.use[k] == before:
            del self.times[k]
            del self.use[k]
