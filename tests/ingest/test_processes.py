"""`finetwin ingest` and `finetwin up` as real processes: scale-out in one consumer group, SIGTERM, SIGKILL,
a broker restart on durable storage, and the one-command smoke run."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from sqlalchemy import Engine

from calibrate.loader import outcome_counts
from ingest.broker import EmbeddedBroker, free_port
from ingest.bus import KafkaBus
from ingest.replay import ReplayPlan, plan_replay, send_replay
from tests.conftest import unique, wait_for
from tests.ingest.conftest import (
    FINETWIN,
    PARTITIONS,
    IngestProcess,
    as_messages,
    assert_store_matches_benchmark,
    new_topic,
    produce,
    read_topic,
    store_count,
    worker_thread,
)
from tests.process_ends import children_of, needs_pidfd, still_running, watching

ASSIGNED = "finetwin_ingest_assigned_partitions"
APPLIED = "finetwin_ingest_events_applied_total"

pytestmark = pytest.mark.slow


def applied_by_stopped(process: IngestProcess) -> int:
    """The events a stopped `finetwin ingest` applied, from its closing log line."""
    found = re.findall(r"stopped: \d+ messages, (\d+) events applied", process.output())
    assert found, f"no closing line in the output:\n{process.output()[-2000:]}"
    return int(found[-1])


def test_two_ingest_processes_split_the_topic_and_apply_every_event_once(
    kafka_bootstrap: str, postgres_url: str, pg_engine: Engine, sample_table: pd.DataFrame,
    sample_plan: ReplayPlan, ingest_processes: list[IngestProcess], tmp_path: Path,
) -> None:  # fmt: skip
    topic = new_topic(kafka_bootstrap, unique("scale"))
    group = unique("g")
    first, second = (IngestProcess(postgres_url, kafka_bootstrap, topic, group, tmp_path) for _ in range(2))
    ingest_processes += [first, second]
    wait_for(
        lambda: (first.metric(ASSIGNED) or 0) > 0 and (second.metric(ASSIGNED) or 0) > 0
        and first.metric(ASSIGNED) + second.metric(ASSIGNED) == PARTITIONS,  # type: ignore[operator]
        60, "both processes to share the topic's partitions",
    )  # fmt: skip
    total = len(sample_plan.events)
    produce(kafka_bootstrap, topic, as_messages([event for _, event in sample_plan.events]))
    wait_for(lambda: store_count(pg_engine) >= 0.4 * total, 60, "ingest to get under way")
    first.process.send_signal(signal.SIGTERM)  # half-way: it drains its batch and leaves the group
    assert first.wait(30) == 0
    wait_for(lambda: second.metric(ASSIGNED) == PARTITIONS, 60, "the survivor to take every partition")
    wait_for(lambda: store_count(pg_engine) == total, 120, "every event in the store")
    wait_for(lambda: (second.metric(APPLIED) or 0) + applied_by_stopped(first) >= total, 30, "the counters")
    assert applied_by_stopped(first) + second.metric(APPLIED) == total  # each event applied exactly once
    assert 0 < applied_by_stopped(first) < total
    assert_store_matches_benchmark(pg_engine, sample_table, sample_plan, "replay-0-")


def test_one_command_runs_two_consumers_that_split_the_topic_and_drain_on_sigterm(
    kafka_bootstrap: str, postgres_url: str, pg_engine: Engine, sample_table: pd.DataFrame,
    sample_plan: ReplayPlan, ingest_processes: list[IngestProcess], tmp_path: Path,
) -> None:  # fmt: skip
    """`finetwin ingest --processes 2`: two consumers of one group in child processes, every event applied
    once; SIGTERM to the command stops both, each after committing what it applied."""
    topic = new_topic(kafka_bootstrap, unique("procs"))
    command = IngestProcess(postgres_url, kafka_bootstrap, topic, unique("g"), tmp_path, processes=2)
    ingest_processes.append(command)

    def assigned() -> list[float]:
        return [command.metric(ASSIGNED, consumer) or 0 for consumer in (0, 1)]

    wait_for(lambda: min(assigned()) > 0 and sum(assigned()) == PARTITIONS, 60, "both consumers to share")
    total = len(sample_plan.events)
    produce(kafka_bootstrap, topic, as_messages([event for _, event in sample_plan.events]))
    wait_for(lambda: store_count(pg_engine) == total, 120, "every event in the store")

    def applied() -> list[float]:  # counted after each batch's offsets are committed, so a moment later
        return [command.metric(APPLIED, consumer) or 0 for consumer in (0, 1)]

    wait_for(lambda: sum(applied()) >= total, 30, "the counters")
    assert sum(applied()) == total and min(applied()) > 0  # both took part, and applied each event once
    command.process.send_signal(signal.SIGTERM)
    assert command.wait(30) == 0
    assert len(re.findall(r"stopped: \d+ messages", command.output())) == 2  # both drained and said so
    assert_store_matches_benchmark(pg_engine, sample_table, sample_plan, "replay-0-")


@needs_pidfd
def test_the_consumers_drain_and_end_when_the_command_is_killed(
    kafka_bootstrap: str, postgres_url: str, ingest_processes: list[IngestProcess], tmp_path: Path
) -> None:
    """`kill -9` (or the out-of-memory killer) of `finetwin ingest --processes 2` passes no signal on: its
    consumers went on ingesting beside the ones a restarted command starts. Each now stops as SIGTERM stops
    it: its batch drained and committed, said in its closing line."""
    topic = new_topic(kafka_bootstrap, unique("orphans"))
    command = IngestProcess(postgres_url, kafka_bootstrap, topic, unique("g"), tmp_path, processes=2)
    ingest_processes.append(command)
    wait_for(lambda: all(command.metric(ASSIGNED, consumer) for consumer in (0, 1)), 60, "both consumers")
    consumers = children_of(command.process.pid)
    with watching(consumers) as handles:
        command.process.kill()
        command.process.wait()
        assert still_running(handles, 60) == [], "consumers outlived the command"
    assert len(re.findall(r"stopped: \d+ messages", command.output())) == 2, command.output()[-3000:]


def _exit_or_wait(statuses: dict[int, int], index: int) -> None:
    """A child for `run_children`: exits with its status, or waits until a signal stops it."""
    if index in statuses:
        sys.exit(statuses[index])
    signal.pause()


def test_a_failing_consumer_stops_the_others_and_the_command_reports_it() -> None:
    from ingest.processes import run_children

    assert run_children(3, functools.partial(_exit_or_wait, {1: 3}), "test") == 3
    assert run_children(2, functools.partial(_exit_or_wait, {0: 0, 1: 0}), "test") == 0


class HeldHalfWay:
    """A producer whose sends wait at `count` (the ones before flushed) until `release` is set."""

    def __init__(self, producer: Any, count: int) -> None:
        self.producer, self.count, self.sent = producer, count, 0
        self.release = threading.Event()

    def send(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        if self.sent == self.count:
            self.producer.flush()
            assert self.release.wait(120), "the test never released the replay"
        self.producer.send(topic, value, key)
        self.sent += 1

    def flush(self) -> None:
        self.producer.flush()

    def close(self) -> None:
        self.producer.close()


def test_sigkill_mid_replay_then_restart_loses_nothing_and_applies_nothing_twice(
    kafka_bootstrap: str, postgres_url: str, pg_engine: Engine, sample_table: pd.DataFrame,
    sample_plan: ReplayPlan, ingest_processes: list[IngestProcess], tmp_path: Path,
) -> None:  # fmt: skip
    topic = new_topic(kafka_bootstrap, unique("kill"))
    group = unique("g")
    doomed = IngestProcess(postgres_url, kafka_bootstrap, topic, group, tmp_path)
    ingest_processes.append(doomed)
    wait_for(lambda: doomed.metric(ASSIGNED) == PARTITIONS, 60, "the ingest process to join its group")
    total = len(sample_plan.events)
    # Paced to last ~8 s, and held half-way until the kill: the kill lands while the replay is still sending
    # (a paced replay alone could end before a slow ingest had stored the first 15 %).
    producer = HeldHalfWay(KafkaBus(kafka_bootstrap).producer(), total // 2)
    replay = threading.Thread(
        target=send_replay, args=(sample_plan, producer, topic), kwargs={"speed": sample_plan.duration_s / 8}
    )
    replay.start()
    try:
        wait_for(lambda: store_count(pg_engine) >= 0.15 * total, 60, "some of the replay in the store")
        assert replay.is_alive()  # mid-replay
        doomed.process.kill()
        doomed.wait(10)
        restarted = IngestProcess(postgres_url, kafka_bootstrap, topic, group, tmp_path)
        ingest_processes.append(restarted)
    finally:
        producer.release.set()
        replay.join(timeout=60)
        producer.close()
    assert not replay.is_alive() and producer.sent == total
    wait_for(lambda: store_count(pg_engine) == total, 120, "every event in the store after the restart")
    assert_store_matches_benchmark(pg_engine, sample_table, sample_plan, "replay-0-")


def test_a_broker_restart_on_s3_storage_loses_nothing(
    moto_s3: dict[str, str], pg_engine: Engine, sample_table: pd.DataFrame
) -> None:
    import boto3

    s3 = boto3.client(
        "s3", endpoint_url=moto_s3["AWS_ENDPOINT"], region_name=moto_s3["AWS_REGION"],
        aws_access_key_id=moto_s3["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=moto_s3["AWS_SECRET_ACCESS_KEY"],
    )  # fmt: skip
    s3.create_bucket(Bucket="tansu")  # Tansu's s3:// storage needs the bucket; it also needs AWS_ALLOW_HTTP
    rows = sample_table.sample(n=500, random_state=5)
    plan = plan_replay(rows, seed=3, job_prefix="durable-")
    messages = as_messages([event for _, event in plan.events])
    half = len(messages) // 2
    broker = EmbeddedBroker(storage="s3://tansu/", env=moto_s3).start()
    try:
        topic = new_topic(broker.bootstrap, unique("durable"))
        with worker_thread(pg_engine, broker.bootstrap, topic, unique("g"), f"{topic}.dlq") as (worker, _):
            produce(broker.bootstrap, topic, messages[:half])
            worker.wait_until(lambda s: s.applied > 0, timeout_s=60)
            broker.stop()  # mid-replay: the worker and the producer reconnect to the restarted broker
            broker = EmbeddedBroker(port=broker.port, storage="s3://tansu/", env=moto_s3).start()
            produce(broker.bootstrap, topic, messages[half:])
            wait_for(lambda: store_count(pg_engine) == len(messages), 120, "every event after the restart")
        # Durable: the restarted broker still has every message, including those sent before the restart.
        assert len(read_topic(broker.bootstrap, topic, len(messages))) == len(messages)
    finally:
        broker.stop()
    assert_store_matches_benchmark(pg_engine, rows, plan, "durable-")


def test_finetwin_up_replays_to_the_store_and_prints_the_counts(
    sample_csv: Path, sample_table: pd.DataFrame, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "FINETWIN_DATA_DIR": str(tmp_path / "data"),
        "FINETWIN_SCHEDULER_ENABLED": "0",
        "FINETWIN_MODELS_DIR": str(tmp_path / "models"),
    }
    env.pop("FINETWIN_DATABASE_URL", None)
    env.pop("FINETWIN_KAFKA_BOOTSTRAP", None)  # the embedded default: its own broker, SQLite
    expected = {"jobs": len(sample_table), **outcome_counts(sample_table)}
    # Twice on the same data directory, as `scripts/up` is run again: the second run's replay is new jobs
    # (the first one finished), not the first run's events again, which ingest would drop as duplicates.
    for run in (1, 2):
        done = subprocess.run(
            [FINETWIN, "up", "--replay", str(sample_csv), "--speed", "0", "--exit-when-done", "--json",
             "--port", str(free_port())],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads(done.stdout) == expected  # one JSON object, nothing else on stdout
        assert stored(tmp_path / "data" / "finetwin.db", "jobs") == run * len(sample_table)
        # The characterization report of the replayed file, for the dashboard's report panel (it said "run
        # `finetwin report`"): written by the first run, left as it is by the second.
        pointer = json.loads((tmp_path / "data" / "reports" / "latest.json").read_text())
        assert pointer["source"] == str(sample_csv) and Path(pointer["report_md"]).is_file()
        if run == 1:
            first_report = pointer
    assert pointer == first_report
    assert "replaying the file again as new jobs replay-0-1-*" in done.stderr


def test_finetwin_up_goes_on_with_the_next_pass_as_new_jobs_after_the_last(
    sample_plan: ReplayPlan, tmp_path: Path
) -> None:
    """A replay that ends would leave the twin standing still: `up` replays the file again as new jobs,
    pass after pass, each from the last one's end, and up's own worker accepts each pass's timeline (none
    dead-lettered, though each runs further ahead of the wall clock)."""
    env = {**os.environ, "FINETWIN_DATA_DIR": str(tmp_path / "data"), "FINETWIN_SCHEDULER_ENABLED": "0"}
    env.pop("FINETWIN_DATABASE_URL", None)
    env.pop("FINETWIN_KAFKA_BOOTSTRAP", None)
    store = tmp_path / "data" / "finetwin.db"
    job_events = sum(event.job_id is not None for _, event in sample_plan.events)  # the same at any load
    up = subprocess.Popen(
        [FINETWIN, "up", "--speed", "100000", "--passes", "2", "--quiet", "--port", str(free_port())],
        env=env, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        # Every job event of both passes applied: none dead-lettered as dated too far ahead.
        wait_for(lambda: stored(store, "telemetry_events WHERE job_id IS NOT NULL") == 2 * job_events, 240)
    finally:
        up.send_signal(signal.SIGINT)
        _, log = up.communicate(timeout=60)
    assert "replay pass 1: the file again as new jobs replay-0-1-*" in log, log[-3000:]
    assert "replay pass 2" not in log  # --passes 2: the first and one more
    first_end = stored(store, "telemetry_events WHERE job_id NOT LIKE 'replay-0-1-%'", "max(ts)")
    second_start = stored(store, "telemetry_events WHERE job_id LIKE 'replay-0-1-%'", "min(ts)")
    assert second_start > first_end  # the second pass begins after the first one's last event


def stored(sqlite_file: Path, rows: str, value: str = "count(*)") -> Any:
    """`SELECT value FROM rows` in `up`'s SQLite store, read-only (0 before the store has its tables)."""
    if not sqlite_file.exists():
        return 0
    with contextlib.closing(sqlite3.connect(f"file:{sqlite_file}?mode=ro", uri=True)) as connection:
        try:
            return connection.execute(f"SELECT {value} FROM {rows}").fetchone()[0]
        except sqlite3.OperationalError:  # not migrated yet
            return 0


