"""An idle ingest worker says nothing: its progress line comes only when messages came in since the
last one. And the lag it exports for Grafana is what is left to poll."""

from __future__ import annotations

import logging

import pytest

from ingest import worker as worker_module
from ingest.bus import InProcessBus
from ingest.worker import IngestWorker
from tests.conftest import unique
from twin.db import make_engine


def progress_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("ingest: ")]


def test_progress_is_logged_only_when_something_changed(
    sqlite_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_module, "STATS_LOG_INTERVAL_S", 0.0)
    bus = InProcessBus()
    worker = IngestWorker(make_engine(sqlite_url), bus.consumer("t", "g"), bus.producer(), dlq_topic="t.dlq")
    caplog.set_level(logging.INFO, logger="ingest.worker")
    worker._log_progress()
    assert progress_lines(caplog) == []  # nothing came in yet
    worker.stats.messages = 5
    worker._log_progress()
    worker._log_progress()
    worker._log_progress()
    assert len(progress_lines(caplog)) == 1  # idle after the first: no repeats
    worker.stats.messages = 7
    worker._log_progress()
    assert len(progress_lines(caplog)) == 2 and "7 messages" in progress_lines(caplog)[-1]


def test_lag_is_what_is_left_to_poll() -> None:
    bus = InProcessBus()
    bus.ensure_topic("t", 1)
    producer = bus.producer()
    for n in range(5):
        producer.send("t", b"x", str(n).encode())
    consumer = bus.consumer("t", "g")
    assert consumer.lag() == 5
    assert len(consumer.poll(3, 10)) == 3
    assert consumer.lag() == 2


@pytest.mark.integration
def test_the_first_approval_publishes_without_a_kafka_warning(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An approved action goes out through the outbox's acked publisher: its first send used to log
    kafka-python's "Idempotence will be disabled" (retries=0 conflicts with the idempotent default)."""
    from ingest.acked import AckedPublisher
    from ingest.bus import KafkaBus

    topic = unique("actions")
    KafkaBus(kafka_bootstrap).ensure_topic(topic, 1)
    publisher = AckedPublisher(kafka_bootstrap)
    caplog.set_level(logging.WARNING, logger="kafka")
    try:
        partition, offset = publisher.publish(topic, b"k", b"{}")
    finally:
        publisher.close()
    assert (partition, offset) == (0, 0)
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("kafka")]
    assert not [w for w in warnings if "dempotence" in w], warnings
