"""The simulated cluster: nodes, each with one GPU type and a number of GPUs (8 unless told otherwise).

Built from a YAML file (`nodes: [{gpu_model, count, gpus_per_node}]`) or from the store's node inventory,
and changed by what-if scenarios (nodes of a type added or removed). Immutable: a scenario makes a new one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from twin.domain import GPUS_PER_NODE, UnknownGpuModel, canonical_gpu_name, gpu_or_unknown, known_gpu_name
from twin.input_errors import unknown_keys


class ClusterFormatError(ValueError):
    """A cluster description that cannot be used; the message says where and why."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    node_id: str
    gpu_model: str  # the benchmark's spelling when the type is known
    gpus: int
    # Draining (`node.status` drain): it runs the jobs on it to their end and takes no new one, so its GPUs
    # serve no one else and count in no capacity (as `twin.actuals` counts the GPUs that are up).
    draining: bool = False


@dataclass(frozen=True, slots=True)
class Cluster:
    nodes: tuple[NodeSpec, ...]

    @property
    def gpu_models(self) -> list[str]:
        """The GPU types present, in a stable order (sorted by name)."""
        return sorted({n.gpu_model for n in self.nodes})

    def gpus_by_model(self) -> dict[str, int]:
        """The GPUs that serve (of nodes not draining), by type: every type present, 0 where all drain."""
        totals: dict[str, int] = dict.fromkeys(self.gpu_models, 0)
        for node in self.nodes:
            if not node.draining:
                totals[node.gpu_model] += node.gpus
        return totals

    @property
    def total_gpus(self) -> int:
        """The GPUs that serve (of nodes not draining)."""
        return sum(n.gpus for n in self.nodes if not n.draining)

    @property
    def draining(self) -> int:
        """How many nodes drain."""
        return sum(n.draining for n in self.nodes)

    def describe(self) -> dict[str, object]:
        """What a forecast or backtest document says of the cluster it started from."""
        return {"nodes": len(self.nodes), "draining": self.draining, "gpus_by_model": self.gpus_by_model()}

    def with_nodes_added(self, gpu_model: str, count: int, gpus_per_node: int = GPUS_PER_NODE) -> Cluster:
        if count < 0 or gpus_per_node <= 0:
            raise ClusterFormatError(f"cannot add {count} nodes of {gpus_per_node} GPUs")
        try:  # a misspelled type would be a phantom pool that no job asks for
            model = known_gpu_name(gpu_model)
        except UnknownGpuModel as exc:
            raise ClusterFormatError(f"cannot add nodes: {exc}") from None
        taken = {n.node_id for n in self.nodes}
        added: list[NodeSpec] = []
        k = 0
        while len(added) < count:
            node_id = f"{model}-added-{k}"
            k += 1
            if node_id not in taken:
                added.append(NodeSpec(node_id, model, gpus_per_node))
        return Cluster(self.nodes + tuple(added))

    def with_nodes_removed(self, gpu_model: str, count: int) -> Cluster:
        """Removes the last `count` nodes of the type (newest first); refuses to remove more than exist."""
        model = canonical_gpu_name(gpu_model)
        of_type = [i for i, n in enumerate(self.nodes) if n.gpu_model == model]
        if count < 0 or count > len(of_type):
            raise ClusterFormatError(
                f"cannot remove {count} node(s) of {model}: the cluster has {len(of_type)}"
            )
        dropped = set(of_type[len(of_type) - count :])
        return Cluster(tuple(n for i, n in enumerate(self.nodes) if i not in dropped))


CLUSTER_KEYS = ("nodes",)
# Bounds of a cluster file: the plan sweep's largest node count, and the what-if's largest node. A count past
# them was a file nobody meant, and built nodes until memory ran out.
MAX_NODES = 100_000
MAX_GPUS_PER_NODE = 64
NODE_KEYS = ("gpu_model", "count", "gpus_per_node")


