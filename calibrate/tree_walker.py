"""The tree walker: one small C function, compiled once per machine, that walks any version's trees from
their node arrays (`TreeArrays`), so that a version runs at near machine-code speed the moment it exists.

Why: a version's own machine code (`calibrate.native_trees`) takes ~8 s to compile, once per version and
machine, so the first `finetwin predict` after a calibration took ~11 s for 100,000 rows. The walker reads
the same trees as data: measured on 100,000 configurations x the 1,000 throughput trees, about twice the
compiled code's time (1.4 s against 0.7 s), and about a tenth of Treelite's interpreter's. Long-lived
processes still compile the version's own code in the background and switch over when it is ready.

The arrays are the estimator's own nodes, in its own (depth-first) order, so a node's children always come
after it: `TreeArrays.check` holds every index inside its tree and every child after its parent, which is
what makes a walk end and stay inside the arrays whatever a damaged file holds. They are written next to
the serving snapshot (`calibrate.serving`) and read back with `allow_pickle=False`.

Sums are baseline + tree 0 + tree 1 + ... in that order per row, as in the compiled code: the same numbers
to the last bit (a test).
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calibrate import native_trees
from calibrate.native_trees import CATEGORICAL, LEAF, NUMERIC

# `kind`: native_trees.LEAF (`threshold` holds its value), NUMERIC or CATEGORICAL (`bitset`: its row).
NODE = np.dtype(
    [
        ("threshold", "<f8"),
        ("left", "<i4"),
        ("right", "<i4"),
        ("bitset", "<i4"),
        ("feature", "<i2"),
        ("kind", "u1"),
        ("missing_left", "u1"),
    ]
)
SYMBOL = "finetwin_walk"
# Tree by tree over a block of rows, as the compiled code does (`native_trees.BLOCK_ROWS`).
SOURCE = f"""#include <math.h>
#include <stdint.h>
/* finetwin tree walker: nodes of {NODE.itemsize} bytes */
typedef struct {{
    double threshold; int32_t left, right, bitset; int16_t feature; uint8_t kind, missing_left;
}} node_t;
void {SYMBOL}(const node_t *nodes, const int64_t *roots, long ntrees, const uint32_t *bitsets,
                   double baseline, const double *X, long n, long stride, double *out, int nthread) {{
    #pragma omp parallel for num_threads(nthread) schedule(static)
    for (long b = 0; b < n; b += {native_trees.BLOCK_ROWS}) {{
        long end = b + {native_trees.BLOCK_ROWS} < n ? b + {native_trees.BLOCK_ROWS} : n;
        for (long i = b; i < end; i++) out[i] = baseline;
        for (long k = 0; k < ntrees; k++) {{
            const node_t *tree = nodes + roots[k];
            for (long i = b; i < end; i++) {{
                const double *x = X + i * stride;
                const node_t *node = tree;
                while (node->kind != {LEAF}) {{
                    double v = x[node->feature];
                    int left;
                    if (isnan(v)) left = node->missing_left;
                    else if (node->kind == {NUMERIC}) left = v <= node->threshold;
                    else {{
                        /* a category in the left bitset goes left; one outside 0..255 right */
                        const uint32_t *words = bitsets + 8 * (long)node->bitset;
                        left = v >= 0 && v < 256 && ((words[(int)v >> 5] >> ((int)v & 31)) & 1u);
                    }}
                    node = tree + (left ? node->left : node->right);
                }}
                out[i] += node->threshold;
            }}
        }}
    }}
}}
"""


@dataclass(frozen=True)
class TreeArrays:
    """An estimator's trees as arrays: `nodes` (NODE) of every tree one after another, children counted
    from their tree's first node; `roots`, where each tree starts; `bitsets`, the categorical splits' left
    categories (8 words of 32 bits a row); the baseline and the number of input columns."""

    nodes: np.ndarray
    roots: np.ndarray
    bitsets: np.ndarray
    baseline: float
    features: int

    @classmethod
    def from_estimator(cls, estimator: Any) -> TreeArrays:
        trees = [tree for iteration in estimator._predictors for tree in iteration]
        nodes, roots, bitsets = [], [], []
        start = first_bitset = 0
        for tree in trees:
            source = tree.nodes
            leaf = source["is_leaf"].astype(bool)
            categorical = source["is_categorical"].astype(bool) & ~leaf
            part = np.zeros(len(source), dtype=NODE)
            part["threshold"] = np.where(leaf, source["value"], source["num_threshold"])
            part["left"] = np.where(leaf, 0, source["left"])
            part["right"] = np.where(leaf, 0, source["right"])
            part["bitset"] = np.where(categorical, source["bitset_idx"].astype(np.int64) + first_bitset, 0)
            part["feature"] = np.where(leaf, 0, source["feature_idx"])
            part["kind"] = np.where(leaf, LEAF, np.where(categorical, CATEGORICAL, NUMERIC))
            part["missing_left"] = source["missing_go_to_left"]
            words = np.asarray(tree.raw_left_cat_bitsets, dtype=np.uint32).reshape(-1, 8)
            nodes.append(part)
            bitsets.append(words)
            roots.append(start)
            start += len(part)
            first_bitset += len(words)
        arrays = cls(
            np.concatenate(nodes) if nodes else np.zeros(0, dtype=NODE),
            np.array(roots, dtype=np.int64),
            np.ascontiguousarray(np.concatenate(bitsets) if bitsets else np.zeros((0, 8)), dtype=np.uint32),
            float(np.asarray(estimator._baseline_prediction).ravel()[0]),
            int(estimator.n_features_in_),
        )
        arrays.check()  # scikit-learn's depth-first node order, which a walk relies on to end, still holds
        return arrays

    def to_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """The arrays by name for `np.savez` (`from_arrays` reads them back)."""
        return {
            f"{prefix}.nodes": self.nodes,
            f"{prefix}.roots": self.roots,
            f"{prefix}.bitsets": self.bitsets,
            f"{prefix}.scalars": np.array([self.baseline, float(self.features)]),
        }

    @classmethod
    def from_arrays(cls, arrays: Any, prefix: str) -> TreeArrays:
        """Raises KeyError or ValueError for anything `to_arrays` did not write, or trees a walk could
        leave (`check`)."""
        nodes, roots, bitsets = (arrays[f"{prefix}.{name}"] for name in ("nodes", "roots", "bitsets"))
        baseline, features = (float(v) for v in arrays[f"{prefix}.scalars"])
        if not (np.isfinite(baseline) and features.is_integer() and 0 <= features <= np.iinfo(np.int16).max):
            raise ValueError("tree arrays with a baseline or a feature count out of range")
        if nodes.dtype != NODE or roots.dtype != np.int64 or bitsets.dtype != np.uint32:
            raise ValueError("tree arrays of another format")
        if nodes.ndim != 1 or roots.ndim != 1 or bitsets.ndim != 2 or bitsets.shape[1] != 8:
            raise ValueError("tree arrays of another shape")
        arrays = cls(
            np.ascontiguousarray(nodes), np.ascontiguousarray(roots), np.ascontiguousarray(bitsets),
            baseline, int(features),
        )  # fmt: skip
        arrays.check()
        return arrays

    def check(self) -> None:
        """ValueError unless every walk ends inside the arrays: trees back to back from node 0, each
        split's children inside its tree and after it, features inside a row, bitsets inside the table."""
        nodes, roots = self.nodes, self.roots
        total = len(nodes)
        if len(roots) and (roots[0] != 0 or np.any(np.diff(roots) <= 0) or roots[-1] >= total):
            raise ValueError("trees out of order")
        if (len(roots) == 0) != (total == 0):
            raise ValueError("nodes without trees")
        if total and not 0 < self.features <= np.iinfo(np.int16).max:
            raise ValueError("a feature count out of range")
        sizes = np.diff(np.append(roots, total))
        position = np.arange(total) - np.repeat(roots, sizes)  # each node's place in its tree
        size = np.repeat(sizes, sizes)
        kind = nodes["kind"]
        if np.any(kind > CATEGORICAL):
            raise ValueError("a node of no known kind")
        split = kind != LEAF
        for child in ("left", "right"):
            inside = (nodes[child] > position) & (nodes[child] < size)
            if np.any(split & ~inside):
                raise ValueError(f"a {child} child outside its tree")
        feature = nodes["feature"]
        if np.any(split & ((feature < 0) | (feature >= self.features))):
            raise ValueError("a split on a column the rows do not have")
        bitset = nodes["bitset"]
        if np.any((kind == CATEGORICAL) & ((bitset < 0) | (bitset >= len(self.bitsets)))):
            raise ValueError("a categorical split without its bitset")


