"""Benchmark rows to telemetry: what each row becomes, the simulated cluster, determinism for a seed."""

from __future__ import annotations

import json
import math
import threading
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

from finetwin.cli import main
from ingest.bus import InProcessBus
from ingest.events import MEASURED_FIELDS, parse_event
from ingest.replay import PROGRESS_GAP_S, ReplayPlan, plan_replay, send_replay
from tests.conftest import unique
from tests.ingest.conftest import new_topic, read_topic
from twin.domain import GPUS_PER_NODE
from twin.job_health import DEFAULT_GRACE


def by_job(plan: ReplayPlan) -> dict[str, list]:  # type: ignore[type-arg]
    jobs: dict[str, list] = defaultdict(list)  # type: ignore[type-arg]
    for at, event in plan.events:
        if event.job_id:
            jobs[event.job_id].append((at, event))
    return jobs


def test_each_row_becomes_its_outcome_s_telemetry(
    sample_table: pd.DataFrame, sample_plan: ReplayPlan
) -> None:
    jobs = by_job(sample_plan)
    assert len(jobs) == len(sample_table) == sample_plan.jobs
    rows = {f"replay-0-{row['line']}": row for row in sample_table.to_dict("records")}
    for job_id, events in jobs.items():
        row = rows[job_id]
        kinds = [event.type for _, event in events]
        submitted = events[0][1].payload
        assert (submitted.model_name, submitted.gpu_model, submitted.number_gpus, submitted.batch_size) == (
            row["model_name"], row["gpu_model"], row["number_gpus"], row["batch_size"],
        )  # fmt: skip
        assert submitted.identifier == row["identifier"] and submitted.experiment_id == row["experiment_id"]
        assert submitted.time_limit_s == (None if math.isnan(row["time_limit_s"]) else row["time_limit_s"])
        if row["outcome"] == "rejected":
            assert kinds == ["job.submitted", "job.rejected"]
            assert events[1][1].payload.rule == row["rule"]
            assert submitted.dataset_tokens is None
        elif row["outcome"] == "runtime":
            assert kinds == ["job.submitted", "job.started", "job.failed"]
            assert events[2][1].payload.reason == "oom" and events[2][1].payload.seconds_into_run > 0
        else:
            assert kinds[:2] == ["job.submitted", "job.started"] and kinds[-1] == "job.completed"
            assert set(kinds[2:-1]) == {"job.progress"} and len(kinds) >= 5
            completed = events[-1][1].payload
            for name in MEASURED_FIELDS:
                expected = row[name]
                assert getattr(completed, name) == (None if pd.isna(expected) else expected), name
            assert submitted.dataset_tokens == pytest.approx(
                row["dataset_tokens_per_second"] * row["train_runtime"]
            )
            assert events[-1][0] - events[1][0] == pytest.approx(
                row["train_runtime"]
            )  # runs as long as measured
        times = [at for at, _ in events]
        assert times == sorted(times) and len(set(times)) == len(times)


def test_a_replayed_run_is_never_silent_long_enough_to_look_hung(sample_plan: ReplayPlan) -> None:
    """From its start to its end, no gap between reports longer than PROGRESS_GAP_S, well inside the
    twin's attention window: the sample's 12-hour run went 66 min between reports, and looked stalled."""
    longest = 0.0
    for events in by_job(sample_plan).values():
        running = [
            at for at, event in events if event.type in ("job.started", "job.progress", "job.completed")
        ]
        if len(running) > 2:
            longest = max(longest, max(b - a for a, b in zip(running, running[1:], strict=False)))
    assert 0 < longest <= PROGRESS_GAP_S < DEFAULT_GRACE.total_seconds()


def test_nodes_come_first_and_are_never_overcommitted(sample_plan: ReplayPlan) -> None:
    statuses = [event for _, event in sample_plan.events if event.type == "node.status"]
    assert sample_plan.events[: len(statuses)] == [(0.0, e) for e in statuses]
    assert {e.payload.node_id for e in statuses} == set(sample_plan.nodes)
    assert all(e.payload.gpu_count == GPUS_PER_NODE and e.payload.status == "up" for e in statuses)
    # Replay every job's GPU use per node: never more than 8 GPUs in use at any time.
    gpus: dict[str, int] = {}
    changes: list[tuple[float, int, str, int]] = []
    for job_id, events in by_job(sample_plan).items():
        submitted = events[0][1].payload
        started = [(at, e) for at, e in events if e.type == "job.started"]
        if not started:
            continue
        start, event = started[0]
        end = events[-1][0]
        nodes = event.payload.node_ids
        per_node = math.ceil(submitted.number_gpus / len(nodes))
        assert all(sample_plan.nodes[n] == submitted.gpu_model for n in nodes), job_id
        for node in nodes:
            changes += [(start, 1, node, per_node), (end, 0, node, -per_node)]
    for _, _, node, delta in sorted(changes):  # releases (0) before starts (1) at the same instant
        gpus[node] = gpus.get(node, 0) + delta
        assert 0 <= gpus[node] <= GPUS_PER_NODE, node


