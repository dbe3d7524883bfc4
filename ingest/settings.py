"""Ingest's settings (the Kafka cluster, topics, the ingest worker), read from `FINETWIN_*` variables."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field, field_validator

from twin.limits import DEFAULT_MAX_CLOCK_SKEW, TopicName
from twin.settings import TwinSettings


class IngestSettings(TwinSettings):
    # Kafka. Unset bootstrap = `finetwin up` starts an embedded broker.
    kafka_bootstrap: str | None = None
    telemetry_topic: TopicName = "finetwin.telemetry"
    dlq_topic: TopicName = "finetwin.telemetry.dlq"
    telemetry_partitions: int = Field(default=6, ge=1, le=10_000)
    consumer_group: str = "finetwin-ingest"
    # Most messages per ingest transaction. A poll returns what is there, so this only bites under backlog,
    # where bigger transactions go faster (bench/ingest.py: 1000 -> 6.4k, 5000 -> 8.7k events/s).
    ingest_batch_size: int = Field(default=5000, ge=1, le=1_000_000)
    ingest_poll_timeout_ms: int = Field(default=500, ge=1)
    # Events dated further ahead of the ingest worker's clock go to the dead-letter topic (`clock_skew`):
    # seconds, or an ISO 8601 duration such as PT1H.
    max_clock_skew: timedelta = Field(DEFAULT_MAX_CLOCK_SKEW, ge=timedelta(0))
    session_timeout_ms: int = Field(default=6000, ge=1)
    heartbeat_interval_ms: int = Field(default=1000, ge=1)

    @field_validator("max_clock_skew", mode="before")
    @classmethod
    def _seconds_as_text(cls, value: object) -> object:
        """`FINETWIN_MAX_CLOCK_SKEW=90` means 90 seconds (pydantic reads a bare number only when not text)."""
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                return value
        return value
