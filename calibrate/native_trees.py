"""Native trees: a fitted HistGradientBoosting estimator's trees (`calibrate.tree_walker.TreeArrays`)
written out as C (one nested if/else per tree), compiled by the machine's C compiler into a shared library,
and called through ctypes once per batch.

Why: Treelite's interpreter costs about 0.13 µs per tree and row, so the ~70 rows x 1,000 trees of one
advice answer took ~10 ms; compiled branches cost ~15 ns, and one ctypes call a few microseconds.

Safety: nothing here comes from the registry. The C source is generated on this machine from the
estimator the registry loaded with skops (trusted types, checksums), or from the arrays of its serving
snapshot in the private cache below (numbers only, checked by `TreeArrays.check`), and the library is
compiled from it into this user's cache directory (`FINETWIN_CACHE_DIR`, else the platform's user cache
dir), named by the SHA-256 of the source and the compiler command. A library is only loaded from a
directory and file that this user owns and nobody else may write, as ssh treats its keys; otherwise it is
compiled again in a private temporary directory. No compiler (or a failed compile): `load` returns None and
the caller keeps the tree walker, or Treelite where the walker could not be compiled either.

Inputs are rows already in the trees' own space (`calibrate.compiled`): categorical columns hold the trees'
category or NaN, which goes where missing values go, exactly as Treelite's builder is given the trees.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

if TYPE_CHECKING:
    from calibrate.tree_walker import TreeArrays

log = logging.getLogger(__name__)
Library = TypeVar("Library")
# A node's kind in `calibrate.tree_walker.NODE`: a leaf (its value in `threshold`), a numeric split, a
# categorical one (its left categories in the bitset row `bitset`).
LEAF, NUMERIC, CATEGORICAL = 0, 1, 2

# -O1: the branches are the work and -O2 compiles ~3x longer for no measurable gain on these trees. A
# compiler without OpenMP (Apple's clang) gets the same source without -fopenmp: one thread per call.
COMPILE_FLAGS = ("-O1", "-shared", "-fPIC", "-fno-math-errno")
OPENMP_FLAG = "-fopenmp"
COMPILE_TIMEOUT_S = 300
SYMBOL = "finetwin_predict"
# Rows per block of the tree-by-tree loop (measured on 100,000 rows x 1,000 trees: 16 rows 2.6 s, 64 2.0 s,
# 256 1.9 s; row by row 5.7 s).
BLOCK_ROWS = 256
ABI = 5  # bumped when the generated function's signature or loop changes (in the source: the cache key)
# The trees are compiled in units of this many, in parallel, and linked into one library: the 1,000-tree
# throughput model took 15.6 s to compile as one file, most of a version's first compile on a machine. The
# units are fixed by the source, not by the machine's cores, so that a library is the same everywhere.
TREES_PER_UNIT = 200
UNIT_MARK = "\n/* finetwin native trees: next compilation unit */\n"
_HEADER = "#include <math.h>\n#include <stdint.h>\n"
# Hidden: the trees are called only from the library's own batch function, and need not be exported.
_TREE_ATTRIBUTES = '__attribute__((visibility("hidden"), noinline))'


def tree_source(trees: TreeArrays) -> str:
    """C source of the trees' raw score: baseline + every tree's leaf value. In compilation units joined by
    UNIT_MARK: the batch function first, then the trees, TREES_PER_UNIT to a unit, each unit with its own
    copy of the categorical splits' bitsets."""
    count = len(trees.roots)
    ends = np.append(trees.roots[1:], len(trees.nodes))
    bitsets = ""
    if len(trees.bitsets):
        rows = ",".join("{" + ",".join(f"{int(w)}u" for w in row) + "}" for row in trees.bitsets)
        bitsets = f"static const uint32_t bits[][8] = {{{rows}}};\n"
    units = []
    for first in range(0, count, TREES_PER_UNIT):
        parts = [_HEADER, bitsets]
        for k in range(first, min(first + TREES_PER_UNIT, count)):
            # noinline: each tree is compiled on its own; inlined into one huge function they compiled slower
            # and ran slower (measured on 1,000 trees of 31 leaves: 100k rows 2.9 -> 2.2 s).
            parts.append(f"{_TREE_ATTRIBUTES} double tree_{k}(const double *x) {{\n")
            parts.append(_node(trees.nodes[trees.roots[k] : ends[k]], 0, 1))
            parts.append("}\n")
        units.append("".join(parts))
    declared = "".join(f"{_TREE_ATTRIBUTES} double tree_{k}(const double *x);\n" for k in range(count))
    table = ",".join(f"tree_{k}" for k in range(count)) or "0"
    # Tree by tree over a block of rows, not row by row over the trees: one tree's code and branch history
    # stay hot for the whole block (the 1,000 trees' code outgrows the instruction cache). Each row still
    # adds baseline, tree 0, tree 1, ... in that order: the same sums to the last bit.
    batch = (
        f"{_HEADER}/* finetwin native trees, abi {ABI}: {count} trees, {trees.features} features */\n"
        f"{declared}"
        f"static double (*const trees[])(const double *) = {{{table}}};\n"
        f"void {SYMBOL}(const double *X, long n, long stride, double *out, int nthread) {{\n"
        "    #pragma omp parallel for num_threads(nthread) schedule(static)\n"
        f"    for (long b = 0; b < n; b += {BLOCK_ROWS}) {{\n"
        f"        long end = b + {BLOCK_ROWS} < n ? b + {BLOCK_ROWS} : n;\n"
        f"        for (long i = b; i < end; i++) out[i] = {_literal(trees.baseline)};\n"
        f"        for (long k = 0; k < {count}; k++)\n"
        "            for (long i = b; i < end; i++) out[i] += trees[k](X + i * stride);\n"
        "    }\n"
        "}\n"
    )
    return UNIT_MARK.join([batch, *units])


