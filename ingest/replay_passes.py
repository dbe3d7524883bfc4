"""Where `finetwin up` takes up its replay when the store already holds some of it.

A replay's event ids derive from its seed and job prefix, not from its epoch. So a second `up` on the same
data directory (the per-user default) sent the same events again, dated from its own start, and ingest
dropped every one as a duplicate: nothing new reached the store, and the twin showed the cluster frozen
where the last run had stopped (jobs "running" for ever, a forecast that never moved on).

`choose_start` looks the replay up in the store first:
- **Nothing of it stored:** it starts now, or at the newest telemetry time of the cluster if that is later
  (a replay at `--speed 600` runs ahead of the wall clock, and the twin's clock must not run backwards).
- **Part of it stored, on one timeline:** it resumes. The events the store lacks are sent at the times the
  first run gave them (its epoch recovered from the stored events' times), paced from the first of them.
- **All of it stored, or part of it on another timeline** (the same ids under another `--load` or file):
  the file is replayed again as new jobs, pass k with the job prefix `<prefix><k>-`, as above.

A running `up` goes on after a pass it sent the same way (`first_pass`, `not_before`): the next pass starts
at that one's end. A pinned `--epoch` skips all of this: the caller asked for exactly those events.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from statistics import median

from sqlalchemy import Engine, select

from ingest.events import Event
from ingest.replay import ReplayPlan
from twin.clock import as_utc, telemetry_span
from twin.db import in_chunks
from twin.limits import within_time_window
from twin.retention import job_ends, kept_from, pruned
from twin.store import TERMINAL_STATES, Job, TelemetryEvent

# Stored times of one timeline agree to the microsecond; a second is room for a store that rounds.
SAME_TIMELINE_S = 1.0
# Passes tried before giving up (each one a query of the pass's job ids, ~4,000 for the bundled sample).
MAX_PASSES = 1_000


class NoPassLeft(RuntimeError):
    """No pass can start: MAX_PASSES are in the store, or the next would run past the contract's bound."""


@dataclass(frozen=True)
class ReplayStart:
    plan: ReplayPlan  # what is left to send, `at` counted from its first event (send_replay paces from 0)
    prefix: str  # the pass's job prefix
    job_ids: list[str]  # every job of the pass, sent now or before
    pass_number: int
    stored_before: int  # events of the pass the store held already (0 unless resumed)

    @property
    def resumed(self) -> bool:
        return self.stored_before > 0


def pass_prefix(prefix: str, pass_number: int) -> str:
    """The job prefix of a pass: the prefix itself first, then `<prefix><k>-` (`replay-0-` -> `replay-0-1-`,
    whose job ids `replay-0-1-17` no first-pass id `replay-0-<line>` can equal)."""
    return prefix if pass_number == 0 else f"{prefix}{pass_number}-"


def choose_start(
    plan_for: Callable[[str, datetime], ReplayPlan],
    prefix: str,
    engine: Engine,
    cluster_id: str,
    now: datetime,
    *,
    first_pass: int = 0,
    not_before: datetime | None = None,
) -> ReplayStart:
    """The replay to send: `plan_for(job prefix, epoch)` plans the file's telemetry (the same rows and seed
    every call). `first_pass`: the first pass to consider (`up` going on after a pass it sent, which the
    store may not hold all of yet); `not_before`: the earliest a new pass may start (that pass's end).
    Raises NoPassLeft when MAX_PASSES passes are all in the store, or a new pass would end beyond the
    telemetry contract's bound on event times (whose events ingest would refuse)."""
    first = plan_for(prefix, now)
    rows = [job_id[len(prefix) :] for job_id in job_ids_of(first)]  # each job's row: the pass-free part
    for pass_number in range(first_pass, MAX_PASSES):
        current = pass_prefix(prefix, pass_number)
        job_ids = [current + row for row in rows]
        states = job_states(engine, job_ids)
        if not states:
            _, latest = telemetry_span(engine, cluster_id, now)
            epoch = max(t for t in (now, latest, not_before) if t is not None)
            end = epoch + timedelta(seconds=first.duration_s)  # a plan's span is the same at any epoch
            if not within_time_window(end, now):
                raise NoPassLeft(
                    f"a pass from {epoch.isoformat(timespec='seconds')}, after the telemetry stored, would "
                    f"run to {end.isoformat(timespec='seconds')}, beyond the telemetry contract's bound on "
                    "event times; use a new data directory (FINETWIN_DATA_DIR) or pin --epoch"
                )
            plan = first if (pass_number == 0 and epoch == now) else plan_for(current, epoch)
            return ReplayStart(plan, current, job_ids, pass_number, 0)
        if len(states) == len(job_ids) and TERMINAL_STATES.issuperset(states.values()):
            continue  # this pass ran to its end
        candidate = first if pass_number == 0 else plan_for(current, now)
        resumed = _resume(candidate, current, plan_for, engine, _pruned_rule(engine, cluster_id, job_ids))
        if resumed is not None:
            return ReplayStart(resumed[0], current, job_ids, pass_number, resumed[1])
    raise NoPassLeft(
        f"the store holds {MAX_PASSES} passes of this replay; use another --job-prefix or --seed"
    )


