"""Which broker and which PostgreSQL the integration tests run against, and the containers for them.

Where a Docker engine answers (a contributor's laptop, most CI services), the fixtures start Apache Kafka in
KRaft mode and PostgreSQL with testcontainers, so the suite runs against the broker production uses; where
none does (these machines), they start the embedded Tansu broker and use the local PostgreSQL.

- `FINETWIN_TEST_BROKER=tansu|kafka` forces the broker (`kafka` without Docker: the tests that need a
  broker skip, or fail under FINETWIN_REQUIRE_SERVICES=1, saying why);
- `FINETWIN_TEST_POSTGRES=local|container` forces the database; setting `FINETWIN_TEST_PG_URL` or
  `FINETWIN_TEST_PG_HOST` means the local one;
- `FINETWIN_TEST_KAFKA_IMAGE` and `FINETWIN_TEST_POSTGRES_IMAGE` choose the images.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

Broker = Literal["tansu", "kafka"]
Postgres = Literal["local", "container"]
BROKERS: tuple[Broker, ...] = ("tansu", "kafka")
POSTGRES: tuple[Postgres, ...] = ("local", "container")
# Confluent's build of Apache Kafka 3.9 (the version deploy/compose.yaml runs), the image family that
# testcontainers' KafkaContainer knows how to start in KRaft mode.
KAFKA_IMAGE = "confluentinc/cp-kafka:7.9.0"
POSTGRES_IMAGE = "postgres:16"


@dataclass(frozen=True)
class Services:
    broker: Broker
    postgres: Postgres


def choose_services(env: Mapping[str, str], docker_available: Callable[[], bool]) -> Services:
    """The broker and database for this test session. `docker_available` is asked only when needed (it
    talks to the engine)."""
    broker = env.get("FINETWIN_TEST_BROKER", "").strip().lower()
    if broker and broker not in BROKERS:
        raise ValueError(f"FINETWIN_TEST_BROKER={broker!r}: use one of {', '.join(BROKERS)}")
    postgres = env.get("FINETWIN_TEST_POSTGRES", "").strip().lower()
    if postgres and postgres not in POSTGRES:
        raise ValueError(f"FINETWIN_TEST_POSTGRES={postgres!r}: use one of {', '.join(POSTGRES)}")
    if not postgres and (env.get("FINETWIN_TEST_PG_URL") or env.get("FINETWIN_TEST_PG_HOST")):
        postgres = "local"  # a database was named: use it
    if not broker or not postgres:
        docker = docker_available()
        broker = broker or ("kafka" if docker else "tansu")
        postgres = postgres or ("container" if docker else "local")
    return Services(broker, postgres)  # type: ignore[arg-type]


@cache
def docker_available() -> bool:
    """Whether a Docker engine answers (asked once per session, with a short timeout)."""
    try:
        import docker  # installed with testcontainers

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # no SDK, no socket, no engine, no permission: no Docker for these tests
        return False


def session_services() -> Services:
    return choose_services(os.environ, docker_available)


def start_kafka_container() -> Any:
    """Apache Kafka in KRaft mode (no ZooKeeper), started; `.get_bootstrap_server()`, `.stop()`."""
    try:
        from testcontainers.community.kafka import KafkaContainer
    except ImportError:  # testcontainers before 4.10
        from testcontainers.kafka import KafkaContainer

    image = os.environ.get("FINETWIN_TEST_KAFKA_IMAGE", KAFKA_IMAGE)
    return KafkaContainer(image).with_kraft().start()


def start_postgres_container() -> Any:
    """PostgreSQL, started; `.get_connection_url(driver=None)` is its admin URL, `.stop()`."""
    try:
        from testcontainers.community.postgres import PostgresContainer
    except ImportError:  # testcontainers before 4.10
        from testcontainers.postgres import PostgresContainer

    image = os.environ.get("FINETWIN_TEST_POSTGRES_IMAGE", POSTGRES_IMAGE)
    return PostgresContainer(image, driver=None).start()
