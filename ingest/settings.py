"""Ingest's settings (the Kafka cluster, topics, the ingest worker), read from `FINETWIN_*` variables."""

from __future__ import annotations

import ipaddress
from datetime import timedelta

from pydantic import Field, field_validator

from twin.limits import DEFAULT_MAX_CLOCK_SKEW, TopicName
from twin.settings import TwinSettings


def _ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def bootstrap_problem(bootstrap: str) -> str | None:
    """Why `bootstrap` is not a Kafka bootstrap list (`HOST[:PORT]`, comma-separated; an IPv6 host in
    brackets), None when it is one. kafka-python raised a malformed port as a traceback (ValueError: invalid
    literal for int())."""
    for address in bootstrap.split(","):
        address = address.strip()
        if address.startswith("["):  # [::1]:9092
            host, _, rest = address[1:].partition("]")
            if not rest.startswith(":") and rest:
                return f"{address!r} is not HOST:PORT (an IPv6 host is [ADDRESS]:PORT)"
            port = rest[1:] if rest else None
        elif address.count(":") > 1:
            # An IPv6 address alone is a host (on port 9092), as kafka-python reads it.
            if not _ipv6(address):
                return f"{address!r} is not HOST:PORT (an IPv6 host goes in brackets: [ADDRESS]:PORT)"
            host, port = address, None
        else:
            host, colon, port_text = address.partition(":")
            port = port_text if colon else None
        if not host:
            return f"{address!r} names no host (HOST:PORT, comma-separated)"
        if port is not None and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            return f"{address!r}: the port must be a number from 1 to 65535"
    return None


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

    @field_validator("kafka_bootstrap")
    @classmethod
    def _a_bootstrap_list(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            # Set empty, as compose's `${FINETWIN_KAFKA_BOOTSTRAP:-}` and the benches set it: unset, as an
            # empty FINETWIN_DATABASE_URL is (it was "names no host", and the benches' `up` stopped on it).
            return None
        problem = None if value is None else bootstrap_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

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
