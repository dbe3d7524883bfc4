"""The API's capacity plans: queued and run one at a time by the process that was asked, and kept in the
store (`advisor.records.CapacityPlanRecord`), so that a plan, its progress and its result outlive that process
and every API process of the store answers about it.

Why in the store: a plan takes minutes (on Ray, a large sweep longer), and the recommendation made from it
names it (`effect.plan_id`). In the API's memory a restart (a deploy, a crash) forgot it: the dashboard's
plan was gone, and an approver who followed a capacity recommendation to its plan found a 404.

A plan queued or running belongs to the process that took it, which writes its progress every HEARTBEAT_S:
that is also how the others know it is alive. One whose process stopped without saying so (kill -9, a lost
machine) is reported failed once it has not been heard of for LOST_AFTER_S; a process that stops cleanly
fails its own unfinished plans, saying why (`close`).

A plan is of the cluster its API serves (FINETWIN_CLUSTER_ID): the APIs of other clusters on the same store
neither list it nor find it, so none recommends one cluster's plan for another.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from fastapi import HTTPException
from pydantic import BaseModel
from sqlalchemy import Engine, delete, update
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, col, select

from advisor.records import CapacityPlanRecord
from advisor.timestamps import as_utc
from twin.db import session_scope
from twin.store import utcnow

log = logging.getLogger("finetwin.plan")

MAX_KEPT = 100  # plans the store keeps of each cluster (the newest), and GET /v1/plan lists
# Plans waiting behind the running one. Each may be minutes of every core and none can be cancelled, so a
# client in a loop could queue hours of work; beyond this many a new plan is a 429. A constant rather than a
# setting: four plans queued is ~12 minutes of work at the largest, and a queue of them helps nobody.
MAX_QUEUED_PLANS = 4
PLAN_QUEUE_FULL = 429
# When to try again: about the time the largest plan allowed takes, by when one of the queued plans has
# usually started.
PLAN_QUEUE_RETRY_S = 60
# How often a process writes the progress of its unfinished plans, and how long the others wait without news
# before they call one lost: six missed writes, far beyond a busy database's pause.
HEARTBEAT_S = 10.0
LOST_AFTER_S = 60.0

PlanStatus = Literal["queued", "running", "done", "failed"]
UNFINISHED = ("queued", "running")


class PlanOut(BaseModel):
    id: str
    status: PlanStatus
    created_at: datetime
    progress: dict[str, int]
    result: dict[str, Any] | None = None
    error: str | None = None


@dataclass
class PlanJob:
    id: str
    created_at: datetime
    total: int
    status: PlanStatus = "queued"
    done: int = 0
    result: dict[str, Any] | None = None
    error: str | None = None

    def out(self, with_result: bool = True) -> PlanOut:
        return PlanOut(
            id=self.id,
            status=self.status,
            created_at=self.created_at,
            progress={"done": self.done, "total": self.total},
            result=self.result if with_result else None,
            error=self.error,
        )


class PlanJobs:
    """This process's plans (one worker thread runs them in order) over the store's record of every plan of
    the cluster."""

    def __init__(self, engine: Engine, cluster_id: str) -> None:
        self.engine = engine
        self.cluster_id = cluster_id
        # This process's plans the store may not hold as they are: the unfinished (the live objects its
        # worker updates) and the finished whose last write failed. A plan leaves once written as finished.
        self.jobs: dict[str, PlanJob] = {}
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="finetwin-plan")
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._closed = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def add(self, job: PlanJob) -> None:
        """Queue `job` and record it, or refuse it with a 429 when MAX_QUEUED_PLANS wait in this process
        already (checked under the lock, so that plans posted at once cannot all slip under the limit)."""
        with self.lock:
            queued = sum(1 for j in self.jobs.values() if j.status == "queued")
            if queued >= MAX_QUEUED_PLANS:
                raise HTTPException(
                    PLAN_QUEUE_FULL,
                    f"{queued} capacity plans are queued already (at most {MAX_QUEUED_PLANS} wait behind the "
                    "one running, and plans cannot be cancelled): wait for one to start (GET /v1/plan) and "
                    "post this one again",
                    headers={"Retry-After": str(PLAN_QUEUE_RETRY_S)},
                )
            self.jobs[job.id] = job
        try:
            self._insert(job)
        except BaseException:
            with self.lock:
                self.jobs.pop(job.id, None)  # not recorded: not queued either
            raise
        if job.status in UNFINISHED:
            self._start_heartbeat()
        else:  # recorded as it ends (a plan made elsewhere): the store holds all of it
            with self.lock:
                self.jobs.pop(job.id, None)

    def save(self, job: PlanJob) -> None:
        """Record what `job` is now (a start, its end); a write that fails is tried again by the heartbeat."""
        self._write([job])

    def _write(self, jobs: list[PlanJob]) -> None:
        """Record the plans as they are now; those written as finished leave this process's memory. A write
        the store refuses leaves them there, for the next heartbeat."""
        written = [(job.id, _as_it_is(job)) for job in jobs]  # as of now: the worker may move a plan on
        try:
            self._update(written)
        except SQLAlchemyError as exc:  # the store away for a moment: written again by the next heartbeat
            log.warning("capacity plans: could not record %d of them: %s", len(jobs), exc)
            return
        with self.lock:
            for plan_id, fields in written:
                if fields["status"] not in UNFINISHED:
                    self.jobs.pop(plan_id, None)

    def _to_write(self) -> list[PlanJob]:
        with self.lock:
            return list(self.jobs.values())

    def get(self, plan_id: str) -> PlanJob:
        with self.lock:
            job = self.jobs.get(plan_id)
        if job is None:
            with Session(self.engine) as session:
                row = session.get(CapacityPlanRecord, plan_id)
                job = _job(row, utcnow()) if row is not None and row.cluster_id == self.cluster_id else None
        if job is None:
            raise HTTPException(
                404,
                f"no plan {plan_id!r} in cluster {self.cluster_id!r} (the store keeps its newest {MAX_KEPT})",
            )
        return job

    def newest(self) -> list[PlanJob]:
        """Every process's plans of the cluster, newest first, without their results (up to MAX_KEPT of
        ~100 KB each, not read for a list the dashboard polls); this process's as they are now."""
        now = utcnow()
        table = CapacityPlanRecord.__table__
        query = (
            select(*(c for c in table.columns if c.name != "result"))  # type: ignore[attr-defined]
            .where(col(CapacityPlanRecord.cluster_id) == self.cluster_id)
            .order_by(col(CapacityPlanRecord.created_at).desc())
            .limit(MAX_KEPT)
        )
        with Session(self.engine) as session:
            found = {row.id: _job(row, now) for row in session.execute(query)}
        with self.lock:
            found.update((job_id, job) for job_id, job in self.jobs.items() if job_id in found)
        return list(found.values())

    def close(self) -> None:
        """After the worker stopped: this process's unfinished plans (queued ones it cancelled) are failed,
        saying why, and the record holds every plan as it ended."""
        self._closed.set()
        ended = self._to_write()
        for job in ended:
            if job.status in UNFINISHED:
                when = "started" if job.status == "queued" else "finished"
                job.status, job.error = "failed", f"stopped: the API stopped before the plan {when}"
        if ended:
            self._write(ended)

    def _insert(self, job: PlanJob) -> None:
        now = utcnow()
        with session_scope(self.engine) as session:
            session.add(
                CapacityPlanRecord(
                    id=job.id,
                    cluster_id=self.cluster_id,
                    created_at=job.created_at,
                    updated_at=now,
                    owner=self.owner,
                    **_as_it_is(job),
                )  # fmt: skip
            )
            session.flush()
            # The cluster's newest MAX_KEPT stay, and any plan another process may still be running. Another
            # cluster's plans are its API's to prune.
            of_cluster = col(CapacityPlanRecord.cluster_id) == self.cluster_id
            keep = (
                select(CapacityPlanRecord.id)
                .where(of_cluster)
                .order_by(col(CapacityPlanRecord.created_at).desc())
            )
            alive = col(CapacityPlanRecord.status).in_(UNFINISHED) & (
                col(CapacityPlanRecord.updated_at) > now - timedelta(seconds=LOST_AFTER_S)
            )
            session.execute(
                delete(CapacityPlanRecord).where(
                    of_cluster,
                    col(CapacityPlanRecord.id).not_in(keep.limit(MAX_KEPT).scalar_subquery()),
                    ~alive,
                )
            )

    def _update(self, written: list[tuple[str, dict[str, Any]]]) -> None:
        now = utcnow()
        with session_scope(self.engine) as session:
            for plan_id, fields in written:
                session.execute(
                    update(CapacityPlanRecord)
                    .where(col(CapacityPlanRecord.id) == plan_id)
                    .values(updated_at=now, **fields)
                )

    def _start_heartbeat(self) -> None:
        with self.lock:
            if self._heartbeat is not None or self._closed.is_set():
                return
            self._heartbeat = threading.Thread(target=self._beat, name="finetwin-plan-heartbeat", daemon=True)
        self._heartbeat.start()

    def _beat(self) -> None:
        while not self._closed.wait(HEARTBEAT_S):
            due = self._to_write()
            if due:
                self._write(due)


def _as_it_is(job: PlanJob) -> dict[str, Any]:
    """What a plan's record holds of its job as the job is now."""
    return {
        "status": job.status, "done": job.done, "total": job.total, "result": job.result, "error": job.error,
    }  # fmt: skip


def _job(row: Any, now: datetime) -> PlanJob:
    """A recorded plan (a record, or a row of its columns without `result`) as a job; an unfinished one
    whose process has not written for LOST_AFTER_S, failed."""
    job = PlanJob(
        id=row.id, created_at=as_utc(row.created_at), total=row.total, status=row.status, done=row.done,
        result=getattr(row, "result", None), error=row.error,
    )  # fmt: skip
    heard = as_utc(row.updated_at)
    if job.status in UNFINISHED and now - heard > timedelta(seconds=LOST_AFTER_S):
        job.status = "failed"
        job.error = (
            f"lost: the API process that ran it ({row.owner}) stopped without finishing it; last heard of "
            f"{heard.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
        )
    return job
