"""Per-job random streams for common random numbers.

A job's random draws (does it fail at runtime, where in the throughput band it lands, when it fails) are a
hash of the run's key and the job's id, not the n-th draw of a shared stream. So a what-if scenario that
adds nodes, changes the policy or rejects some jobs leaves every other job's draws untouched, and the
baseline/scenario difference measures the change rather than reshuffled luck.

The run key itself comes from the numpy Generator the caller passes in (never a global one).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

_GOLDEN_INT = 0x9E3779B97F4A7C15
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)


def run_key(rng: np.random.Generator) -> int:
    """A 63-bit key for one simulation run, drawn from the run's generator."""
    return int(rng.integers(0, 2**63 - 1, dtype=np.int64))


def job_keys(job_ids: Sequence[str]) -> np.ndarray:
    """A stable 64-bit key per job id (the same in every process and every Python run)."""
    return np.fromiter(
        (int.from_bytes(hashlib.blake2b(j.encode(), digest_size=8).digest(), "little") for j in job_ids),
        dtype=np.uint64,
        count=len(job_ids),
    )


def _splitmix64(x: np.ndarray) -> np.ndarray:
    z = x * _MIX1  # uint64 arithmetic wraps around, which is what the mixer wants
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    return z ^ (z >> _S31)


def job_uniforms(key: int, keys: np.ndarray, streams: int) -> np.ndarray:
    """Uniforms in (0, 1), shape (len(keys), streams): column s is job stream s of run `key`."""
    base = _splitmix64(keys.astype(np.uint64) ^ _splitmix64(np.asarray([key], dtype=np.uint64)))
    out = np.empty((len(keys), streams), dtype=np.float64)
    for s in range(streams):
        bits = _splitmix64(base + np.uint64((_GOLDEN_INT * (s + 1)) % 2**64))
        out[:, s] = ((bits >> _S11).astype(np.float64) + 0.5) * 2.0**-53
    return out
