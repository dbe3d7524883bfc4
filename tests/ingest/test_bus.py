"""The in-process bus (`finetwin up` without a Tansu binary) keeps Kafka's delivery contract, and `up` falls
back to it with a warning."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy import Engine

from calibrate.loader import outcome_counts
from finetwin.cli import main
from ingest.broker import free_port
from ingest.bus import InProcessBus
from ingest.replay import plan_replay, send_replay
from ingest.worker import IngestWorker
from tests.ingest.conftest import assert_store_matches_benchmark


def test_uncommitted_messages_are_redelivered_to_the_group() -> None:
    bus = InProcessBus(default_partitions=3)
    bus.ensure_topic("t", 3)
    producer = bus.producer()
    for n in range(30):
        producer.send("t", f"{n}".encode(), f"job-{n % 5}".encode())
    first = bus.consumer("t", "g")
    batch = first.poll(max_records=10, timeout_ms=0)
    assert len(batch) == 10 and first.partitions() == 3
    first.commit(batch)
    first.poll(max_records=10, timeout_ms=0)  # read, never committed
    first.close()
    again = bus.consumer("t", "g").poll(max_records=100, timeout_ms=0)
    assert len(again) == 20
    assert {(m.partition, m.offset) for m in again}.isdisjoint({(m.partition, m.offset) for m in batch})
    by_key: dict[bytes | None, set[int]] = {}
    for message in bus.messages("t"):
        by_key.setdefault(message.key, set()).add(message.partition)
    assert all(len(partitions) == 1 for partitions in by_key.values())  # one key, one partition, in order
    assert bus.consumer("t", "other-group").poll(max_records=100, timeout_ms=0) != []


def test_a_worker_on_the_in_process_bus_applies_a_replay(engine: Engine, sample_table: pd.DataFrame) -> None:
    rows = sample_table.head(150)
    plan = plan_replay(rows, seed=2, job_prefix="inproc-")
    bus = InProcessBus(default_partitions=4)
    bus.ensure_topic("telemetry", 4)
    worker = IngestWorker(
        engine, bus.consumer("telemetry", "g"), bus.producer(), dlq_topic="dlq", batch_size=100
    )
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:
        send_replay(plan, bus.producer(), "telemetry")
        assert worker.wait_until(lambda s: s.messages >= len(plan.events), timeout_s=60)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert_store_matches_benchmark(engine, rows, plan, "inproc-")


def test_up_falls_back_to_the_in_process_bus_without_tansu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sample_csv: Path, sample_table: pd.DataFrame,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    small = tmp_path / "small.csv"
    small.write_text("".join(sample_csv.open().readlines()[:301]))
    monkeypatch.setattr("ingest.broker.tansu_binary", lambda: None)
    monkeypatch.setenv("FINETWIN_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("FINETWIN_SCHEDULER_ENABLED", "0")
    monkeypatch.setenv("FINETWIN_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.delenv("FINETWIN_DATABASE_URL", raising=False)
    monkeypatch.delenv("FINETWIN_KAFKA_BOOTSTRAP", raising=False)
    argv = [
        "up",
        "--replay",
        str(small),
        "--speed",
        "0",
        "--exit-when-done",
        "--json",
        "--port",
        str(free_port()),
    ]
    assert main(argv) == 0
    captured = capsys.readouterr()
    counts = json.loads(captured.out)
    assert counts == {"jobs": 300, **outcome_counts(sample_table.head(300))}
    # The console script configures logging itself (to stderr, replacing pytest's handler): read stderr.
    assert "in-process bus" in captured.err
