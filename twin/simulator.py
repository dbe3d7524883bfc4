"""The discrete-event simulation of the cluster, on SimPy.

The environment is passed in (never global) and time moves from event to event: an arrival, a job's end.
One generator process walks the arrivals in order; a started job is a SimPy timeout whose callback ends
it (a completion or a runtime failure) and lets the scheduler start the next ones. A process per job would
read the same but cost three events per job instead of one, and the simulator must replay a week of a
512-GPU cluster (100k jobs) in seconds.

Every job ends exactly once: rejected at arrival, or completed, or failed at runtime; a run stopped at a
horizon leaves the rest queued or running (outcome PENDING, with or without a start time).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import simpy
from simpy.events import Timeout

from twin.cluster import Cluster
from twin.plan import JobPlan, Reject
from twin.policies import (
    DEFAULT_BACKFILL_DEPTH,
    Alloc,
    Backfilling,
    Placement,
    Policy,
    make_scheduler,
)


class End(IntEnum):
    PENDING = 0  # not ended when the simulation stopped (queued, or running)
    COMPLETED = 1
    FAILED = 2  # failed at runtime, after burning its GPU time
    REJECTED = 3  # never ran: the actuator's rules, admission control, or no GPU of its type

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass
class SimResult:
    """Per job, in the plan's (arrival) order."""

    start_s: np.ndarray  # NaN: never started
    end_s: np.ndarray  # NaN: not ended
    outcome: np.ndarray  # End codes
    alloc_gpus: np.ndarray  # GPUs held while running (whole nodes for a multi-node job)
    until_s: float  # where the clock stopped (the horizon, or the last event)
    placements: list[Alloc | None] | None = None  # (node, gpus) per job, when asked for
    reservations: dict[int, float] | None = None  # backfill: each job's first promised start, when it had one


class Simulator:
    def __init__(
        self,
        env: simpy.Environment,
        cluster: Cluster,
        plan: JobPlan,
        policy: Policy | str = Policy.FIFO,
        *,
        backfill_depth: int = DEFAULT_BACKFILL_DEPTH,
        record_placements: bool = False,
    ) -> None:
        if plan.pools != cluster.gpu_models:
            raise ValueError("the plan was built for another cluster")
        self.env = env
        self.plan = plan
        self.placement = Placement(cluster)
        self.node_index = {node_id: node for node, node_id in enumerate(self.placement.node_ids)}
        self.scheduler = make_scheduler(
            policy,
            self.placement,
            plan.gpus.tolist(),
            plan.pool.tolist(),
            plan.estimate_s.tolist(),
            backfill_depth,
        )
        n = len(plan)
        self.hold = plan.hold_s.tolist()
        self.fails = plan.fails.tolist()
        self.start = [float("nan")] * n
        self.end = [float("nan")] * n
        self.outcome = [End.PENDING.value] * n
        self.alloc_gpus = [0] * n
        self.placements: list[Alloc | None] | None = [None] * n if record_placements else None

    def run(self, until: float | None = None) -> SimResult:
        env, plan = self.env, self.plan
        for job in np.flatnonzero(~np.isnan(plan.elapsed_s) & (plan.reject == Reject.NONE)).tolist():
            # Already running when the simulation starts: placed first, before anything queued, where it runs.
            alloc = self.scheduler.start_now(job, env.now, self._where(job))
            if alloc is not None:
                self._launch(job, alloc, env.now - float(plan.elapsed_s[job]))
        env.process(self._arrivals())
        env.run(until=until)
        return SimResult(
            start_s=np.asarray(self.start),
            end_s=np.asarray(self.end),
            outcome=np.asarray(self.outcome, dtype=np.int8),
            alloc_gpus=np.asarray(self.alloc_gpus, dtype=np.int64),
            until_s=float(env.now),
            placements=self.placements,
            reservations=dict(self.scheduler.first_reservation)
            if isinstance(self.scheduler, Backfilling)
            else None,
        )

    def _where(self, job: int) -> Alloc | None:
        """The GPUs a running job holds, its GPUs split evenly over the nodes telemetry named (the first
        ones take the remainder); None when it named none, or one the cluster does not have in its pool."""
        named = self.plan.nodes.get(job)
        if not named:
            return None
        index = self.node_index
        nodes = [index.get(node_id, -1) for node_id in named]
        pool = int(self.plan.pool[job])
        if -1 in nodes or any(self.placement.node_pool[node] != pool for node in nodes):
            return None
        share, extra = divmod(int(self.plan.gpus[job]), len(nodes))
        return tuple((node, share + (k < extra)) for k, node in enumerate(nodes) if share + (k < extra))

    def _arrivals(self) -> Iterator[simpy.Event]:
        env = self.env
        arrival = self.plan.arrival_s.tolist()
        reject = self.plan.reject.tolist()
        placed = {job for job, start in enumerate(self.start) if start == start}  # running at t=0
        submit, launch, timeout = self.scheduler.submit, self._launch, env.timeout
        # The jobs already waiting when the run starts join the queue together, before any is scheduled:
        # one at a time, the first would start ahead of any that ranks before it (a shorter one under SPF).
        first = bisect.bisect_right(arrival, env.now)  # the plan is in arrival order
        waiting = [job for job in range(first) if not (placed and job in placed)]
        for job in waiting:
            if reject[job]:
                self._refuse(job, env.now)
        waiting = [job for job in waiting if not reject[job]]
        for started, alloc in self.scheduler.submit_waiting(waiting, env.now):
            launch(started, alloc, env.now)
        for job in range(first, len(arrival)):
            if placed and job in placed:
                continue
            t = arrival[job]
            now = env.now
            if t > now:
                yield timeout(t - now)
                now = env.now
            if reject[job]:
                self._refuse(job, now)
                continue
            for started, alloc in submit(job, now):
                launch(started, alloc, now)

    def _refuse(self, job: int, now: float) -> None:
        self.end[job] = now
        self.outcome[job] = End.REJECTED.value

    def _launch(self, job: int, alloc: Alloc, started_at: float) -> None:
        self.start[job] = started_at
        self.alloc_gpus[job] = alloc[0][1] if len(alloc) == 1 else sum(g for _, g in alloc)
        if self.placements is not None:
            self.placements[job] = alloc
        event = Timeout(self.env, self.hold[job], job)
        event.callbacks.append(self._ended)

    def _ended(self, event: simpy.Event) -> None:
        job: int = event.value
        now = self.env.now
        self.end[job] = now
        self.outcome[job] = End.FAILED.value if self.fails[job] else End.COMPLETED.value
        for started, alloc in self.scheduler.release(job, now):
            self._launch(started, alloc, now)


def simulate(
    cluster: Cluster,
    plan: JobPlan,
    policy: Policy | str = Policy.FIFO,
    until: float | None = None,
    *,
    env: simpy.Environment | None = None,
    backfill_depth: int = DEFAULT_BACKFILL_DEPTH,
    record_placements: bool = False,
) -> SimResult:
    """One run of the plan on the cluster (a fresh environment starting at 0 unless one is given)."""
    simulator = Simulator(
        env or simpy.Environment(),
        cluster,
        plan,
        policy,
        backfill_depth=backfill_depth,
        record_placements=record_placements,
    )
    return simulator.run(until)
