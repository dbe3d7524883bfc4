"""A model version as this machine runs it, loaded without scikit-learn or skops.

Once a version's trees are compiled here (`calibrate.native_trees`), a small JSON snapshot beside the
libraries records what its predictions need besides the version's own params: each ensemble's library and
input space, and the failure members' calibration (`CalibratedModels.serving_snapshot`). A later
`finetwin predict` then loads the version from the params and the snapshot: the same numbers, without the
~1.2 s of importing scikit-learn, the ~1.3 s of importing skops and the ~1 s of skops loading that a
2-second budget for 100,000 rows cannot hold.

Trust is the native trees': a snapshot is only read from the private cache that holds the libraries it
names (where a file can already run code), under the sha256 of the version's manifest, which the registry
verifies with every artifact of the version before the snapshot is looked up. Anything amiss (no snapshot,
a library gone or damaged, a format this finetwin does not write) means no snapshot: the caller loads the
version from the registry as before.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from calibrate import native_trees
from calibrate.fit import CalibratedModels
from calibrate.registry import MANIFEST, ModelRegistry, sha256_file

# Bumped when the snapshot's contents change; the library ABI is part of the name as well.
SNAPSHOT_FORMAT = 1


def snapshot_path(manifest_sha256: str) -> Path:
    name = f"serving-{manifest_sha256}-{SNAPSHOT_FORMAT}.{native_trees.ABI}.json"
    return native_trees.cache_dir() / name


def save(registry: ModelRegistry, version: str, models: CalibratedModels) -> Path | None:
    """Write the snapshot of `version` (loaded from `registry`, its trees compiled); None when there is
    nothing to write (trees not all native) or nowhere private to write it."""
    snapshot = models.serving_snapshot()
    if snapshot is None or not native_trees.enabled():
        return None
    path = snapshot_path(registry.verified_manifest_sha256(version))
    try:
        if not native_trees.private(path.parent):
            return None
        handle, temporary = tempfile.mkstemp(prefix=".serving-", dir=path.parent)  # mode 0600
        with os.fdopen(handle, "w") as out:
            json.dump(snapshot, out)
        os.replace(temporary, path)
    except OSError:
        return None
    return path


def load_in_use(registry: ModelRegistry) -> tuple[str, CalibratedModels] | None:
    """The version in use from its snapshot, or None (no version in use, or no usable snapshot). Raises
    `RegistryError` as `ModelRegistry.load_in_use` does for a version that fails verification."""
    if not native_trees.enabled():
        return None
    pointer = registry.pointer()
    if pointer is None:
        return None
    version = pointer["version"]
    try:
        digest = sha256_file(registry.path(version) / MANIFEST)
    except OSError:
        return None  # the registry's own load says what is wrong
    path = snapshot_path(digest)
    if not path.is_file():  # checked before verifying: a version without one is verified once, by its load
        return None
    if registry.verified_manifest_sha256(version, pointer.get("manifest_sha256")) != digest:
        return None  # the manifest changed under us: let the registry's load decide
    try:
        if not native_trees.private(path):
            return None
        snapshot = json.loads(path.read_text())
        return version, CalibratedModels.from_serving(snapshot, registry.params(version))
    except (OSError, KeyError, TypeError, ValueError, AttributeError):
        return None
