"""What one answer weighs, before any prediction: the job as asked, its repair, the placement and
optimization variants, the fewest-GPU ladder and the batch x GPUs x nodes grid, deduplicated into rows."""

from __future__ import annotations

from dataclasses import dataclass

from advisor.candidates import Change, grid, is_moe, nodes_for, repair, with_batch_gpus
from twin.domain import GPUS_PER_NODE, JobConfig, Rule, config_rule, model_params_b

# When the request does not say how much work the job has, run times are for this many tokens (flagged).
DEFAULT_WORK_TOKENS = 1e8
MIN_GPU_LADDER: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32)


class AdviceError(ValueError):
    """A configuration the advisor cannot reason about (the message says why)."""


class Rows:
    """The configurations to predict, deduplicated, each remembered by its index."""

    def __init__(self) -> None:
        self.configs: list[JobConfig] = []
        self._index: dict[JobConfig, int] = {}

    def add(self, config: JobConfig) -> int:
        if config_rule(config) is not None:
            raise AdviceError(f"internal: candidate breaks a rule: {config}")
        found = self._index.get(config)
        if found is None:
            found = self._index[config] = len(self.configs)
            self.configs.append(config)
        return found


@dataclass
class Plan:
    """Everything one answer weighs, before any prediction: the configurations and where each sits."""

    config: JobConfig
    dataset_tokens: float | None
    work: float
    notes: list[str]
    rule: Rule | None
    repaired: JobConfig
    changes: list[Change]
    placed: JobConfig
    tuned: JobConfig
    rows: Rows
    i_asked: int | None
    i_repaired: int | None
    i_placed: int
    i_repaired_nodes: int
    kernels: dict[bool, int]
    roce: dict[bool, int]
    moe: dict[int, int]
    ladder: list[int]
    searched: list[int]


def plan_advice(config: JobConfig, dataset_tokens: float | None) -> Plan:
    if model_params_b(config.model_name) is None:
        notes = [f"model size of {config.model_name!r} unknown: the models use a typical size"]
    else:
        notes = []
    work = dataset_tokens if dataset_tokens is not None else DEFAULT_WORK_TOKENS
    if dataset_tokens is None:
        notes.append(f"no dataset_tokens given: run times, GPU-hours and energy are for {work:,.0f} tokens")

    rule = config_rule(config)
    repaired, changes = repair(config)
    placed = repaired
    if repaired.number_gpus <= GPUS_PER_NODE and repaired.number_nodes > 1:
        placed = repaired.with_changes(number_nodes=1, enable_roce=False)
    elif repaired.number_gpus > GPUS_PER_NODE and repaired.number_gpus % nodes_for(repaired.number_gpus) == 0:
        placed = repaired.with_changes(number_nodes=nodes_for(repaired.number_gpus))
    tuned = placed.with_changes(fast_kernels=True)

    rows = Rows()
    i_asked = rows.add(config) if rule is None else None
    i_repaired = rows.add(repaired) if changes else None
    i_placed = rows.add(placed)
    i_repaired_nodes = rows.add(repaired)
    kernels = {flag: rows.add(placed.with_changes(fast_kernels=flag)) for flag in (False, True)}
    roce = (
        {flag: rows.add(tuned.with_changes(enable_roce=flag)) for flag in (False, True)}
        if tuned.number_nodes > 1
        else {}
    )
    moe_degrees = sorted({0, 1, config.fast_moe} if is_moe(config) else set())
    moe = {
        ep: rows.add(tuned.with_changes(fast_moe=ep))
        for ep in moe_degrees
        if ep == 0 or tuned.number_gpus % ep == 0
    }
    ladder = [
        rows.add(c) for c in with_batch_gpus(tuned.with_changes(fast_moe=moe_choice(tuned)), MIN_GPU_LADDER)
    ]
    searched = [rows.add(c) for c in grid(tuned.with_changes(fast_moe=0))]
    return Plan(
        config, dataset_tokens, work, notes, rule, repaired, changes, placed, tuned, rows,
        i_asked, i_repaired, i_placed, i_repaired_nodes, kernels, roce, moe, ladder, searched,
    )  # fmt: skip


def moe_choice(config: JobConfig) -> int:
    """Experts on one GPU (EP=1) for MoE models, per F6; the ladder and grid then include it."""
    return 1 if is_moe(config) else 0
