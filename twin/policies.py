"""Scheduling and placement: which waiting job starts next, and on which nodes.

Placement: a job of up to a node's GPUs (8) runs in ONE node, the best fit (the node with the fewest free
GPUs that still holds it, so large holes stay open for large jobs); a bigger job takes whole free nodes.

Policies, each per GPU pool (a job waits for one GPU type; pools do not block each other):
- FIFO: in arrival order; the first job that does not fit blocks the ones behind it.
- EASY backfill: FIFO, plus jobs behind a blocked head may start now if they do not delay the head's
  reservation (they end, by their estimate, before it, or they stay off the nodes reserved for it).
- SPF (shortest predicted first): in order of predicted run time, the head blocks as in FIFO.
- Conservative backfill (Slurm's backfill): every waiting job holds a reservation, and a job may start early
  only if it delays none of them, not just the head's.

Plain Python lists and dicts: this runs once per simulated event and sets the simulator's speed.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from twin.cluster import Cluster
from twin.gpu_profile import UsageProfile

# How far behind the head EASY looks for jobs to backfill (Slurm's bf_max_job_test plays the same role):
# bounds the cost of one scheduling pass on a long queue.
DEFAULT_BACKFILL_DEPTH = 100

Alloc = tuple[tuple[int, int], ...]  # ((node, gpus), ...)
Started = list[tuple[int, Alloc]]


class Policy(StrEnum):
    FIFO = "fifo"
    BACKFILL = "backfill"
    SPF = "spf"
    CONSERVATIVE = "conservative"


class Placement:
    """Free GPUs per node, indexed for best fit: per pool, nodes bucketed by their free GPU count. A draining
    node is in none of the indexes: it holds the jobs placed on it when the run starts (`take`), and its GPUs
    free up for no one."""

    def __init__(self, cluster: Cluster) -> None:
        pools = cluster.gpu_models
        index = {name: i for i, name in enumerate(pools)}
        self.node_ids = [n.node_id for n in cluster.nodes]
        self.node_pool = [index[n.gpu_model] for n in cluster.nodes]
        self.capacity = [n.gpus for n in cluster.nodes]
        self.draining = [n.draining for n in cluster.nodes]
        self.free = list(self.capacity)
        self.largest = [0] * len(pools)
        self.free_total = [0] * len(pools)
        self.pool_nodes: list[list[int]] = [[] for _ in pools]
        serving = [node for node, draining in enumerate(self.draining) if not draining]
        for node in serving:
            p = self.node_pool[node]
            self.largest[p] = max(self.largest[p], self.capacity[node])
            self.free_total[p] += self.capacity[node]
            self.pool_nodes[p].append(node)
        # dicts as insertion-ordered sets: the choice among equal nodes is deterministic.
        self.buckets: list[list[dict[int, None]]] = [[{} for _ in range(m + 1)] for m in self.largest]
        self.whole: list[dict[int, None]] = [{} for _ in pools]
        for node in serving:
            p = self.node_pool[node]
            self.buckets[p][self.capacity[node]][node] = None
            self.whole[p][node] = None

    def take(self, alloc: Alloc) -> bool:
        """Takes these GPUs of these nodes (where a running job is), or nothing when they are not all free."""
        wanted: dict[int, int] = {}
        for node, gpus in alloc:
            wanted[node] = wanted.get(node, 0) + gpus
        if any(gpus > self.free[node] for node, gpus in wanted.items()):
            return False
        for node, gpus in alloc:
            if self.draining[node]:
                self.free[node] -= gpus
            else:
                self._take(node, self.node_pool[node], gpus)
        return True

    def place(self, pool: int, gpus: int, avoid: set[int] | frozenset[int] | None = None) -> Alloc | None:
        """Takes GPUs for a job and returns where, or None (nothing taken) when it does not fit now."""
        if gpus > self.free_total[pool]:
            return None
        if gpus <= self.largest[pool]:
            buckets = self.buckets[pool]
            for free in range(gpus, len(buckets)):
                bucket = buckets[free]
                if not bucket:
                    continue
                for node in bucket:
                    if avoid is None or node not in avoid:
                        self._take(node, pool, gpus)
                        return ((node, gpus),)
            return None
        chosen: list[int] = []
        total = 0
        for node in self.whole[pool]:
            if avoid is not None and node in avoid:
                continue
            chosen.append(node)
            total += self.capacity[node]
            if total >= gpus:
                for taken in chosen:
                    self._take(taken, pool, self.capacity[taken])
                return tuple((taken, self.capacity[taken]) for taken in chosen)
        return None

    def release(self, alloc: Alloc) -> None:
        for node, gpus in alloc:
            if self.draining[node]:
                self.free[node] += gpus  # for no one
                continue
            pool = self.node_pool[node]
            free = self.free[node]
            del self.buckets[pool][free][node]
            free += gpus
            self.free[node] = free
            self.buckets[pool][free][node] = None
            if free == self.capacity[node]:
                self.whole[pool][node] = None
            self.free_total[pool] += gpus

    def _take(self, node: int, pool: int, gpus: int) -> None:
        free = self.free[node]
        del self.buckets[pool][free][node]
        if free == self.capacity[node]:
            del self.whole[pool][node]
        free -= gpus
        self.free[node] = free
        self.buckets[pool][free][node] = None
        self.free_total[pool] -= gpus


class Scheduler:
    """FIFO per pool. `submit` and `release` return the jobs that start now, with their allocations."""

    def __init__(
        self, placement: Placement, gpus: Sequence[int], pool: Sequence[int], estimate_s: Sequence[float]
    ):
        self.placement = placement
        self.gpus = list(gpus)
        self.pool = list(pool)
        self.estimate = list(estimate_s)
        self.allocs: dict[int, Alloc] = {}
        self.queues: list = [self._new_queue() for _ in placement.largest]

    def _new_queue(self) -> deque[int]:
        return deque()

    def queued(self) -> int:
        return sum(len(q) for q in self.queues)

    def start_now(self, job: int, now: float, where: Alloc | None = None) -> Alloc | None:
        """Places a job that is already running when the simulation starts (it does not queue): on the GPUs
        it runs on (`where`) when they are free, else wherever it fits."""
        if where is not None and self.placement.take(where):
            alloc: Alloc | None = where
        else:
            alloc = self.placement.place(self.pool[job], self.gpus[job])
        if alloc is not None:
            self._started(job, alloc, now)
        return alloc

    def submit(self, job: int, now: float) -> Started:
        self._enqueue(job)
        return self._schedule(self.pool[job], now)

    def submit_waiting(self, jobs: Sequence[int], now: float) -> Started:
        """Jobs that are all waiting at once (a run's start): queued together, then scheduled."""
        for job in jobs:
            self._enqueue(job)
        started: Started = []
        for pool in sorted({self.pool[job] for job in jobs}):
            started += self._schedule(pool, now)
        return started

    def release(self, job: int, now: float) -> Started:
        alloc = self.allocs.pop(job)
        self.placement.release(alloc)
        self._released(job, alloc)
        return self._schedule(self.pool[job], now)

    def _enqueue(self, job: int) -> None:
        self.queues[self.pool[job]].append(job)

    def _head(self, pool: int) -> int:
        return self.queues[pool][0]

    def _pop_head(self, pool: int) -> None:
        self.queues[pool].popleft()

    def _schedule(self, pool: int, now: float) -> Started:
        started: Started = []
        queue = self.queues[pool]
        place = self.placement.place
        while queue:
            job = self._head(pool)
            alloc = place(pool, self.gpus[job])
            if alloc is None:
                break
            self._pop_head(pool)
            self._started(job, alloc, now)
            started.append((job, alloc))
        return started

    def _started(self, job: int, alloc: Alloc, now: float) -> None:
        self.allocs[job] = alloc

    def _released(self, job: int, alloc: Alloc) -> None:
        pass


class SpfScheduler(Scheduler):
    """Shortest predicted first: each pool's queue is a heap on (predicted run time, arrival order)."""

    def _new_queue(self) -> list[tuple[float, int]]:  # type: ignore[override]
        return []

    def _enqueue(self, job: int) -> None:
        heapq.heappush(self.queues[self.pool[job]], (self.estimate[job], job))

    def _head(self, pool: int) -> int:
        return self.queues[pool][0][1]

    def _pop_head(self, pool: int) -> None:
        heapq.heappop(self.queues[pool])


class Backfilling(Scheduler):
    """A scheduler that lets jobs start out of order around the start times it promises: it looks `depth`
    jobs into a pool's queue, and keeps the first start promised to each job (what a run reports)."""

    def __init__(
        self,
        placement: Placement,
        gpus: Sequence[int],
        pool: Sequence[int],
        estimate_s: Sequence[float],
        depth: int = DEFAULT_BACKFILL_DEPTH,
    ) -> None:
        super().__init__(placement, gpus, pool, estimate_s)
        self.depth = depth
        self.first_reservation: dict[int, float] = {}  # job -> the first start time promised to it


class BackfillScheduler(Backfilling):
    """EASY backfill: only the head of the queue is promised a start. The reservation uses the scheduler's
    estimates of when running jobs end."""

    def __init__(self, placement: Placement, *args: Any, **kwargs: Any) -> None:
        super().__init__(placement, *args, **kwargs)
        self.node_jobs: list[dict[int, tuple[float, int]]] = [
            {} for _ in placement.capacity
        ]  # job: (end, gpus)

    def _started(self, job: int, alloc: Alloc, now: float) -> None:
        self.allocs[job] = alloc
        end = now + self.estimate[job]
        for node, gpus in alloc:
            self.node_jobs[node][job] = (end, gpus)

    def _released(self, job: int, alloc: Alloc) -> None:
        for node, _ in alloc:
            del self.node_jobs[node][job]

    def _schedule(self, pool: int, now: float) -> Started:
        started = super()._schedule(pool, now)
        queue = self.queues[pool]
        placement = self.placement
        if len(queue) < 2 or placement.free_total[pool] == 0:
            return started
        head = queue[0]
        reservation: tuple[float, frozenset[int]] | None = None  # computed once a candidate could fit
        taken: list[int] = []
        for position in range(1, min(len(queue), self.depth + 1)):
            free = placement.free_total[pool]
            if free == 0:
                break
            job = queue[position]
            if self.gpus[job] > free:
                continue
            if reservation is None:
                reservation = self._reservation(pool, self.gpus[head], now)
                self.first_reservation.setdefault(head, reservation[0])
            shadow, reserved = reservation
            # Ending (by estimate) before the head's reserved start, it may use any node; otherwise not
            # the nodes held for the head.
            avoid = None if now + self.estimate[job] <= shadow else reserved
            alloc = placement.place(pool, self.gpus[job], avoid)
            if alloc is not None:
                self._started(job, alloc, now)
                started.append((job, alloc))
                taken.append(position)
        for position in reversed(taken):
            del queue[position]
        return started

    def _reservation(self, pool: int, gpus: int, now: float) -> tuple[float, frozenset[int]]:
        """The earliest time the head fits, by the running jobs' estimated ends, and the nodes it needs."""
        placement = self.placement
        if gpus <= placement.largest[pool]:
            best, best_node = float("inf"), -1
            for node in placement.pool_nodes[pool]:
                if placement.capacity[node] < gpus:
                    continue
                free = placement.free[node]
                when = now
                if free < gpus:
                    for end, held in sorted(self.node_jobs[node].values()):
                        free += held
                        if free >= gpus:
                            when = max(end, now)
                            break
                if when < best:
                    best, best_node = when, node
            return best, frozenset((best_node,))
        frees: list[tuple[float, int]] = []
        for node in placement.pool_nodes[pool]:
            jobs = self.node_jobs[node]
            frees.append((max([now, *(end for end, _ in jobs.values())]), node))
        frees.sort()
        total = 0
        chosen: list[int] = []
        for when, node in frees:
            chosen.append(node)
            total += placement.capacity[node]
            if total >= gpus:
                return when, frozenset(chosen)
        return float("inf"), frozenset(chosen)


class ConservativeScheduler(Backfilling):
    """Conservative backfill (Mu'alem and Feitelson, 2001; Slurm's backfill: "lower priority jobs start only
    if they do not delay the expected start of any higher priority job"). Each waiting job holds a
    reservation: the earliest start at which it fits on some node(s) for its estimated run time without
    delaying a reservation made before. A job starts when its reservation is now.

    Every pass walks the queue in arrival order, and each job gives its reservation back and takes the
    earliest one that fits again, the others' in place (compression): jobs that end before their estimate
    pull the queue forward. The job's own old slot is still free then, so with exact estimates a
    reservation never moves later. Jobs deeper in the queue than `depth` wait without one (Slurm's
    bf_max_job_test). Estimates are the scheduler's: a running job is believed to end at its estimate, and
    one that outran it to end at any moment."""

    def __init__(self, placement: Placement, *args: Any, **kwargs: Any) -> None:
        super().__init__(placement, *args, **kwargs)
        self.profiles = [UsageProfile() for _ in placement.capacity]
        self.running: dict[int, tuple[float, float]] = {}  # job -> its promise: (start, estimated end)
        self.reserved: dict[int, tuple[float, Alloc]] = {}  # waiting job -> (reserved start, where)

    def _started(self, job: int, alloc: Alloc, now: float) -> None:
        self.allocs[job] = alloc
        end = now + self.estimate[job]
        self.running[job] = (now, end)
        for node, gpus in alloc:
            self.profiles[node].add(now, end, gpus)

    def _released(self, job: int, alloc: Alloc) -> None:
        start, end = self.running.pop(job)
        for node, gpus in alloc:
            self.profiles[node].add(start, end, -gpus)

    def _schedule(self, pool: int, now: float) -> Started:
        queue = self.queues[pool]
        placement = self.placement
        # Nothing can start while no GPU is free; the reservations are made again at the next pass anyway.
        if not queue or placement.free_total[pool] == 0:
            return []
        for node in placement.pool_nodes[pool]:
            self.profiles[node].prune(now)
        depth = min(len(queue), self.depth)
        for position in range(depth):
            # A reservation that fell due while its GPUs were still held (a job outran its estimate) holds
            # from now on: its job is next on them, and jobs ahead of it are compressed around that.
            job = queue[position]
            held = self.reserved.get(job)
            if held is not None and held[0] < now:
                self._promise(job, *held, -1)
                self.reserved[job] = (now, held[1])
                self._promise(job, now, held[1], 1)
        started: Started = []
        taken: list[int] = []
        for position in range(depth):
            job = queue[position]
            held = self.reserved.pop(job, None)
            if held is not None:
                self._promise(job, *held, -1)
            when, alloc = self._earliest(pool, job, now)
            if alloc is None:
                continue  # more GPUs than the pool has up: it waits, promised nothing
            if when <= now and placement.take(alloc):
                self._started(job, alloc, now)
                started.append((job, alloc))
                taken.append(position)
                continue
            self.reserved[job] = (when, alloc)
            self._promise(job, when, alloc, 1)
            self.first_reservation.setdefault(job, when)
        for position in reversed(taken):
            del queue[position]
        return started

    def _promise(self, job: int, start: float, alloc: Alloc, sign: int) -> None:
        end = start + self.estimate[job]
        for node, gpus in alloc:
            self.profiles[node].add(start, end, sign * gpus)

    def _earliest(self, pool: int, job: int, now: float) -> tuple[float, Alloc | None]:
        """The job's earliest start by the promises, and where: one node for a job that fits in one (of those
        free soonest, one where it can start now if any, the best fit), else whole nodes. The promises
        alone decide: GPUs held past their promise (a job that outran its estimate, or that ends at this
        very instant and is not yet released) are believed free any moment, so a reservation may be now and
        still wait for them."""
        gpus, duration = self.gpus[job], self.estimate[job]
        placement, profiles = self.placement, self.profiles
        nodes = placement.pool_nodes[pool]
        if gpus <= placement.largest[pool]:
            best: tuple[float, bool, int, int] | None = None  # (start, waits for GPUs, free GPUs, node)
            for node in nodes:
                capacity, free = placement.capacity[node], placement.free[node]
                if capacity < gpus:
                    continue
                when = profiles[node].earliest(now, capacity - gpus, duration)
                key = (when, free < gpus, free, node) if when <= now else (when, True, 0, node)
                if best is None or key < best:
                    best = key
            return (best[0], ((best[3], gpus),)) if best is not None else (math.inf, None)
        # Whole nodes: the first moment enough of them are promised to no one all through the run (a node's
        # count can only rise where one of its free stretches begins); at now, those free now first.
        free = {node: profiles[node].free_stretches(now, 0, duration) for node in nodes}
        moments = sorted({begin for stretches in free.values() for begin, _ in stretches})
        for moment in moments:
            room = [
                node for node in nodes
                if any(begin <= moment and moment + duration <= end for begin, end in free[node])
            ]  # fmt: skip
            if moment <= now:
                room.sort(key=lambda node: placement.free[node] < placement.capacity[node])
            chosen: list[int] = []
            total = 0
            for node in room:
                chosen.append(node)
                total += placement.capacity[node]
                if total >= gpus:
                    return moment, tuple((n, placement.capacity[n]) for n in chosen)
        return math.inf, None


def make_scheduler(
    policy: Policy | str,
    placement: Placement,
    gpus: Sequence[int],
    pool: Sequence[int],
    estimate_s: Sequence[float],
    backfill_depth: int = DEFAULT_BACKFILL_DEPTH,
) -> Scheduler:
    policy = Policy(policy)
    if policy is Policy.BACKFILL:
        return BackfillScheduler(placement, gpus, pool, estimate_s, backfill_depth)
    if policy is Policy.SPF:
        return SpfScheduler(placement, gpus, pool, estimate_s)
    if policy is Policy.CONSERVATIVE:
        return ConservativeScheduler(placement, gpus, pool, estimate_s, backfill_depth)
    return Scheduler(placement, gpus, pool, estimate_s)