def test_a_seed_replays_identically_and_another_seed_does_not(sample_table: pd.DataFrame) -> None:
    rows = sample_table.head(200)
    first, again, other = (plan_replay(rows, seed=s) for s in (5, 5, 6))
    assert [e.to_json() for _, e in first.events] == [e.to_json() for _, e in again.events]
    assert {e.event_id for _, e in first.events}.isdisjoint({e.event_id for _, e in other.events})
    assert [e.ts for _, e in first.events] != [e.ts for _, e in other.events]
    assert first.epoch != other.epoch


def test_every_replayed_message_is_a_valid_event_keyed_by_its_job(sample_plan: ReplayPlan) -> None:
    bus = InProcessBus(default_partitions=4)
    bus.ensure_topic("t", 4)
    sent = send_replay(sample_plan, bus.producer(), "t")
    messages = bus.messages("t")
    assert sent == len(messages) == len(sample_plan.events)
    partition_of: dict[str, int] = {}
    for message in messages:
        event = parse_event(message.value)
        assert message.key == event.key.encode()
        assert (
            partition_of.setdefault(event.key, message.partition) == message.partition
        )  # one job, one partition


def test_stop_cuts_a_paced_replay_short(sample_plan: ReplayPlan) -> None:
    stop = threading.Event()

    class StopAfterFive:
        sent = 0

        def send(self, topic: str, value: bytes, key: bytes | None = None) -> None:
            self.sent += 1
            if self.sent == 5:
                stop.set()

        def flush(self) -> None: ...

        def close(self) -> None: ...

    producer = StopAfterFive()
    # At one simulated second per second this replay would take days; it ends when stop is set.
    assert send_replay(sample_plan, producer, "t", speed=1.0, stop=stop) == 5


def test_finetwin_replay_is_deterministic_for_a_seed(
    kafka_bootstrap: str, sample_csv: Path, tmp_path: Path
) -> None:
    small = tmp_path / "small.csv"
    small.write_text("".join(sample_csv.open().readlines()[:121]))  # header + 120 rows
    runs = []
    for epoch in ("2025-02-03T04:05:06Z", "2025-02-03T04:05:06Z", None):  # pinned twice, then now
        topic = new_topic(kafka_bootstrap, unique("replay"))
        pin = ["--epoch", epoch] if epoch else []
        started = datetime.now(UTC)
        assert main(["replay", "--bench", str(small), "--seed", "42", "--bootstrap", kafka_bootstrap,
                     "--topic", topic, "--quiet", *pin]) == 0  # fmt: skip
        runs.append(topic)
    expected = len(plan_replay_of(small, 42).events)
    first, second, unpinned = (read_topic(kafka_bootstrap, topic, expected) for topic in runs)
    assert len(first) == len(second) == len(unpinned) == expected
    # By default the timeline starts when the replay does: its first event (node.status) is dated then.
    times = [datetime.fromisoformat(json.loads(r.value)["ts"].replace("Z", "+00:00")) for r in unpinned]
    assert started <= min(times) <= datetime.now(UTC)
    pinned = [datetime.fromisoformat(json.loads(r.value)["ts"].replace("Z", "+00:00")) for r in first]
    assert min(pinned) == datetime(2025, 2, 3, 4, 5, 6, tzinfo=UTC)

    def content(records: list) -> list[tuple[int, int, bytes, bytes]]:  # type: ignore[type-arg]
        return sorted((r.partition, r.offset, r.key, r.value) for r in records)

    assert content(first) == content(second)


def plan_replay_of(path: Path, seed: int) -> ReplayPlan:
    from calibrate.loader import load_benchmark

    return plan_replay(load_benchmark(path), seed=seed)


def test_finetwin_replay_names_a_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("identifier,method\nx,full\n")
    assert main(["replay", "--bench", str(bad), "--bootstrap", "127.0.0.1:1"]) == 2
    assert "bad.csv" in capsys.readouterr().err


