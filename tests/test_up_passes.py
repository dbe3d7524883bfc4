"""`finetwin up`'s replay passes (`finetwin.commands.up_replay.send_passes`): one after another until the
count or the store says stop, never faster than MIN_PASS_WALL_S of wall time each, and none after a file
without rows."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import Engine

from calibrate.loader import load_benchmark
from finetwin.commands import up_replay
from finetwin.errors import CommandError
from finetwin.settings import Settings
from ingest.apply import apply_events
from ingest.events import NodeStatus, new_event
from ingest.replay import ReplayPlan, plan_replay
from ingest.replay_passes import ReplayStart
from twin.limits import EVENT_TIME_WINDOW


def a_pass(number: int, jobs: int = 2) -> ReplayStart:
    plan = ReplayPlan([], datetime(2026, 1, 1, tzinfo=UTC), jobs)
    return ReplayStart(plan, f"p{number}-", [f"p{number}-{k}" for k in range(jobs)], number, 0)


class RecordedWaits(threading.Event):
    """A stop event that records how long each wait would have been, and returns at once."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.timeouts.append(timeout or 0.0)
        return self.is_set()


def run(first: ReplayStart, passes: int, last: int | None = None) -> tuple[int, list[int], RecordedWaits]:
    sent: list[int] = []
    stop = RecordedWaits()

    def next_pass(previous: ReplayStart) -> ReplayStart | None:
        number = previous.pass_number + 1
        return None if last is not None and number > last else a_pass(number)

    count = up_replay.send_passes(
        first, lambda start: sent.append(start.pass_number), next_pass, passes, stop
    )
    return count, sent, stop


def test_passes_are_sent_in_turn_up_to_the_count() -> None:
    assert run(a_pass(0), passes=3)[:2] == (3, [0, 1, 2])


def test_until_stopped_goes_on_until_no_pass_is_left() -> None:
    assert run(a_pass(4), passes=0, last=7)[:2] == (4, [4, 5, 6, 7])


def test_a_file_without_rows_is_sent_once() -> None:
    assert run(a_pass(0, jobs=0), passes=0, last=3)[:2] == (1, [0])


def test_each_pass_takes_at_least_the_minimum_wall_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait tops each pass up to the minimum on up_replay's clock, stood in for here: read off the real
    one, a stall of the test's process (a second, on a busy machine) counted as part of the pass."""
    monkeypatch.setattr(up_replay, "MIN_PASS_WALL_S", 30.0)
    now = [1000.0]
    monkeypatch.setattr(up_replay, "time", SimpleNamespace(monotonic=lambda: now[0]))
    sent: list[int] = []
    stop = RecordedWaits()

    def send(start: ReplayStart) -> None:
        sent.append(start.pass_number)
        now[0] += 4.0  # a pass takes 4 s to send

    count = up_replay.send_passes(a_pass(0), send, lambda previous: a_pass(previous.pass_number + 1), 3, stop)
    assert (count, sent) == (3, [0, 1, 2]) and stop.timeouts == [26.0, 26.0]


def test_a_stop_during_the_wait_ends_the_passes() -> None:
    stop = RecordedWaits()
    following: list[ReplayStart] = []

    def send(start: ReplayStart) -> None:
        stop.set()  # Ctrl-C while the pass was being sent

    count = up_replay.send_passes(a_pass(0), send, lambda p: following.append(p) or a_pass(1), 0, stop)
    assert count == 1 and following == []


def test_a_replay_that_would_run_past_the_contracts_bound_is_refused_at_start(
    engine: Engine, sample_csv: Path
) -> None:
    """A store whose telemetry is dated almost ten years ahead (days of passes at --speed 600): the next
    pass would start there and run past what ingest accepts, so `up` says so instead of replaying into the
    dead-letter topic."""
    far = datetime.now(UTC) + EVENT_TIME_WINDOW - timedelta(minutes=1)
    node = NodeStatus(node_id="n0", gpu_model="L40S", gpu_count=8, status="up")
    apply_events(engine, [new_event("node.status", node, job_id=None, ts=far)])
    rows = load_benchmark(sample_csv).iloc[:20].reset_index(drop=True)

    def plan_for(prefix: str, epoch: datetime) -> ReplayPlan:
        return plan_replay(rows, seed=1, job_prefix=prefix, epoch=epoch)

    with pytest.raises(CommandError, match="beyond the telemetry contract's bound on event times"):
        up_replay.replay_start(plan_for, "bound-", None, engine, Settings())
    # Pinned, the replay is what was asked for: no bound is looked up.
    pinned = up_replay.replay_start(plan_for, "bound-", datetime.now(UTC), engine, Settings())
    assert pinned.pass_number == 0 and len(pinned.job_ids) == len(rows)


@pytest.mark.parametrize(
    "command",
    [
        ["up", "--speed", "0", "--exit-when-done", "--port", "0", "--replay"],
        ["replay", "--bootstrap", "127.0.0.1:9", "--bench"],
        ["backtest", "--bench"],
    ],
    ids=["up", "replay", "backtest"],
)
def test_a_benchmark_without_rows_is_refused_before_anything_starts(
    sample_csv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    command: list[str],
) -> None:  # fmt: skip
    """`up` served an empty cluster (and logged a broker error as it stopped); a backtest met an
    IndexError, before its own check."""
    from finetwin.cli import main

    monkeypatch.setenv("FINETWIN_DATA_DIR", str(tmp_path / "data"))
    header_only = tmp_path / "header.csv"
    header_only.write_text(sample_csv.read_text().splitlines()[0] + "\n")
    assert main([*command, str(header_only)]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert f"{header_only}: no rows to replay (a header and no data rows)" in error, error
    assert not (tmp_path / "data" / "finetwin.db").exists()  # no store was made for it