class Walker:
    """The compiled walker: `raw(arrays, X, nthread)` for C-contiguous float64 rows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        argtypes = [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_double,
            ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_int,
        ]  # fmt: skip
        self._library, self._function = native_trees.bind(path, SYMBOL, argtypes)

    def raw(self, trees: TreeArrays, X: np.ndarray, nthread: int = 1) -> np.ndarray:
        X = np.ascontiguousarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != trees.features:
            raise ValueError(f"rows of {X.shape[-1]} columns for trees of {trees.features}")
        out = np.empty(len(X), dtype=np.float64)
        if len(X):
            self._function(
                trees.nodes.ctypes.data, trees.roots.ctypes.data, len(trees.roots), trees.bitsets.ctypes.data,
                trees.baseline, X.ctypes.data, len(X), X.shape[1], out.ctypes.data, max(1, int(nthread)),
            )  # fmt: skip
        return out


_walker: Walker | None = None
_walker_tried = False
_walker_lock = threading.Lock()


def walker() -> Walker | None:
    """This machine's walker, compiled into the native trees' private cache the first time (a tenth of a
    second) and loaded once per process; None where native trees are off or there is no working compiler."""
    global _walker, _walker_tried
    if not native_trees.enabled():
        return None
    if not _walker_tried:  # the lock only until the first try: later calls are on every prediction's path
        with _walker_lock:
            if not _walker_tried:
                _walker = native_trees.load_library(SOURCE, Walker)
                _walker_tried = True
    return _walker