def _node(nodes: np.ndarray, key: int, depth: int) -> str:
    """One node of a tree (`tree_walker.NODE`, children counted from the tree's first node) as C."""
    node = nodes[key]
    pad = "    " * depth
    if node["kind"] == LEAF:
        return f"{pad}return {_literal(node['threshold'])};\n"
    value = f"x[{int(node['feature'])}]"
    missing = "1" if node["missing_left"] else "0"
    if node["kind"] == CATEGORICAL:
        # A category in the left bitset goes left; one outside 0..255 (never seen by these trees) right.
        known = f"({value} >= 0 && {value} < 256)"
        word = f"bits[{int(node['bitset'])}][(int){value} >> 5]"
        test = f"{known} && (({word} >> ((int){value} & 31)) & 1u)"
    else:
        test = f"{value} <= {_literal(node['threshold'])}"
    condition = f"isnan({value}) ? {missing} : ({test})"
    return (
        f"{pad}if ({condition}) {{\n"
        + _node(nodes, int(node["left"]), depth + 1)
        + f"{pad}}} else {{\n"
        + _node(nodes, int(node["right"]), depth + 1)
        + f"{pad}}}\n"
    )


def _literal(number: float) -> str:
    """A double as C reads it back exactly (repr round-trips; C has names for the infinities)."""
    number = float(number)
    if np.isnan(number):
        return "NAN"
    if np.isinf(number):
        return "INFINITY" if number > 0 else "(-INFINITY)"
    return repr(number)


