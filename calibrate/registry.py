"""The versioned model registry: one directory per fit, an "in use" pointer, and a history for rollback.

    DIR/versions/v0001/estimators/<name>.skops   fitted estimators (skops: no code runs on load)
                      /params.json                what `CalibratedModels.from_parts` needs besides them
                      /metadata.json              data fingerprint, rows per source, features, libraries,
                                                  held-out metrics, the comparison with the version in use
                      /training_rows.txt          a fingerprint per training row (to rebuild them fairly)
                      /comparison/estimators/, /comparison/params.json
                                                  the version's fit on its rows of the held-out comparison's
                                                  training split, scored again when a later version is
                                                  compared with it (`calibrate.promotion`)
                      /MANIFEST.json              the sha256 of every file above
    DIR/IN_USE.json     the version in use, its manifest's sha256 and the stack of earlier ones (rollback)
    DIR/history.jsonl   every promotion and rollback, appended

Loading verifies the manifest against the pointer, every artifact against the manifest, and every type in
the skops files against `TRUSTED_TYPES`; anything else is refused with `RegistryError`. The manifest guards
against corrupted or tampered artifacts, not against someone able to rewrite the pointer, the manifest and
the files together (that needs signing keys this project does not manage).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twin.jsonsafe import json_safe

if TYPE_CHECKING:
    from calibrate.fit import CalibratedModels

log = logging.getLogger(__name__)

# v0001 on: 18 digits at most, a number any index holds and a name any file system takes.
VERSION_PATTERN = re.compile(r"^v(\d{4,18})$")
VERSIONS = "versions"
STAGING_PREFIX = ".tmp-"  # a version being written (never listed: versions are named v0001, ...)
POINTER = "IN_USE.json"
HISTORY = "history.jsonl"
LOCK = ".lock"
MANIFEST = "MANIFEST.json"
PARAMS = "params.json"
METADATA = "metadata.json"
TRAINING_ROWS = "training_rows.txt"
ESTIMATORS = "estimators"
COMPARISON = "comparison"
ESTIMATOR_SUFFIX = ".skops"
_ESTIMATOR_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
MAX_ROLLBACK_DEPTH = 20  # versions in use before the current one that rollback can return to
ANY = object()  # `promote` without a condition on the version it replaces
# What to do about an in-use pointer that cannot be read (the API, `models` and `calibrate` all stop at it).
MEND_POINTER = "restore it, or put a version in use anew: finetwin models promote VERSION --force"

# The only types (beyond skops' defaults: builtins, numpy, scikit-learn estimators) a saved estimator may
# contain: the fitted trees of HistGradientBoosting and the input check of its categorical preprocessing
# (a partial of scikit-learn's `check_array`; skops checks the wrapped function against this list too).
# A file that asks for anything else was not written by finetwin and is refused, never loaded.
TRUSTED_TYPES: frozenset[str] = frozenset(
    {
        "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",
        "functools.partial",
        "sklearn.utils.validation.check_array",
    }
)


class RegistryError(Exception):
    """A registry operation that cannot be done; the message says why and what to do."""


@dataclass(frozen=True)
class VersionInfo:
    version: str
    path: Path
    metadata: dict[str, Any]
    in_use: bool


def utcnow_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _entry_time(entry: dict[str, Any]) -> datetime:
    """When a history entry happened, in UTC (an entry written without a zone was UTC)."""
    when = datetime.fromisoformat(str(entry["at"]).replace("Z", "+00:00"))
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _last_byte(path: Path) -> bytes:
    with path.open("rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class ModelRegistry:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():  # read as empty, then failed at the first write
            raise RegistryError(
                f"the model registry {self.root} is a file, not a directory: point --models or "
                "FINETWIN_MODELS_DIR at a directory"
            )

    # --- reading

    def versions(self) -> list[str]:
        folder = self.root / VERSIONS
        if not folder.is_dir():
            return []
        found = [p.name for p in folder.iterdir() if p.is_dir() and VERSION_PATTERN.match(p.name)]
        return sorted(found, key=lambda v: int(VERSION_PATTERN.match(v).group(1)))  # type: ignore[union-attr]

    def path(self, version: str) -> Path:
        if not VERSION_PATTERN.match(version):
            shown = repr(version)
            if len(version) > 40:
                shown = f"{version[:21]!r}... ({len(version):,} characters)"
            raise RegistryError(f"{shown} is not a version name (expected v0001, v0002, ...)")
        path = self.root / VERSIONS / version
        if not path.is_dir():
            known = ", ".join(self.versions()) or "none"
            raise RegistryError(f"no version {version} in {self.root} (versions: {known})")
        return path

    def metadata(self, version: str) -> dict[str, Any]:
        return _read_json(self.path(version) / METADATA)

    def pointer(self) -> dict[str, Any] | None:
        path = self.root / POINTER
        if not path.exists():
            return None
        try:
            pointer = _read_json(path)
        except RegistryError as exc:
            raise RegistryError(f"{exc}; {MEND_POINTER}") from None
        if not isinstance(pointer.get("version"), str) or not isinstance(pointer.get("stack"), list):
            raise RegistryError(f"{path} is not a valid in-use pointer; {MEND_POINTER}")
        return pointer

    def in_use(self) -> str | None:
        pointer = self.pointer()
        return pointer["version"] if pointer else None

    def list_versions(self) -> list[VersionInfo]:
        current = self.in_use()
        return [VersionInfo(v, self.path(v), self.metadata(v), v == current) for v in self.versions()]

    def history(self) -> list[dict[str, Any]]:
        """Every promotion and rollback, in order. A line that cannot be read (one a crash tore as it was
        appended) is left out with a warning that names it, and the rest still answer: it made every reader
        fail (the version in use at a time, for `finetwin backtest --from-store`; `GET /v1/models`)."""
        path = self.root / HISTORY
        if not path.exists():
            return []
        entries, unreadable = [], []
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                _entry_time(entry)
            except (ValueError, KeyError, TypeError):
                unreadable.append(str(number))
                continue
            entries.append(entry)
        if unreadable:
            log.warning("%s: line %s cannot be read; left out of the history", path, ", ".join(unreadable))
        return entries

    def version_in_use_at(self, at: datetime) -> str | None:
        """The version that was in use at `at`, among those that could have been: put in use (promoted or
        rolled back to) at or before `at`, still stored, and fitted on nothing dated after `at` (a version
        whose observed runs reach past `at` knows what came after; its metadata's `observed_through`).
        None when no version qualifies."""
        at = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
        chosen = None
        stored = set(self.versions())
        for entry in self.history():
            if _entry_time(entry) > at:
                break
            version = entry.get("version")
            if entry.get("action") in ("promote", "rollback") and version in stored:
                through = self.metadata(version).get("data", {}).get("observed_through")
                if through is None or datetime.fromisoformat(through) <= at:
                    chosen = version
        return chosen

    def first_put_in_use(self) -> datetime | None:
        """When a version was first put in use (promoted): before then no version was in use."""
        for entry in self.history():
            if entry.get("action") in ("promote", "rollback"):
                return _entry_time(entry)
        return None

    def training_rows(self, version: str) -> frozenset[str]:
        path = self.path(version) / TRAINING_ROWS
        self._verify_file(version, path)
        return frozenset(line for line in path.read_text().splitlines() if line)

    # --- verifying and loading

    def verify(self, version: str, expected_manifest_sha256: str | None = None) -> dict[str, str]:
        """The manifest's file hashes, after checking every artifact against them; raises if anything is
        missing, extra or changed."""
        path = self.path(version)
        manifest_path = path / MANIFEST
        if not manifest_path.exists():
            raise RegistryError(f"version {version}: {MANIFEST} is missing; refusing to load it")
        if expected_manifest_sha256 is not None and sha256_file(manifest_path) != expected_manifest_sha256:
            raise RegistryError(
                f"version {version}: {MANIFEST} does not match the hash recorded when it was put in use "
                f"(tampered or corrupted); refusing to load it"
            )
        files = _read_json(manifest_path).get("files")
        if not isinstance(files, dict) or not files:
            raise RegistryError(f"version {version}: {MANIFEST} lists no files; refusing to load it")
        on_disk = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()} - {MANIFEST}
        for extra in sorted(on_disk - set(files)):
            raise RegistryError(
                f"version {version}: {extra} is not in its manifest (added after the fit); "
                "refusing to load it"
            )
        inside = path.resolve()
        for name, digest in files.items():
            artifact = path / name
            # A manifest entry such as `estimators/../../x.skops` (or one through a symbolic link) would
            # have a file outside the version loaded as if it were the version's own.
            if not isinstance(name, str) or not artifact.resolve().is_relative_to(inside):
                raise RegistryError(
                    f"version {version}: manifest entry {name!r} is outside the version's directory; "
                    "refusing to load it"
                )
            if not artifact.is_file():
                raise RegistryError(f"version {version}: artifact {name} is missing; refusing to load it")
            if sha256_file(artifact) != digest:
                raise RegistryError(
                    f"version {version}: artifact {name} does not match its sha256 in the manifest "
                    f"(tampered or corrupted); refusing to load it"
                )
        return files

    def verified_manifest_sha256(self, version: str, expected_manifest_sha256: str | None = None) -> str:
        """The sha256 of the version's manifest, after `verify`: it pins every artifact of the version."""
        self.verify(version, expected_manifest_sha256)
        return sha256_file(self.path(version) / MANIFEST)

    def params(self, version: str) -> dict[str, Any]:
        """The version's JSON parameters (`CalibratedModels.from_parts`), checked against its manifest."""
        path = self.path(version) / PARAMS
        self._verify_file(version, path)
        return _read_json(path)

    def _verify_file(self, version: str, path: Path) -> None:
        files = _read_json(self.path(version) / MANIFEST).get("files", {})
        name = path.relative_to(self.path(version)).as_posix()
        if name not in files or sha256_file(path) != files[name]:
            raise RegistryError(f"version {version}: {name} does not match its manifest; refusing to use it")

    def load(self, version: str, expected_manifest_sha256: str | None = None) -> CalibratedModels:
        files = self.verify(version, expected_manifest_sha256)
        return self._load_parts(version, files, "")

    def has_comparison_fit(self, version: str) -> bool:
        """Whether the version kept its comparison fit (versions calibrated before it was kept did not)."""
        return (self.path(version) / COMPARISON / PARAMS).is_file()

    def load_comparison_fit(
        self, version: str, expected_manifest_sha256: str | None = None
    ) -> CalibratedModels:
        """The version's comparison fit (`stage_comparison_fit`), verified and loaded as `load` does."""
        files = self.verify(version, expected_manifest_sha256)
        if f"{COMPARISON}/{PARAMS}" not in files:
            raise RegistryError(f"version {version} kept no comparison fit")
        return self._load_parts(version, files, f"{COMPARISON}/")

    def _load_parts(self, version: str, files: dict[str, str], prefix: str) -> CalibratedModels:
        """The models of the verified files under `prefix` ("" for the version's own)."""
        import skops.io as sio
        from skops.io.exceptions import UntrustedTypesFoundException

        from calibrate.fit import CalibratedModels

        path = self.path(version)
        estimators: dict[str, Any] = {}
        for name in sorted(files):
            if not (name.startswith(f"{prefix}{ESTIMATORS}/") and name.endswith(ESTIMATOR_SUFFIX)):
                continue
            try:
                # skops audits every type in the file against the list before it constructs anything.
                with _SKOPS_LOAD_LOCK:
                    estimator = sio.load(path / name, trusted=sorted(TRUSTED_TYPES))
            except UntrustedTypesFoundException as exc:
                raise RegistryError(
                    f"version {version}: {name} contains types finetwin does not trust "
                    f"({_untrusted_names(exc)}); refusing to load it"
                ) from None
            estimators[Path(name).name[: -len(ESTIMATOR_SUFFIX)]] = estimator
        params = _read_json(path / f"{prefix}{PARAMS}")
        try:
            return CalibratedModels.from_parts(estimators, params)
        except (KeyError, TypeError, ValueError) as exc:
            raise RegistryError(f"version {version}: its parts do not make a model ({exc})") from exc

    def load_in_use(self) -> tuple[str, CalibratedModels] | None:
        pointer = self.pointer()
        if pointer is None:
            return None
        return pointer["version"], self.load(pointer["version"], pointer.get("manifest_sha256"))

    # --- writing

    def save(self, models: CalibratedModels, metadata: dict[str, Any], row_hashes: Sequence[str]) -> str:
        """A new version directory with the models' parts, metadata and manifest; returns its name."""
        return self.commit(self.stage(models, row_hashes), metadata)

    def stage(self, models: CalibratedModels, row_hashes: Sequence[str]) -> Path:
        """The models' parts and training rows written to a staging directory, not yet a version: `commit`
        makes it one (or `discard` drops it). A calibration stages while its comparison still runs."""
        staging = self.scratch()
        try:
            write_parts(models, staging)
            (staging / TRAINING_ROWS).write_text("".join(f"{h}\n" for h in sorted(row_hashes)))
        except BaseException:
            self.discard(staging)
            raise
        return staging

    def scratch(self) -> Path:
        """A new, empty directory beside the versions, never listed as one (`discard` drops it): where a
        version is staged, and where a worker process writes a comparison fit (`write_parts`)."""
        (self.root / VERSIONS).mkdir(parents=True, exist_ok=True)
        path = self.root / VERSIONS / f"{STAGING_PREFIX}{uuid.uuid4().hex}"
        path.mkdir()
        return path

    @staticmethod
    def holds_parts(directory: Path) -> bool:
        """Whether `write_parts` finished writing into `directory` (its params are written last)."""
        return (directory / PARAMS).is_file()

    def stage_comparison_fit(self, staging: Path, written: Path) -> None:
        """A comparison fit's parts (`write_parts` into `written`, a `scratch` directory) moved into a staged
        version, before `commit` lists them in its manifest."""
        os.rename(written, staging / COMPARISON)

    def commit(self, staging: Path, metadata: dict[str, Any]) -> str:
        """The staged parts with their metadata and manifest as the next version; returns its name."""
        try:
            with self._locked():
                version = self._next_version()
                _write_json(staging / METADATA, {**metadata, "version": version})
                files = {
                    p.relative_to(staging).as_posix(): sha256_file(p)
                    for p in sorted(staging.rglob("*"))
                    if p.is_file()
                }
                _write_json(staging / MANIFEST, {"algorithm": "sha256", "files": files})
                os.rename(staging, self.root / VERSIONS / version)
        except BaseException:
            self.discard(staging)
            raise
        return version

    def discard(self, staging: Path) -> None:
        """Drop what `stage` wrote for a version that will not be committed."""
        shutil.rmtree(staging, ignore_errors=True)

    def promote(
        self, version: str, *, reason: str, replacing: str | None | object = ANY, mend: bool = False
    ) -> bool:
        """Put `version` in use (it is verified first); the one it replaces can be rolled back to.

        With `replacing`, only if that version (None: no version) is still the one in use, so that a fit
        compared with one version never replaces another that was promoted meanwhile; returns whether
        `version` is in use now. `mend`: an in-use pointer that cannot be read is replaced (with it, what
        rollback could go back to), where it is otherwise an error.
        """
        path = self.path(version)
        self.verify(version)
        manifest_sha256 = sha256_file(path / MANIFEST)
        with self._locked():
            try:
                pointer = self.pointer()
            except RegistryError:
                if not mend:
                    raise
                pointer = None
            stack = list(pointer["stack"]) if pointer else []
            previous = pointer["version"] if pointer else None
            if previous == version:
                return True
            if replacing is not ANY and previous != replacing:
                return False
            stack.append({"version": version, "manifest_sha256": manifest_sha256})
            self._set_pointer(stack)
            self._append_history("promote", version, previous, reason)
            return True

    def rollback(self, *, reason: str = "rollback") -> str:
        """Back to the version that was in use before the current one; returns it."""
        with self._locked():
            pointer = self.pointer()
            if pointer is None:
                raise RegistryError("no version is in use; nothing to roll back")
            stack = list(pointer["stack"])
            if len(stack) < 2:
                raise RegistryError(
                    f"{pointer['version']} is the first version put in use; nothing to roll back to"
                )
            current = stack.pop()
            target = stack[-1]
            self.verify(target["version"], target.get("manifest_sha256"))
            self._set_pointer(stack)
            self._append_history("rollback", target["version"], current["version"], reason)
            return target["version"]

    def prune(self, keep: int) -> list[str]:
        """Delete old versions: all but the newest `keep` and those that rollback can return to."""
        with self._locked():
            pointer = self.pointer()
            protected = {entry["version"] for entry in pointer["stack"]} if pointer else set()
            versions = self.versions()
            doomed = [v for v in versions[: max(0, len(versions) - keep)] if v not in protected]
            for version in doomed:
                shutil.rmtree(self.root / VERSIONS / version)
        return doomed

    def _set_pointer(self, stack: list[dict[str, Any]]) -> None:
        stack = stack[-MAX_ROLLBACK_DEPTH:]
        top = stack[-1]
        _write_json(
            self.root / POINTER,
            {
                "version": top["version"],
                "manifest_sha256": top["manifest_sha256"],
                "changed_at": utcnow_iso(),
                "stack": stack,
            },
        )

    def _append_history(self, action: str, version: str, previous: str | None, reason: str) -> None:
        entry = {
            "at": utcnow_iso(),
            "action": action,
            "version": version,
            "previous": previous,
            "reason": reason,
        }
        path = self.root / HISTORY
        with path.open("a") as handle:
            # After a line a crash tore (no newline at its end), on a line of its own.
            torn = handle.tell() > 0 and _last_byte(path) != b"\n"
            handle.write(("\n" if torn else "") + json.dumps(entry) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def _next_version(self) -> str:
        existing = self.versions()
        number = int(VERSION_PATTERN.match(existing[-1]).group(1)) + 1 if existing else 1  # type: ignore[union-attr]
        return f"v{number:04d}"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One writer at a time across processes (the API's scheduler and a CLI may refit together)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / LOCK).open("a") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


# One skops load at a time in a process: its numpy headers go through ast.literal_eval, and CPython before
# 3.11.8 / 3.12.1 can raise "SystemError: AST constructor recursion depth mismatch" when two threads parse
# at once (gh-106905), e.g. the advice memo's warm-up and a refit loading models together.
_SKOPS_LOAD_LOCK = threading.Lock()


class InUseModels:
    """The models in use, loaded once and reloaded when the pointer changes (a promotion or a rollback
    by any process); cheap to call per batch or per request: one small file read when nothing changed."""

    def __init__(self, root: str | Path) -> None:
        self.registry = ModelRegistry(root)
        self._lock = threading.Lock()
        self._key: tuple[str, str | None] | None = None
        self._models: CalibratedModels | None = None
        self._pointer_stamp: tuple[int, int, int] | None = None
        self._pointer_version: str | None = None
        self._native: threading.Thread | None = None  # compiling the loaded version's trees

    def version_in_use(self) -> str | None:
        """The version the pointer names, without loading it. The pointer is re-read only when its file
        changed (it is replaced atomically: a new inode and mtime), so a call costs one stat: cheap enough
        for every request."""
        try:
            status = (self.registry.root / POINTER).stat()
        except FileNotFoundError:
            return None
        stamp = (status.st_ino, status.st_mtime_ns, status.st_size)
        if stamp != self._pointer_stamp:
            pointer = self.registry.pointer()
            # Stamp first read, version second: a pointer replaced in between is read again next call.
            self._pointer_version = None if pointer is None else str(pointer["version"])
            self._pointer_stamp = stamp
        return self._pointer_version

    def tree_engine(self) -> str | None:
        """How the loaded version's trees run in this process (`CalibratedModels.tree_engine`); None before
        a version is loaded."""
        models = self._models
        return None if models is None else models.tree_engine()

    def get(self) -> tuple[str, CalibratedModels] | None:
        pointer = self.registry.pointer()
        if pointer is None:
            return None
        key = (pointer["version"], pointer.get("manifest_sha256"))
        with self._lock:
            if key != self._key or self._models is None:
                # From the version's serving snapshot where there is one (as `finetwin calibrate` leaves):
                # the first answer after a start or a promotion without importing scikit-learn and skops
                # and loading through skops (~2.5 s); else from the registry.
                self._models = load_quickly(self.registry, *key)
                self._key = key
                # A long-lived reader: its trees become machine code in the background (the tree walker until
                # then), and the version's serving snapshot names them, so that the next `finetwin
                # predict` on this machine runs them too.
                self._native = threading.Thread(
                    target=_compile_and_snapshot, args=(self.registry, key[0], self._models),
                    name="native-trees-snapshot", daemon=True,
                )  # fmt: skip
                self._native.start()
            return key[0], self._models

    def wait_native(self, timeout: float | None = None) -> bool:
        """Wait until the loaded version's trees are compiled and its snapshot written (or found not to
        be possible); True when that is done within `timeout`."""
        native = self._native
        if native is None:
            return False
        native.join(timeout)
        return not native.is_alive()


def _compile_and_snapshot(registry: ModelRegistry, version: str, models: CalibratedModels) -> None:
    from calibrate import serving  # it imports this module

    if models.prepare_native(wait=True):
        with contextlib.suppress(RegistryError, OSError):  # the version changed or went: a later load decides
            serving.save(registry, version, models)


def write_parts(models: CalibratedModels, directory: Path) -> None:
    """The models' estimators (skops) and parameters (JSON) in `directory`, as a version holds them."""
    import skops.io as sio

    estimators, params = models.to_parts()
    (directory / ESTIMATORS).mkdir(parents=True)
    for name, estimator in estimators.items():
        if not _ESTIMATOR_NAME.match(name):
            raise RegistryError(f"estimator name {name!r} cannot be a file name")
        sio.dump(estimator, directory / ESTIMATORS / f"{name}{ESTIMATOR_SUFFIX}")
    _write_json(directory / PARAMS, params)


def load_models_in_use(models_dir: str | Path) -> CalibratedModels | None:
    """The calibrated models in use, or None when no version has been put in use (raises RegistryError
    when the version in use fails verification)."""
    loaded = ModelRegistry(models_dir).load_in_use()
    return loaded[1] if loaded else None


def load_quickly(
    registry: ModelRegistry, version: str, expected_manifest_sha256: str | None = None
) -> CalibratedModels:
    """`registry.load(version)`, from the version's serving snapshot where there is one (`load_in_use_quickly`
    says what that spares and costs)."""
    from calibrate import serving  # it imports this module

    return serving.load(registry, version, expected_manifest_sha256) or registry.load(
        version, expected_manifest_sha256
    )


def load_in_use_quickly(registry: ModelRegistry) -> tuple[str, CalibratedModels] | None:
    """`registry.load_in_use()`, from the version's serving snapshot where there is one: the same numbers
    without importing scikit-learn and skops and loading through skops (~2.5 s of a command's start), but
    without the estimators (no reference predictions, nothing to save as a new version)."""
    from calibrate import serving  # it imports this module

    return serving.load_in_use(registry) or registry.load_in_use()


def _untrusted_names(exc: Exception) -> str:
    """The type names in skops' message ("Untrusted types found in the file: ['a', 'b'].")."""
    text = str(exc)
    listed = text[text.find("[") + 1 : text.rfind("]")] if "[" in text else text
    return ", ".join(part.strip(" '\"") for part in listed.split(",") if part.strip())


def _read_json(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise RegistryError(f"{path} is missing") from None
    except (OSError, ValueError) as exc:
        raise RegistryError(f"{path} cannot be read as JSON: {exc}") from None
    if not isinstance(document, dict):
        raise RegistryError(f"{path} is not a JSON object")
    return document


def _write_json(path: Path, document: Any) -> None:
    """Atomically (a reader sees the old file or the new one, never half of it)."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    with temporary.open("w") as handle:
        json.dump(
            json_safe(document), handle, indent=2, sort_keys=True, default=_json_default, allow_nan=False
        )
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def _json_default(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.generic):
        return json_safe(value.item())
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
