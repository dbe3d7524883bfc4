"""A model version as this machine runs it, loaded without scikit-learn or skops.

A snapshot records what a version's predictions need besides its own params
(`CalibratedModels.serving_snapshot`): a small JSON file (each ensemble's input space, its native library
once one is compiled here, the failure members' calibration) and the trees as arrays (`.npz`, read with
`allow_pickle=False`) for the tree walker (`calibrate.tree_walker`). `finetwin calibrate` leaves one for
the version it writes, a process that compiles a version's trees (`calibrate.native_trees`) leaves one
naming the libraries, and `finetwin predict` one for a version it had to load from the registry. A later
`finetwin predict`, or the API's reader of the version in use, then loads the version from the params and
the snapshot: the same numbers, without the
~1.2 s of importing scikit-learn, the ~1.3 s of importing skops and the ~1 s of skops loading that a
2-second budget for 100,000 rows cannot hold.

Trust is the native trees': a snapshot is only read from the private cache that holds the libraries it
names (where a file can already run code), under the sha256 of the version's manifest, which the registry
verifies with every artifact of the version before the snapshot is looked up. Anything amiss (no snapshot,
a library gone or damaged, arrays a walk could leave, a format this finetwin does not write) means no
snapshot: the caller loads the version from the registry as before.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np

from calibrate import native_trees
from calibrate.fit import CalibratedModels
from calibrate.registry import MANIFEST, ModelRegistry, RegistryError, sha256_file

# Bumped when the snapshot's contents change; the library ABI is part of the name as well.
SNAPSHOT_FORMAT = 2


def snapshot_path(manifest_sha256: str) -> Path:
    """The snapshot's JSON file; its arrays are `arrays_path` of it."""
    name = f"serving-{manifest_sha256}-{SNAPSHOT_FORMAT}.{native_trees.ABI}.json"
    return native_trees.cache_dir() / name


def _snapshot_of(registry: ModelRegistry, version: str) -> Path:
    """The snapshot the version's manifest, as it is on disk now (unverified), names."""
    return snapshot_path(sha256_file(registry.path(version) / MANIFEST))


def arrays_path(path: Path) -> Path:
    return path.with_suffix(".npz")


def save(registry: ModelRegistry, version: str, models: CalibratedModels) -> Path | None:
    """Write the snapshot of `version` (the models of it: loaded from `registry`, or just fitted and
    written there); None where native trees are off or there is nowhere private to write it."""
    if not native_trees.enabled():
        return None
    described, arrays = models.serving_snapshot()
    path = snapshot_path(registry.verified_manifest_sha256(version))
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not native_trees.private(path.parent):
            return None
        # The arrays first: a JSON file is only there once its arrays are.
        _write_atomically(path.parent, arrays_path(path), lambda out: np.savez(out, **arrays))
        _write_atomically(path.parent, path, lambda out: out.write(json.dumps(described).encode()))
    except OSError:
        return None
    return path


def _write_atomically(directory: Path, target: Path, write: Callable[[BinaryIO], object]) -> None:
    handle, temporary = tempfile.mkstemp(prefix=".serving-", dir=directory)  # mode 0600
    try:
        with os.fdopen(handle, "wb") as out:
            write(out)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def load_in_use(registry: ModelRegistry) -> tuple[str, CalibratedModels] | None:
    """The version in use from its snapshot, or None (no version in use, or no usable snapshot). Raises
    `RegistryError` as `ModelRegistry.load_in_use` does for a version that fails verification."""
    pointer = registry.pointer()
    if pointer is None:
        return None
    version = pointer["version"]
    models = load(registry, version, pointer.get("manifest_sha256"))
    return None if models is None else (version, models)


def load(
    registry: ModelRegistry, version: str, expected_manifest_sha256: str | None = None
) -> CalibratedModels | None:
    """`version` from its snapshot, or None (no usable snapshot). Raises `RegistryError` as
    `ModelRegistry.load` does for a version that fails verification."""
    if not native_trees.enabled():
        return None
    try:
        path = _snapshot_of(registry, version)
    except (OSError, RegistryError):
        return None  # the registry's own load says what is wrong
    if not path.is_file():  # checked before verifying: a version without one is verified once, by its load
        return None
    if snapshot_path(registry.verified_manifest_sha256(version, expected_manifest_sha256)) != path:
        return None  # the manifest changed under us: let the registry's load decide
    try:
        arrays_file = arrays_path(path)
        if not (native_trees.private(path) and native_trees.private(arrays_file)):
            return None
        snapshot = json.loads(path.read_text())
        with np.load(arrays_file, allow_pickle=False) as arrays:
            return CalibratedModels.from_serving(snapshot, arrays, registry.params(version))
    except (OSError, KeyError, TypeError, ValueError, AttributeError, EOFError, zipfile.BadZipFile):
        return None


def engine_of_in_use(registry: ModelRegistry) -> str | None:
    """How a command would run the trees of the version in use on this machine, without loading it (for
    `finetwin info`); None when no version is in use."""
    pointer = registry.pointer()
    if pointer is None:
        return None
    if not native_trees.enabled():
        return "treelite (FINETWIN_NATIVE_TREES is off)"
    if native_trees.compiler() is None:
        return "treelite (no C compiler: install gcc, or name one in CC)"
    try:
        described = json.loads(_snapshot_of(registry, pointer["version"]).read_text())
        libraries = [tree["library"] for tree in described["trees"].values()]
    except (OSError, RegistryError, ValueError, KeyError, TypeError, AttributeError):
        return "walker, after loading through skops: no serving snapshot yet (the next predict leaves one)"
    if all(isinstance(name, str) and native_trees.cached_path(name) is not None for name in libraries):
        return "native: compiled for this machine"
    return "walker: `finetwin api` or `finetwin up` compiles the version's own code here, in the background"