def cluster_from_spec(spec: object, source: str = "cluster") -> Cluster:
    """`{"nodes": [{"gpu_model": NAME, "count": N, "gpus_per_node": 8}, ...]}` as parsed from YAML/JSON."""
    if not isinstance(spec, Mapping):
        raise ClusterFormatError(f"{source}: expected a mapping with a 'nodes' list")
    wrong = unknown_keys(spec, CLUSTER_KEYS)
    if wrong:  # a misspelled key was either "no 'nodes' list" or silently ignored
        raise ClusterFormatError(f"{source}: {wrong}")
    if "nodes" not in spec:
        raise ClusterFormatError(f"{source}: expected a mapping with a 'nodes' list")
    entries = spec["nodes"]
    if not isinstance(entries, list) or not entries:
        raise ClusterFormatError(f"{source}: 'nodes' must be a non-empty list")
    nodes: list[NodeSpec] = []
    for i, entry in enumerate(entries):
        where = f"{source}: nodes[{i}]"
        if not isinstance(entry, Mapping):
            raise ClusterFormatError(f"{where}: expected a mapping with gpu_model and count")
        wrong = unknown_keys(entry, NODE_KEYS)
        if wrong:
            raise ClusterFormatError(f"{where}: {wrong}")
        model = entry.get("gpu_model")
        if not isinstance(model, str) or not model.strip():
            raise ClusterFormatError(f"{where}.gpu_model: required, a GPU model name")
        count = _positive_int(
            entry.get("count", 1), f"{where}.count", MAX_NODES - len(nodes),
            f"takes the cluster past {MAX_NODES:,} nodes, the most a cluster file may hold",
        )  # fmt: skip
        per_node = _positive_int(
            entry.get("gpus_per_node", GPUS_PER_NODE), f"{where}.gpus_per_node", MAX_GPUS_PER_NODE,
            f"is more GPUs than a node may hold here (at most {MAX_GPUS_PER_NODE})",
        )  # fmt: skip
        try:  # a misspelled type would be a pool no job fits: every job rejected, silently
            canonical = known_gpu_name(model)
        except UnknownGpuModel as exc:
            raise ClusterFormatError(f"{where}.gpu_model: {exc}") from None
        start = sum(1 for n in nodes if n.gpu_model == canonical)
        nodes.extend(NodeSpec(f"{canonical}-{start + k}", canonical, per_node) for k in range(count))
    return Cluster(tuple(nodes))


def load_cluster(path: str | Path) -> Cluster:
    from twin.text_files import TextFileError, read_yaml

    path = Path(path)
    try:
        spec = read_yaml(path)
    except TextFileError as exc:
        raise ClusterFormatError(str(exc)) from exc
    return cluster_from_spec(spec, str(path))


SERVING_STATUSES = ("up", "drain")  # a node down serves no job, not even the ones it ran


def cluster_from_inventory(rows: Iterable[tuple[str, str, int, str]]) -> Cluster:
    """From the store's nodes as (node_id, gpu_model, gpu_count, status): the nodes that are up, and those
    that drain (for the jobs running on them), of at most MAX_GPUS_PER_NODE GPUs (`oversized_nodes` names
    the others)."""
    nodes = [
        NodeSpec(node_id, canonical_gpu_name(model), int(count), draining=status == "drain")
        for node_id, model, count, status in rows
        if status in SERVING_STATUSES and 0 < int(count) <= MAX_GPUS_PER_NODE
    ]
    return Cluster(tuple(sorted(nodes, key=lambda n: n.node_id)))


def oversized_nodes(rows: Iterable[tuple[str, str, int, str]]) -> list[tuple[str, int]]:
    """The nodes that are up (or drain) with more GPUs than MAX_GPUS_PER_NODE, as (node_id, gpu_count), by
    id: left out of the cluster. Stored before telemetry bounded the count, a node of 2^31 - 1 GPUs made
    every forecast allocate per GPU until memory ran out; a count that large is a faulty report, not a
    node."""
    return sorted(
        (node_id, int(count)) for node_id, _, count, status in rows
        if status in SERVING_STATUSES and int(count) > MAX_GPUS_PER_NODE
    )  # fmt: skip


def gpu_tdp_watts(gpu_model: str) -> float:
    """Board power of a GPU model in any known spelling; an unknown one draws the catalogue's largest."""
    return gpu_or_unknown(gpu_model).tdp_watts


def _positive_int(value: object, where: str, maximum: int, too_many: str) -> int:
    """`maximum`: for a node count, what is left of MAX_NODES after the entries before it; `too_many`: what
    a number past it is said to do."""
    number = _whole_number(value)
    if number is None or number <= 0:
        raise ClusterFormatError(f"{where}: must be a positive integer, got {value!r}")
    if number > maximum:
        raise ClusterFormatError(f"{where}: {number:,} {too_many}")
    return number


def _whole_number(value: object) -> int | None:
    """An int, or a float with no fraction (YAML reads `8.0` so); None for anything else (bool, inf, NaN)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None
