"""Compiled trees: a fitted HistGradientBoosting estimator translated into a Treelite model and evaluated by
Treelite's C++ predictor (GTIL), one call per ensemble, on the numeric matrix of `calibrate.encoding`.

scikit-learn spends ~8 ms per `predict` call around its trees (input validation, the categorical
preprocessing, one Python call per tree); Treelite's call costs tens of microseconds plus the trees.

The translation happens in memory when the models are built or loaded, from the scikit-learn estimator the
registry loaded with skops (trusted types, checksums): nothing new is written or read, so no file can smuggle
code through this path. The scikit-learn estimator stays the reference: `reference_predict` gives its
numbers, and a test holds the compiled ones to 1e-6 relative of them.

The trees are handed to Treelite node by node (its model builder), and the input is brought into the
trees' own space here with numpy, as scikit-learn's `_preprocess_X` would: its ColumnTransformer puts the
categorical columns first and replaces each code by its rank among the codes the estimator saw in training
(NaN for one it never saw, which then goes where missing values go). `treelite.sklearn.import_model` (4.8)
got that remapping wrong for these estimators (measured: 82 of the sample's 3,983 throughput predictions
off by up to 4.5 %), so it is not used.

Fastest of all, `prepare_native` compiles the same trees to machine code (`calibrate.native_trees`): about
20x Treelite's interpreter on an answer's ~70 rows, but ~8 s to compile once per version and machine. Until
then (and in `finetwin predict`, which never waits for a compile), the tree walker (`calibrate.tree_walker`)
walks the same trees from arrays at about half the compiled code's speed. Treelite and scikit-learn remain
for a machine without a C compiler, or with native trees off.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from threadpoolctl import threadpool_limits

from calibrate import native_trees, tree_walker
from calibrate.tree_walker import TreeArrays

if TYPE_CHECKING:  # Treelite and scikit-learn are imported where used: compiled trees run without them
    import treelite
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

    Estimator = HistGradientBoostingRegressor | HistGradientBoostingClassifier

# One thread: the machines that serve finetwin run many processes on few cores, and one ~100-row call is
# over long before more threads would pay for waking up.
THREADS = 1
# Without native trees or the walker: from this many rows on, scikit-learn's own loop over the trees is the
# faster one (measured: Treelite's interpreter costs about twice scikit-learn's per row, scikit-learn ~8 ms
# more per call; they cross near 200 rows). An answer (~100 rows) takes Treelite, a CSV scikit-learn.
COMPILED_BELOW_ROWS = 256
# From this many rows on, native trees use every core (up to 4): a CSV of configurations, not an answer, nor
# the batches of a twin's ensemble, whose runs already share the cores out between processes.
PARALLEL_FROM_ROWS = 20_000
MAX_THREADS = 4


@dataclass(frozen=True)
class TreesSnapshot:
    """What compiled trees need of their estimator to run without it: the trees as arrays for the walker
    (`calibrate.tree_walker`), the file name of their native library in the cache once one is compiled
    (else None), the input space (`_input_space`) and whether it classifies. A version runs from these
    alone, without scikit-learn or skops (`calibrate.serving`)."""

    library: str | None
    order: tuple[int, ...] | None
    lookups: dict[int, tuple[float, ...]]
    classifier: bool
    arrays: TreeArrays

    def to_json(self) -> dict[str, Any]:
        """All but the arrays, which go to an array file (`TreeArrays.to_arrays`)."""
        return {
            "library": self.library,
            "order": None if self.order is None else list(self.order),
            # NaN (a code the trees never saw) as None: JSON has no NaN.
            "lookups": {
                str(k): [None if np.isnan(v) else v for v in table] for k, table in self.lookups.items()
            },
            "classifier": self.classifier,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], arrays: TreeArrays) -> TreesSnapshot:
        """Raises ValueError, KeyError or TypeError for anything but what `to_json` writes."""
        library, order, classifier = data["library"], data["order"], data["classifier"]
        if not isinstance(library, str | None) or not isinstance(classifier, bool):
            raise ValueError("malformed trees snapshot")
        return cls(
            library,
            None if order is None else tuple(int(j) for j in order),
            {
                int(k): tuple(np.nan if v is None else float(v) for v in table)
                for k, table in data["lookups"].items()
            },
            classifier,
            arrays,
        )


class CompiledTrees:
    """`raw(X)`: the estimator's raw score (log-odds for a binary classifier) for rows of the matrix
    columns it was fitted on. Built from a fitted estimator, or from a `TreesSnapshot` of one (native trees
    or the walker only: no Treelite, no reference numbers)."""

    def __init__(self, estimator: Estimator | TreesSnapshot) -> None:
        self._model: treelite.Model | None = None  # built at the first small call: a CSV never needs it
        self._lock = threading.Lock()
        self._native: native_trees.NativeTrees | None = None
        self._native_started = False
        self._native_done = threading.Event()
        self._arrays: TreeArrays | None = None  # the walker's, built at its first call
        if isinstance(estimator, TreesSnapshot):
            self.estimator: Estimator | None = None
            self.classifier = estimator.classifier
            self._order = None if estimator.order is None else np.array(estimator.order, dtype=np.intp)
            self._lookups = {j: np.array(table, dtype=np.float64) for j, table in estimator.lookups.items()}
            self._arrays = estimator.arrays
            if estimator.library is not None:
                self._native = native_trees.open_cached(estimator.library)
            if self._native is None and tree_walker.walker() is None:
                raise ValueError("these trees cannot run here: no compiled library and no tree walker")
            if self._native is not None:  # else the library is compiled (by `prepare_native`) as usual
                self._native_started = True
                self._native_done.set()
            return
        self.estimator = estimator
        # Duck-typed, so that this module does not import scikit-learn.
        self.classifier = hasattr(estimator, "predict_proba")
        if self.classifier and len(estimator.classes_) != 2:
            raise ValueError("only binary classifiers are compiled")
        self._order, self._lookups = _input_space(estimator)

    def snapshot(self) -> TreesSnapshot:
        """These trees as a `TreesSnapshot`: with their native library once it is ready."""
        return TreesSnapshot(
            None if self._native is None else self._native.path.name,
            None if self._order is None else tuple(int(j) for j in self._order),
            {int(j): tuple(float(v) for v in table) for j, table in self._lookups.items()},
            self.classifier,
            self.arrays,
        )

    @property
    def arrays(self) -> TreeArrays:
        arrays = self._arrays  # without the lock once built: every walk of these trees asks for them
        if arrays is not None:
            return arrays
        with self._lock:
            if self._arrays is None:
                self._arrays = TreeArrays.from_estimator(self._fitted())
            return self._arrays

    def prepare_native(self, *, wait: bool = True) -> bool:
        """Compile (or load from the cache) the trees' native library; calls use it once it is ready.
        `wait=False` compiles in a daemon thread. True when the library is ready on return."""
        if not native_trees.enabled():
            return False
        with self._lock:
            start, self._native_started = not self._native_started, True
        if start:
            threading.Thread(target=self._load_native, name="native-trees", daemon=True).start()
        if wait:
            self._native_done.wait()
        return self._native is not None

    def engine(self) -> str:
        """How these trees run: "native", "compiling" (started, not ready: the walker meanwhile), "walker"
        or "treelite" (no compiler, or native trees off)."""
        if self._native is not None:
            return "native"
        if self._native_started and not self._native_done.is_set():
            return "compiling"
        return "walker" if tree_walker.walker() is not None else "treelite"

    def _load_native(self) -> None:
        try:
            self._native = native_trees.load(native_trees.tree_source(self.arrays))
        finally:
            self._native_done.set()

    @property
    def model(self) -> treelite.Model:
        with self._lock:
            if self._model is None:
                self._model = _build(self._fitted())
            return self._model

    def _fitted(self) -> Estimator:
        if self.estimator is None:
            raise RuntimeError(
                "these trees run from their serving snapshot alone (no scikit-learn estimator); load the "
                "version from the registry for scikit-learn's estimator"
            )
        return self.estimator

    def raw(self, X: np.ndarray) -> np.ndarray:
        if len(X) == 0:
            return np.zeros(0)
        X = self._in_tree_space(X)
        threads = min(MAX_THREADS, os.cpu_count() or 1) if len(X) >= PARALLEL_FROM_ROWS else THREADS
        native = self._native
        if native is not None:
            return native.raw(X, threads)
        walker = tree_walker.walker()
        if walker is not None:
            return walker.raw(self.arrays, X, threads)
        import treelite.gtil

        out = treelite.gtil.predict(self.model, X, nthread=THREADS, pred_margin=True)
        return np.asarray(out, dtype=np.float64).reshape(len(X))

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Regressor: the prediction; binary classifier: P(class 1)."""
        if len(X) >= COMPILED_BELOW_ROWS and self._native is None and tree_walker.walker() is None:
            with threadpool_limits(limits=THREADS, user_api="openmp"):
                return self.reference_predict(X)
        raw = self.raw(X)
        return 1.0 / (1.0 + np.exp(-raw)) if self.classifier else raw

    def reference_predict(self, X: np.ndarray) -> np.ndarray:
        """The same numbers from scikit-learn itself."""
        estimator = self._fitted()
        if self.classifier:
            return estimator.predict_proba(X)[:, 1]
        return estimator.predict(X)

    def _in_tree_space(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        # take, not X[:, order]: the same copy, in a quarter of the time (100,000 x 44: 3.7 ms, not 13.5 ms).
        out = X.take(self._order, axis=1) if self._order is not None else X.copy(order="C")
        for j, lookup in self._lookups.items():
            codes = out[:, j]
            inside = np.isfinite(codes) & (codes >= 0) & (codes < len(lookup))
            mapped = np.full(len(codes), np.nan)
            mapped[inside] = lookup[codes[inside].astype(np.intp)]
            out[:, j] = mapped
        return out


def _input_space(estimator: Estimator) -> tuple[np.ndarray | None, dict[int, np.ndarray]]:
    """(input column of each tree column or None for the same order, per categorical tree column a table
    code -> the trees' category, NaN where the trees never saw the code)."""
    mask = getattr(estimator, "is_categorical_", None)
    if mask is None or not np.any(mask):
        return None, {}
    preprocessor = getattr(estimator, "_preprocessor", None)
    known = estimator._bin_mapper.bin_thresholds_  # per tree column; categorical: the categories seen
    if preprocessor is None:  # the codes are the trees' categories
        order = None
        categories = [np.asarray(known[j]) for j in np.flatnonzero(mask)]
        positions = list(np.flatnonzero(mask))
    else:
        encoder_name, encoder, categorical = preprocessor.transformers_[0]
        numeric = preprocessor.transformers_[1][2]
        if encoder_name != "encoder":
            raise ValueError("unexpected scikit-learn preprocessing inside HistGradientBoosting")
        order = np.concatenate([_indices(categorical), _indices(numeric)]).astype(np.intp)
        categories = [np.asarray(c, dtype=np.float64) for c in encoder.categories_]
        positions = list(range(len(categories)))
    lookups: dict[int, np.ndarray] = {}
    for position, raw in zip(positions, categories, strict=True):
        raw = raw[np.isfinite(raw)].astype(np.intp)
        seen = set(np.asarray(known[position], dtype=np.float64).astype(np.intp).tolist())
        table = np.full(int(raw.max()) + 1 if len(raw) else 0, np.nan)
        for rank, code in enumerate(raw):
            category = rank if preprocessor is not None else code
            if category in seen:
                table[code] = category
        lookups[int(position)] = table
    return order, lookups


def _indices(selection: object) -> np.ndarray:
    selection = np.asarray(selection)
    return np.flatnonzero(selection) if selection.dtype == bool else selection.astype(np.intp)


def _build(estimator: Estimator) -> treelite.Model:
    """The estimator's trees as a Treelite model whose output is the raw score (no link function)."""
    from treelite.model_builder import Metadata, ModelBuilder, PostProcessorFunc, TreeAnnotation

    trees = [tree for iteration in estimator._predictors for tree in iteration]
    baseline = float(np.asarray(estimator._baseline_prediction).ravel()[0])
    builder = ModelBuilder(
        threshold_type="float64",
        leaf_output_type="float64",
        metadata=Metadata(
            num_feature=int(estimator.n_features_in_),
            task_type="kRegressor",
            average_tree_output=False,
            num_target=1,
            num_class=[1],
            leaf_vector_shape=(1, 1),
        ),  # fmt: skip
        tree_annotation=TreeAnnotation(
            num_tree=len(trees), target_id=[0] * len(trees), class_id=[0] * len(trees)
        ),
        postprocessor=PostProcessorFunc(name="identity"),
        base_scores=[baseline],
    )
    for tree in trees:
        builder.start_tree()
        for key, node in enumerate(tree.nodes):
            builder.start_node(key)
            if node["is_leaf"]:
                builder.leaf(float(node["value"]))
            elif node["is_categorical"]:
                builder.categorical_test(
                    int(node["feature_idx"]),
                    default_left=bool(node["missing_go_to_left"]),
                    category_list=_categories(tree.raw_left_cat_bitsets[node["bitset_idx"]]),
                    category_list_right_child=False,
                    left_child_key=int(node["left"]),
                    right_child_key=int(node["right"]),
                )
            else:
                builder.numerical_test(
                    int(node["feature_idx"]),
                    float(node["num_threshold"]),
                    default_left=bool(node["missing_go_to_left"]),
                    opname="<=",
                    left_child_key=int(node["left"]),
                    right_child_key=int(node["right"]),
                )
            builder.end_node()
        builder.end_tree()
    return builder.commit()


def _categories(bitset: np.ndarray) -> list[int]:
    """The categories a 256-bit bitset (8 words of 32) holds."""
    words = np.asarray(bitset, dtype=np.uint32)
    return [32 * w + b for w in range(len(words)) for b in range(32) if (int(words[w]) >> b) & 1]