def test_finetwin_replay_says_what_is_wrong_with_its_input_before_asking_for_kafka(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a broker named, a missing file or a negative speed was answered "no Kafka to talk to": the
    user set one up, only to learn the file was not there."""
    monkeypatch.delenv("FINETWIN_KAFKA_BOOTSTRAP", raising=False)
    assert main(["replay", "--bench", str(tmp_path / "nowhere.csv")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "nowhere.csv" in err and "Kafka" not in err, err
    assert main(["replay", "--speed", "-1"]) == 2
    assert "--speed must be 0 or more" in capsys.readouterr().err
    assert main(["replay"]) == 2  # the bundled sample is fine: now the broker is what is missing
    assert "no Kafka to talk to" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["replay", "up"])
@pytest.mark.parametrize(
    ("options", "expected"),
    [
        # Were the planner's "target_utilization must be in (0, 1], got 0.0" and numpy's "expected
        # non-negative integer": right, but about no option the user had typed.
        (["--load", "0"], "--load must be more than 0 and at most 1 (the utilization the replayed cluster"),
        (["--load", "nan"], "--load must be more than 0 and at most 1"),
        (["--seed", "-1"], "--seed must be from 0 to 9,223,372,036,854,775,807, got -1"),
        (["--speed", "nan"], "--speed must be 0 or more (0 = as fast as possible), not nan"),  # was as 0
        (["--mean-interarrival", "nan"], "--mean-interarrival must be a positive number of seconds, not nan"),
        # These three were "benchmark line N: cannot turn into telemetry: ..." (a pydantic error), the file
        # blamed for what an option had made of it.
        (
            ["--mean-interarrival", "1e6"],
            "--mean-interarrival 1e+06 s between 3,983 jobs spans 126 years, and telemetry is dated within "
            "10 years of now: at most 79,242 s for this file",
        ),
        (["--job-prefix", "x" * 300], "--job-prefix must be at most 180 characters"),
        (
            ["--epoch", "9999-01-01T00:00:00Z"],
            "--epoch 9999-01-01T00:00:00+00:00 is more than 10 years from now",
        ),
    ],
)
def test_replay_options_are_named_where_they_are_wrong(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    options: list[str],
    expected: str,
) -> None:
    monkeypatch.delenv("FINETWIN_KAFKA_BOOTSTRAP", raising=False)  # said before a broker is looked for
    monkeypatch.setenv("FINETWIN_DATA_DIR", str(tmp_path / "data"))
    assert main([command, *options]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert f"finetwin {command}: error: {expected}" in error, error


@pytest.mark.parametrize("port", ["-1", "70000"])
def test_up_names_a_port_out_of_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, port: str
) -> None:
    """Was an OverflowError traceback from the socket's bind()."""
    monkeypatch.setenv("FINETWIN_DATA_DIR", str(tmp_path / "data"))
    # `finetwin api` said it was "running on http://127.0.0.1:70000".
    for argv in (["up", "--no-replay", "--port", port], ["api", "--port", port]):
        assert main(argv) == 2
        assert "Invalid value for '--port'" in capsys.readouterr().err


def test_up_without_a_replay_refuses_the_replay_s_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """They were taken and ignored: `up --no-replay --speed 60` ran as if --speed had not been given."""
    monkeypatch.setenv("FINETWIN_DATA_DIR", str(tmp_path / "data"))
    assert main(["up", "--no-replay", "--speed", "60", "--load", "0.5"]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert "--speed and --load apply only to the replay, not with --no-replay: drop" in error, error


def test_an_epoch_moves_the_timeline_and_nothing_else(sample_table: pd.DataFrame) -> None:
    from datetime import timedelta

    rows = sample_table.head(100)
    pinned = datetime(2026, 6, 1, 8, 30, tzinfo=UTC)
    first = plan_replay(rows, seed=3, epoch=pinned)
    again = plan_replay(rows, seed=3, epoch=pinned + timedelta(days=10))
    assert first.epoch == pinned and first.events[0][1].ts == pinned  # node.status at the epoch itself
    # The same seed: the same events, each at the same offset from its epoch.
    assert [e.event_id for _, e in first.events] == [e.event_id for _, e in again.events]
    assert [e.ts - pinned for _, e in first.events] == [
        e.ts - pinned - timedelta(days=10) for _, e in again.events
    ]
    with pytest.raises(ValueError, match="time zone"):
        plan_replay(rows, seed=3, epoch=datetime(2026, 6, 1))
