"""The configurations the advisor weighs for one job: the job as asked, its repair, and the grid of batch x
GPUs x nodes (with the optimization variants) it searches for the fewest GPUs, the best throughput and
the best cost. Pure functions of the configuration: no models here.
"""

from __future__ import annotations

from dataclasses import dataclass

from twin.domain import (
    GPUS_PER_NODE,
    MOE_MODELS,
    JobConfig,
    Rule,
    config_rule,
    nearest_multiple,
    nodes_dividing,
)

BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)  # the benchmark's sweep
GPU_COUNTS: tuple[int, ...] = (1, 2, 4, 8, 16, 32)  # up to 4 nodes of 8, as in the benchmark
MAX_GPUS = 32


@dataclass(frozen=True)
class Change:
    field: str
    old: object
    new: object
    why: str


def is_moe(config: JobConfig) -> bool:
    return config.model_name in MOE_MODELS or "moe" in config.model_name.lower()


def nodes_for(gpus: int) -> int:
    """Placement: up to 8 GPUs stay in one node; beyond, full nodes of 8."""
    return max(1, -(-gpus // GPUS_PER_NODE))


def repair(config: JobConfig) -> tuple[JobConfig, list[Change]]:
    """The nearest configuration that passes the actuator's rules, and what changed (empty if none).

    Rules in the paper's order: GPUs must divide the batch (round the batch to the nearest multiple of the
    GPUs), the expert-parallel degree must divide the GPUs (the nearest GPU count it divides, then the batch
    again), the nodes must divide the GPUs (the fewest nodes of at most 8 GPUs that divide them).
    """
    changes: list[Change] = []
    fixed = config
    for _ in range(4):  # each fix can only create a later rule's problem; four passes settle any config
        rule = config_rule(fixed)
        if rule is None:
            break
        if rule is Rule.BATCH_NOT_MULTIPLE_OF_GPUS:
            batch = nearest_multiple(fixed.batch_size, fixed.number_gpus)
            changes.append(Change("batch_size", fixed.batch_size, batch, f"the batch must be a multiple of "
                                  f"the {fixed.number_gpus} GPUs"))  # fmt: skip
            fixed = fixed.with_changes(batch_size=batch)
        elif rule is Rule.GPUS_NOT_MULTIPLE_OF_EXPERT_PARALLEL:
            gpus = nearest_multiple(fixed.number_gpus, fixed.fast_moe)
            changes.append(Change("number_gpus", fixed.number_gpus, gpus, f"the expert-parallel degree "
                                  f"{fixed.fast_moe} must divide the GPUs"))  # fmt: skip
            fixed = fixed.with_changes(number_gpus=gpus)
        else:
            nodes = nodes_dividing(fixed.number_gpus, fixed.number_nodes)
            changes.append(Change("number_nodes", fixed.number_nodes, nodes, f"the nodes must divide the "
                                  f"{fixed.number_gpus} GPUs, at most {GPUS_PER_NODE} per node"))  # fmt: skip
            fixed = fixed.with_changes(number_nodes=nodes)
    return fixed, changes


def grid(base: JobConfig) -> list[JobConfig]:
    """Batch x GPUs (x RoCE for multi-node, x Fast MoE for MoE models) with the job's model, method, GPU
    type and sequence length, fast kernels on, placed by `nodes_for`; only configurations the rules admit."""
    moe_options = (0, 1) if is_moe(base) else (0,)
    out: list[JobConfig] = []
    for gpus in GPU_COUNTS:
        nodes = nodes_for(gpus)
        for batch in BATCH_SIZES:
            if batch % gpus:
                continue
            for roce in (False, True) if nodes > 1 else (False,):
                for ep in moe_options:
                    out.append(
                        base.with_changes(
                            number_gpus=gpus, number_nodes=nodes, batch_size=batch,
                            enable_roce=roce, fast_moe=ep, fast_kernels=True,
                        )
                    )  # fmt: skip
    return out


def with_batch_gpus(base: JobConfig, gpu_counts: tuple[int, ...] = GPU_COUNTS) -> list[JobConfig]:
    """The job's own batch on each GPU count that divides it (for the fewest GPUs: the batch is the
    user's training choice, so right-sizing the GPUs keeps it)."""
    out = []
    for gpus in gpu_counts:
        if base.batch_size % gpus or (base.fast_moe and gpus % base.fast_moe):
            continue
        nodes = nodes_for(gpus)
        out.append(base.with_changes(number_gpus=gpus, number_nodes=nodes, enable_roce=nodes > 1))
    return out
