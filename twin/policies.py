"""Scheduling and placement: which waiting job starts next, and on which nodes.

Placement: a job of up to a node's GPUs (8) runs in ONE node, the best fit (the node with the fewest free
GPUs that still holds it, so large holes stay open for large jobs); a bigger job takes whole free nodes.

Policies, each per GPU pool (a job waits for one GPU type; pools do not block each other):
- FIFO: in arrival order; the first job that does not fit blocks the ones behind it.
- EASY backfill: FIFO, plus jobs behind a blocked head may start now if they do not delay the head's
  reservation (they end, by their estimate, before it, or they stay off the nodes reserved for it).
- SPF (shortest predicted first): in order of predicted run time, the head blocks as in FIFO.

Plain Python lists and dicts: this runs once per simulated event and sets the simulator's speed.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from enum import StrEnum

from twin.cluster import Cluster

# How far behind the head EASY looks for jobs to backfill (Slurm's bf_max_job_test plays the same role):
# bounds the cost of one scheduling pass on a long queue.
DEFAULT_BACKFILL_DEPTH = 100

Alloc = tuple[tuple[int, int], ...]  # ((node, gpus), ...)
Started = list[tuple[int, Alloc]]


class Policy(StrEnum):
    FIFO = "fifo"
    BACKFILL = "backfill"
    SPF = "spf"


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


class BackfillScheduler(Scheduler):
    """EASY backfill. The reservation uses the scheduler's estimates of when running jobs end."""

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
        self.node_jobs: list[dict[int, tuple[float, int]]] = [
            {} for _ in placement.capacity
        ]  # job: (end, gpus)
        self.first_reservation: dict[int, float] = {}  # job -> the first start time promised to it as head

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
    return Scheduler(placement, gpus, pool, estimate_s)
