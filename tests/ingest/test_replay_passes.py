"""Where `finetwin up` takes up a replay the store already holds some of (`ingest.replay_passes`), on a real
store of each backend: resumed on its own timeline, replayed as new jobs once finished, never resumed onto
another timeline."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest
from sqlalchemy import Engine, select

from ingest.apply import apply_events
from ingest.replay import ReplayPlan, plan_replay
from ingest.replay_passes import choose_start, job_states, pass_prefix, stored_event_times

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
PREFIX = "pass-test-"


@pytest.fixture(scope="module")
def rows(sample_table: pd.DataFrame) -> pd.DataFrame:
    return sample_table.iloc[:80].reset_index(drop=True)  # every outcome among them, and fast to plan


def planner(rows: pd.DataFrame, load: float = 0.5) -> Callable[[str, datetime], ReplayPlan]:
    def plan_for(prefix: str, epoch: datetime) -> ReplayPlan:
        return plan_replay(rows, seed=3, job_prefix=prefix, epoch=epoch, target_utilization=load)

    return plan_for


def store(engine: Engine, plan: ReplayPlan, count: int | None = None) -> None:
    apply_events(engine, [event for _, event in plan.events[:count]])


def ids(plan: ReplayPlan) -> list[str]:
    return [str(event.event_id) for _, event in plan.events]


def test_a_store_without_the_replay_starts_its_first_pass_now(engine: Engine, rows: pd.DataFrame) -> None:
    start = choose_start(planner(rows), PREFIX, engine, "default", NOW)
    assert (start.pass_number, start.prefix, start.stored_before) == (0, PREFIX, 0)
    assert start.plan.epoch == NOW and start.plan.events[0][0] == 0.0
    assert ids(start.plan) == ids(planner(rows)(PREFIX, NOW))
    assert set(start.job_ids) == {f"{PREFIX}{int(line)}" for line in rows["line"]}


def test_an_interrupted_replay_resumes_where_it_stopped_on_its_own_timeline(
    engine: Engine, rows: pd.DataFrame
) -> None:
    first_run = planner(rows)(PREFIX, NOW - timedelta(hours=3))
    cut = len(first_run.events) * 2 // 5
    store(engine, first_run, cut)

    start = choose_start(planner(rows), PREFIX, engine, "default", NOW)

    assert (start.pass_number, start.stored_before) == (0, cut)
    rest = first_run.events[cut:]
    assert ids(start.plan) == [str(event.event_id) for _, event in rest]
    # The first run's times, not the second start's: the timeline goes on where it stopped.
    assert [event.ts for _, event in start.plan.events] == [event.ts for _, event in rest]
    assert start.plan.events[0][0] == 0.0  # paced from the first event left, not from the first run's start
    assert start.plan.epoch + timedelta(seconds=start.plan.events[-1][0]) == first_run.epoch + timedelta(
        seconds=first_run.events[-1][0]
    )
    store(engine, start.plan)
    states = job_states(engine, start.job_ids)
    assert len(states) == len(rows) and set(states.values()) <= {"completed", "failed", "rejected"}


def test_a_finished_replay_is_played_again_as_new_jobs_after_the_newest_telemetry(
    engine: Engine, rows: pd.DataFrame
) -> None:
    ahead = planner(rows)(PREFIX, NOW + timedelta(days=2))  # a run at --speed 0 dates its events ahead
    store(engine, ahead)
    newest = max(event.ts for _, event in ahead.events)

    start = choose_start(planner(rows), PREFIX, engine, "default", NOW)

    assert (start.pass_number, start.prefix, start.stored_before) == (1, pass_prefix(PREFIX, 1), 0)
    assert start.plan.epoch == newest  # the twin's clock never runs backwards
    assert not set(start.job_ids) & {event.job_id for _, event in ahead.events}
    assert not stored_event_times(engine, ids(start.plan))
    store(engine, start.plan)
    assert choose_start(planner(rows), PREFIX, engine, "default", NOW).prefix == f"{PREFIX}2-"


def test_the_same_ids_on_another_timeline_are_not_resumed(engine: Engine, rows: pd.DataFrame) -> None:
    """Another --load gives the same event ids at other times: sending the rest of this plan would mix two
    timelines in one pass, so the file is played again as new jobs."""
    other = planner(rows, load=0.9)(PREFIX, NOW - timedelta(hours=3))
    store(engine, other, len(other.events) // 2)

    start = choose_start(planner(rows), PREFIX, engine, "default", NOW)

    assert (start.pass_number, start.stored_before) == (1, 0)
    assert len(start.plan.events) == len(planner(rows)(PREFIX, NOW).events)


def test_the_next_pass_of_a_running_up_starts_at_the_last_ones_end(
    engine: Engine, rows: pd.DataFrame
) -> None:
    """`up` going on after a pass it has just sent: the store may hold only part of that pass yet, which is
    not to be resumed (it is being ingested), and the next pass starts at its end, not at the newest event
    stored so far."""
    sent = planner(rows)(PREFIX, NOW)
    store(engine, sent, len(sent.events) // 3)
    end = sent.epoch + timedelta(seconds=sent.duration_s)

    start = choose_start(planner(rows), PREFIX, engine, "default", NOW, first_pass=1, not_before=end)

    assert (start.pass_number, start.prefix, start.stored_before) == (1, f"{PREFIX}1-", 0)
    assert start.plan.epoch == end


def test_a_resumed_replay_does_not_send_again_what_the_store_pruned(
    engine: Engine, rows: pd.DataFrame
) -> None:
    """Pruned (`twin.retention`), the events of the pass's jobs that ended before the horizon and its node
    reports are not missing: ingest would dead-letter them. An event from before the horizon of a job that
    ended after it is missing (a prune keeps it), and is sent."""
    from sqlalchemy import delete

    from twin.retention import prune
    from twin.store import Job, TelemetryEvent

    first_run = planner(rows)(PREFIX, NOW - timedelta(hours=3))
    cut = len(first_run.events) * 3 // 5
    store(engine, first_run, cut)
    horizon = first_run.events[cut // 2][1].ts
    stored_part = [event for _, event in first_run.events[:cut]]
    with engine.connect() as connection:
        ended = dict(connection.execute(select(Job.job_id, Job.ended_at)).all())
    # A job submitted before the horizon that ended after it: its submission never reached the store.
    undelivered = next(
        e for e in stored_part
        if e.type == "job.submitted" and e.ts < horizon and ended.get(e.job_id) is not None
        and ended[e.job_id].replace(tzinfo=UTC) > horizon
    )  # fmt: skip
    with engine.begin() as connection:
        connection.execute(delete(TelemetryEvent).where(TelemetryEvent.event_id == str(undelivered.event_id)))
    assert prune(engine, "default", horizon).events > 0

    start = choose_start(planner(rows), PREFIX, engine, "default", NOW)

    sent = {str(event.event_id) for _, event in start.plan.events}
    rest = [event for _, event in first_run.events[cut:]]
    assert {str(e.event_id) for e in rest} | {str(undelivered.event_id)} <= sent
    stored = stored_event_times(engine, ids(first_run))
    gone = [e for e in stored_part if str(e.event_id) not in stored and e is not undelivered]
    assert gone and not {str(e.event_id) for e in gone} & sent  # pruned: not sent again
    assert all(e.type == "node.status" or ended[e.job_id].replace(tzinfo=UTC) < horizon for e in gone)
