"""Advice answers remembered per model version: the same configuration asked again under the same models
gets the same bytes back without evaluating the models.

An answer is filed twice: under the validated request (canonical JSON: equal requests however they were
written) and under the request body's exact bytes, which `advisor.fastpath` looks up before FastAPI
parses anything. The cache forgets everything when the version in use changes (the version is part of
the key) and holds at most `size` entries, least recently used first out.
"""

from __future__ import annotations

import threading
from typing import Any

from cachetools import LRUCache

from calibrate.registry import RegistryError

# Bodies up to this size are also filed by their bytes (an advice request is a few hundred bytes).
MAX_RAW_KEY_BYTES = 16 * 1024
# (model version, canonical request JSON) or (model version, raw request body): str and bytes never collide.
CacheKey = tuple[str, str | bytes]


class AnswerCache:
    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: LRUCache[CacheKey, bytes] = LRUCache(maxsize=max(size, 1))
        self._lock = threading.Lock()  # LRUCache is not thread-safe, and the API answers from a thread pool

    def get(self, key: CacheKey) -> bytes | None:
        with self._lock:
            return self._entries.get(key)

    def put(self, key: CacheKey, value: bytes) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._entries[key] = value


def version_in_use(models: Any) -> str | None:
    """The model version in use without loading it (None: unknown, so nothing is served from the cache)."""
    probe = getattr(models, "version_in_use", None)
    if probe is None:
        return None
    try:
        return probe()
    except (RegistryError, OSError, ValueError):
        return None