class NativeTrees:
    """A compiled library's batch function: `raw(X, nthread)` for C-contiguous float64 rows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_int]
        self._library, self._function = bind(path, SYMBOL, argtypes)

    def raw(self, X: np.ndarray, nthread: int = 1) -> np.ndarray:
        X = np.ascontiguousarray(X, dtype=np.float64)
        out = np.empty(len(X), dtype=np.float64)
        if len(X):
            self._function(X.ctypes.data, len(X), X.shape[1], out.ctypes.data, max(1, int(nthread)))
        return out


def compiler() -> str | None:
    """The C compiler to use: $CC, else cc or gcc on the PATH; None when there is none."""
    named = os.environ.get("CC")
    if named:
        return shutil.which(named)
    return shutil.which("cc") or shutil.which("gcc")


def cache_dir() -> Path:
    configured = os.environ.get("FINETWIN_CACHE_DIR")
    if configured:
        return Path(configured) / "trees"
    import platformdirs

    return Path(platformdirs.user_cache_dir("finetwin", appauthor=False)) / "trees"


def enabled() -> bool:
    """`FINETWIN_NATIVE_TREES` (default on): off keeps every prediction on Treelite and scikit-learn."""
    # pydantic's words for false, which the settings check the variable against (`CalibrateSettings`).
    return os.environ.get("FINETWIN_NATIVE_TREES", "on").strip().lower() not in (
        "0", "off", "f", "false", "n", "no",
    )  # fmt: skip


_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock_for(digest: str) -> threading.Lock:
    """One lock per library: a source compiles once per process, and different ones in parallel."""
    with _locks_guard:
        return _locks.setdefault(digest, threading.Lock())


def bind(path: Path, symbol: str, argtypes: list[Any]) -> tuple[ctypes.CDLL, Any]:
    """The library at `path` and its function `symbol` (returning nothing, taking `argtypes`); the caller
    keeps both: the function lives as long as its library stays loaded. Raises OSError or AttributeError."""
    library = ctypes.CDLL(str(path))
    function = getattr(library, symbol)
    function.restype = None
    function.argtypes = argtypes
    return library, function


def load(source: str) -> NativeTrees | None:
    """The library of `source` from the cache, compiled there first if it is not; None without a working
    compiler. Thread-safe; processes racing on one source each write their own file and rename it."""
    return load_library(source, NativeTrees)


def load_library(source: str, kind: Callable[[Path], Library]) -> Library | None:
    """`load` for any C source, the library opened as `kind` (`calibrate.tree_walker.Walker`)."""
    cc = compiler()
    if cc is None:
        return None
    for command in ((cc, *COMPILE_FLAGS, OPENMP_FLAG), (cc, *COMPILE_FLAGS)):
        native = _load_with(command, source, kind)
        if native is not None:
            return native
    return None


_LIBRARY_NAME = re.compile(r"[0-9a-f]{64}\.so")


def open_cached(name: str) -> NativeTrees | None:
    """A library `load` compiled earlier, by its file name in the cache (`NativeTrees.path.name`); None when
    it is not there, is not private to this user, or does not load."""
    path = cached_path(name)
    return None if path is None else _open(path, NativeTrees)


def cached_path(name: str) -> Path | None:
    """Where the cache holds the library of that file name, if it does and it is private to this user."""
    if not _LIBRARY_NAME.fullmatch(name):
        return None
    path = cache_dir() / name
    try:
        return path if path.is_file() and private(path) else None
    except OSError:
        return None


def _load_with(command: tuple[str, ...], source: str, kind: Callable[[Path], Library]) -> Library | None:
    digest = hashlib.sha256("\0".join((*command, source)).encode()).hexdigest()
    directory = cache_dir()
    with _lock_for(digest):
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            is_private = private(directory)
        except OSError:
            is_private = False
        if not is_private:  # a cache others could write to is no place to load code from
            with tempfile.TemporaryDirectory(prefix="finetwin-trees-") as scratch:
                path = _compile(command, source, Path(scratch), digest)
                return _open(path, kind) if path is not None else None
        path = directory / f"{digest}.so"
        if path.exists() and private(path):
            native = _open(path, kind)
            if native is not None:
                return native
        built = _compile(command, source, directory, digest)
        return _open(built, kind) if built is not None else None


def _compile(command: tuple[str, ...], source: str, directory: Path, digest: str) -> Path | None:
    """The library of `source` (its units, UNIT_MARK apart, compiled side by side and linked) as
    `directory/<digest>.so`; None when the compiler does not run or fails."""
    with tempfile.TemporaryDirectory(prefix="build-", dir=directory) as scratch:
        build = Path(scratch)
        units = []
        for number, text in enumerate(source.split(UNIT_MARK)):
            c_file = build / f"unit{number}.c"
            c_file.write_text(text)
            units.append(c_file)
        objects = [str(unit.with_suffix(".o")) for unit in units]
        library = build / "trees.so"
        failed = _run_all(
            [[*command, "-c", "-o", o, str(unit)] for unit, o in zip(units, objects, strict=True)], build
        ) or _run_all([[*command, "-o", str(library), *objects, "-lm"]], build)
        if failed is not None:
            log.warning("native trees: %s; predictions go on more slowly without this library", failed)
            return None
        target = directory / f"{digest}.so"
        library.chmod(0o700)
        os.replace(library, target)
        return target


def _run_all(commands: list[list[str]], build: Path) -> str | None:
    """Runs the commands side by side, within COMPILE_TIMEOUT_S: None when all succeed, else what went
    wrong (the others are stopped). Each one's errors go to a file: a pipe that fills would stall it."""
    deadline = time.monotonic() + COMPILE_TIMEOUT_S
    running: list[tuple[subprocess.Popen[bytes], Path]] = []
    # The compiler's own temporary files in the build directory, which goes with the build: a compile
    # stopped here (another unit failed) left its assembly in the system's temporary directory.
    environment = {**os.environ, "TMPDIR": str(build)}
    try:
        for number, command in enumerate(commands):
            errors = build / f"errors{number}.txt"
            with errors.open("wb") as sink:
                # A session of its own: stopping a compile stops the compiler's own children too (cc1, as),
                # which, left running, wrote into the build directory as it was removed.
                process = subprocess.Popen(
                    command, stdout=subprocess.DEVNULL, stderr=sink, env=environment, start_new_session=True
                )
                running.append((process, errors))
        for process, errors in running:
            if process.wait(timeout=max(0.0, deadline - time.monotonic())) != 0:
                return f"compiling failed: {errors.read_text(errors='replace')[-400:]}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the compiler did not run ({exc})"
    finally:
        for process, _ in running:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    return None


def _open(path: Path, kind: Callable[[Path], Library]) -> Library | None:
    try:
        return kind(path)
    except (OSError, AttributeError) as exc:
        log.warning("native trees: %s could not be loaded (%s); predictions go on without it", path, exc)
        return None


def private(path: Path) -> bool:
    """Owned by this user and writable by nobody else (the file and the directory holding it). False where
    the platform has no owners to check (Windows): the library is then compiled afresh, privately."""
    if not hasattr(os, "getuid"):
        return False
    for item in (path, path.parent) if path.is_file() else (path,):
        info = item.stat()
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
    return True