def test_finetwin_ingest_without_a_broker_says_so(tmp_path: Path) -> None:
    env = {**os.environ, "FINETWIN_DATA_DIR": str(tmp_path)}
    env.pop("FINETWIN_KAFKA_BOOTSTRAP", None)
    done = subprocess.run([FINETWIN, "ingest"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "FINETWIN_KAFKA_BOOTSTRAP" in done.stderr


@pytest.mark.parametrize("processes", [1, 3])
def test_a_metrics_port_in_use_is_said_before_any_consumer_starts(tmp_path: Path, processes: int) -> None:
    """With --processes N, process i serves on --metrics-port + i: the last one's port is held here."""
    first = free_port(processes)
    held = first + processes - 1
    env = {**os.environ, "FINETWIN_DATA_DIR": str(tmp_path), "FINETWIN_API_HOST": "127.0.0.1"}
    command = [FINETWIN, "ingest", "--bootstrap", f"127.0.0.1:{free_port()}", "--metrics-port", str(first),
               "--processes", str(processes)]  # fmt: skip
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", held))
        server.listen()
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"127.0.0.1:{held} is in use" in done.stderr
    assert ("process 2's" in done.stderr) == (processes == 3)
    assert not (tmp_path / "finetwin.db").exists()  # said before the store was touched