def _pruned_rule(engine: Engine, cluster_id: str, job_ids: list[str]) -> Callable[[Event], bool]:
    """Whether the store pruned an event it lacks (`twin.retention.pruned`), rather than never had it: ingest
    would dead-letter it as `before_retention`, and nothing of it is missing."""
    horizon = kept_from(engine, cluster_id)
    if horizon is None:
        return lambda event: False
    with engine.connect() as connection:
        ended = job_ends(connection, job_ids)
    return lambda event: pruned(event.type, as_utc(event.ts), ended.get(event.job_id or ""), horizon)


def _resume(
    plan: ReplayPlan, prefix: str, plan_for: Callable[[str, datetime], ReplayPlan], engine: Engine,
    pruned: Callable[[Event], bool],
) -> tuple[ReplayPlan, int] | None:  # fmt: skip
    """(the events the store lacks, paced from the first of them; how many it holds) when the stored ones
    are on the timeline of `plan` (the pass `prefix`, at any epoch); None when they are on another, or none is
    missing. An event the store `pruned` is not missing."""
    stored = stored_event_times(engine, [str(event.event_id) for _, event in plan.events])
    shifts = [
        (stored[str(event.event_id)] - as_utc(event.ts)).total_seconds()
        for _, event in plan.events
        if str(event.event_id) in stored
    ]
    if not shifts or max(shifts) - min(shifts) > SAME_TIMELINE_S:
        return None
    plan = plan_for(prefix, plan.epoch + timedelta(seconds=median(shifts)))  # the first run's epoch
    left = [(at, e) for at, e in plan.events if str(e.event_id) not in stored and not pruned(e)]
    if not left:
        return None
    origin = left[0][0]
    paced = [(at - origin, event) for at, event in left]
    return ReplayPlan(paced, plan.epoch + timedelta(seconds=origin), plan.jobs, plan.nodes), len(stored)


def job_states(engine: Engine, job_ids: list[str]) -> dict[str, str]:
    """The stored state of each of these jobs that the store holds."""
    found: dict[str, str] = {}
    with engine.connect() as connection:
        for chunk in in_chunks(job_ids):
            query = select(Job.job_id, Job.state).where(Job.job_id.in_(chunk))  # type: ignore[attr-defined]
            found.update((job_id, state) for job_id, state in connection.execute(query))
    return found


def stored_event_times(engine: Engine, event_ids: list[str]) -> dict[str, datetime]:
    """The event time of each of these events that the store holds."""
    found: dict[str, datetime] = {}
    with engine.connect() as connection:
        for chunk in in_chunks(event_ids):
            query = select(TelemetryEvent.event_id, TelemetryEvent.ts).where(
                TelemetryEvent.event_id.in_(chunk)  # type: ignore[attr-defined]
            )
            found.update((str(event_id), as_utc(ts)) for event_id, ts in connection.execute(query))
    return found


def job_ids_of(plan: ReplayPlan) -> list[str]:
    """The plan's jobs, in the order of their first event."""
    return list(dict.fromkeys(event.job_id for _, event in plan.events if event.job_id is not None))
