"""Predictions remembered per configuration, for one model version.

Answers for different requests weigh many of the same configurations (every request for a model, method,
GPU and sequence length searches the same batch x GPUs x nodes grid), and a prediction depends on the
configuration alone, not on the work or the other rows. A new answer whose rows were all predicted before
needs no model call at all; otherwise only its new rows are predicted. Bounded (least recently used out);
a new model version gets a new memo.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from cachetools import LRUCache

from twin.domain import JobConfig


@dataclass(frozen=True)
class Predicted:
    """Predictions aligned with a list of configurations."""

    p_valid: np.ndarray  # (n,)
    tps: np.ndarray  # (n, 3): p10, p50, p90 tokens/s
    watts: np.ndarray  # (n,) per GPU
    notes: list[str | None]

    def rows(self, start: int, stop: int) -> Predicted:
        """The predictions of rows start..stop-1 (one answer's share of a batch)."""
        return Predicted(
            self.p_valid[start:stop], self.tps[start:stop], self.watts[start:stop], self.notes[start:stop]
        )


# Prefetch only into calls up to this many rows: one answer's ~65-130 rows plus as many prefetched cost
# ~10 % more than the answer alone, while a batch of 50 new answers under load would pay ~40 % more.
PREFETCH_MAX_ROWS = 1000
# One row: p_valid, tokens/s p10/p50/p90, watts per GPU, note.
_Row = tuple[float, float, float, float, float, str | None]


class PredictionMemo:
    def __init__(self, version: str | None, max_rows: int) -> None:
        self.version = version
        self.max_rows = max_rows
        self.predicted_rows = 0  # rows the models were asked for (for tests and the bench)
        self.warmed = threading.Event()  # set when a warm-up (advisor.warmup) of this memo has finished
        self._rows: LRUCache[JobConfig, _Row] = LRUCache(maxsize=max(max_rows, 1))
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._rows)

    def predict(
        self,
        configs: Sequence[JobConfig],
        predict: Callable[[Sequence[JobConfig]], Predicted],
        prefetch: Sequence[JobConfig] = (),
    ) -> Predicted:
        """The predictions for `configs`, calling `predict` once for those not remembered (if any). When
        that call happens and is small, the `prefetch` configurations not remembered go into it too (a
        later answer will want them, and a row costs little next to the call's fixed cost); alone they
        cause no call.

        One caller at a time: the model call is the expensive part and the machine's cores are few, so
        nothing is lost, and a row is never evicted between being found and being read."""
        with self._lock:
            # Reading a remembered row marks it recently used; the rows are read from `found` and `fresh`
            # afterwards, because an answer larger than the memo evicts its own first rows.
            found = {c: self._rows[c] for c in configs if c in self._rows}
            wanted = dict.fromkeys(c for c in configs if c not in found)
            if wanted and len(wanted) + len(prefetch) <= PREFETCH_MAX_ROWS:
                wanted |= dict.fromkeys(c for c in prefetch if c not in self._rows)
            fresh: dict[JobConfig, _Row] = {}
            if wanted:
                missing = list(wanted)
                new = predict(missing)
                self.predicted_rows += len(missing)
                for i, config in enumerate(missing):
                    low, mid, high = (float(v) for v in new.tps[i])
                    fresh[config] = (float(new.p_valid[i]), low, mid, high, float(new.watts[i]), new.notes[i])
                if self.max_rows > 0:
                    self._rows.update(fresh)
            rows = [found[c] if c in found else fresh[c] for c in configs]
        table = np.array([row[:5] for row in rows], dtype=float).reshape(len(rows), 5)
        return Predicted(
            p_valid=table[:, 0], tps=table[:, 1:4], watts=table[:, 4], notes=[row[5] for row in rows]
        )
