"""`finetwin up`'s replay: where it starts (resumed, or the next pass, `ingest.replay_passes`), pass after
pass while `up` runs, and what the store holds of it for `--exit-when-done`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from finetwin.errors import CommandError
from finetwin.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from ingest.replay import ReplayPlan
    from ingest.replay_passes import ReplayStart
    from ingest.worker import IngestWorker, WorkerStats

log = logging.getLogger(__name__)

# The shortest wall time a replay pass takes before the next one starts.
MIN_PASS_WALL_S = 5.0


def replay_start(
    plan_for: Callable[[str, datetime], ReplayPlan], prefix: str, epoch: datetime | None, engine: Engine,
    settings: Settings,
) -> ReplayStart:  # fmt: skip
    """The replay to send: the pinned --epoch's as asked, else where the store's record of it leaves off
    (`ingest.replay_passes`), said in the log when that is not a fresh start."""
    from ingest.replay_passes import NoPassLeft, ReplayStart, choose_start, job_ids_of

    if epoch is not None:
        plan = plan_for(prefix, epoch)
        return ReplayStart(plan, prefix, job_ids_of(plan), 0, 0)
    try:
        start = choose_start(plan_for, prefix, engine, settings.cluster_id, datetime.now(UTC))
    except NoPassLeft as exc:
        raise CommandError(str(exc)) from None
    if start.resumed:
        log.info(
            "resuming the replay where it stopped: %d of its events are in the store, %d to send (jobs %s*)",
            start.stored_before, len(start.plan.events), start.prefix,
        )  # fmt: skip
    elif start.pass_number > 0:
        log.info(
            "the store holds this replay already: replaying the file again as new jobs %s*, from %s",
            start.prefix, start.plan.epoch.isoformat(timespec="seconds"),
        )  # fmt: skip
    return start


def send_passes(
    start: ReplayStart,
    send: Callable[[ReplayStart], None],
    next_pass: Callable[[ReplayStart], ReplayStart | None],
    passes: int,
    stop: threading.Event,
) -> int:
    """Send `start`, then pass after pass (`passes` in all; 0: until stopped or `next_pass` has none), each
    taking at least MIN_PASS_WALL_S of wall time. Returns how many passes were sent."""
    sent = 0
    while True:
        began = time.monotonic()
        send(start)
        sent += 1
        if sent == passes or not start.job_ids:  # a file without rows: nothing to go on with
            return sent
        # A file of a few short jobs would otherwise start pass after pass as fast as it can plan them.
        if stop.wait(max(0.0, MIN_PASS_WALL_S - (time.monotonic() - began))):
            return sent
        following = next_pass(start)
        if following is None:
            return sent
        start = following


def next_pass(
    plan_for: Callable[[str, datetime], ReplayPlan], prefix: str, previous: ReplayStart, engine: Engine,
    settings: Settings,
) -> ReplayStart | None:  # fmt: skip
    """The pass after `previous`, from its end on (the store may not hold all of it yet); None where no pass
    is left (`ingest.replay_passes.NoPassLeft`: the timeline would run past the telemetry contract's bound,
    or the store holds MAX_PASSES)."""
    from ingest.replay_passes import NoPassLeft, choose_start

    end = end_of(previous.plan)
    try:
        start = choose_start(
            plan_for, prefix, engine, settings.cluster_id, datetime.now(UTC),
            first_pass=previous.pass_number + 1, not_before=end,
        )  # fmt: skip
    except NoPassLeft as exc:
        log.warning("the replay stops (the API and the twin go on serving): %s", exc)
        return None
    log.info(
        "replay pass %d: the file again as new jobs %s*, from %s",
        start.pass_number, start.prefix, start.plan.epoch.isoformat(timespec="seconds"),
    )  # fmt: skip
    return start


def end_of(plan: ReplayPlan) -> datetime:
    """When the plan's last event is dated."""
    return plan.epoch + timedelta(seconds=plan.duration_s)


def ahead_of_now(plan: ReplayPlan) -> timedelta:
    """How far ahead of the wall clock the plan's last event is dated, and ten minutes' room."""
    return max(end_of(plan) - datetime.now(UTC), timedelta(0)) + timedelta(minutes=10)


def settings_for_replay(settings: Settings, plan: ReplayPlan) -> Settings:
    # The replay's timeline runs ahead of the wall clock (by up to its whole span at --speed 0, and more when
    # it starts after an earlier replay's end): up's own worker takes the replay's clock as the cluster's. A
    # separate `finetwin ingest` keeps FINETWIN_MAX_CLOCK_SKEW for replays it did not start.
    ahead = ahead_of_now(plan)
    settings = settings.model_copy(update={"max_clock_skew": max(settings.max_clock_skew, ahead)})
    if "forecast_policy" not in settings.model_fields_set:
        # The replayed cluster schedules greedily (a job starts wherever its GPUs free up first, small ones
        # passing big ones): the twin's closest policy is backfill. Measured by bench/fidelity.py's live
        # scoring: queue-length bias +0.33 under fifo, +0.03 under backfill.
        settings = settings.model_copy(update={"forecast_policy": "backfill"})
    return settings


def wait_until_stored(plan: ReplayPlan, worker: IngestWorker, engine: Engine, stop: threading.Event) -> bool:
    """Block until every event of the replay is in the store (False if `stop` came first). Woken by the
    worker after each batch; the store has the last word, as the worker may also count other messages."""
    from ingest.replay_passes import stored_event_times

    ids = [str(event.event_id) for _, event in plan.events]

    def handled(stats: WorkerStats) -> int:
        return stats.applied + stats.duplicates + stats.dead_letters

    worker.wait_until(lambda s: handled(s) >= len(ids) or stop.is_set())
    while not stop.is_set():
        seen = handled(worker.stats)
        if len(stored_event_times(engine, ids)) == len(ids):
            return True
        worker.wait_until(lambda s, seen=seen: handled(s) > seen or stop.is_set(), timeout_s=5)
    return False


def replayed_job_counts(engine: Engine, job_ids: list[str]) -> dict[str, int]:
    """These jobs as the store holds them, in all and by outcome."""
    from sqlalchemy import func, select

    from twin.db import in_chunks
    from twin.store import Job

    counts = {"jobs": 0, "valid": 0, "rejected": 0, "runtime": 0}
    with engine.connect() as connection:
        for chunk in in_chunks(job_ids):
            query = select(Job.outcome, func.count()).where(Job.job_id.in_(chunk)).group_by(Job.outcome)  # type: ignore[attr-defined]
            for outcome, count in connection.execute(query):
                counts["jobs"] += count
                if outcome in counts:
                    counts[outcome] += count
    return counts
