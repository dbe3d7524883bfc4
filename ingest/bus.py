"""The message bus as ingest and replay see it: topics, a producer, a consumer in a group.

`KafkaBus` is kafka-python against a real broker (Tansu locally, any Kafka in production). `InProcessBus`
keeps the same small interface in memory; `finetwin up` uses it, with a warning, only when no Tansu binary
exists for the platform.

Tansu notes that shape the consumer settings: a group join takes about half of `session_timeout_ms`, so it
is kept short (6 s, heartbeat 1 s); end offsets (`latest`, lag) are wrong on Tansu, so consumers start from
`earliest` and rely on committed offsets only.
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, NamedTuple, Protocol

from ingest.settings import IngestSettings

log = logging.getLogger(__name__)

# Large enough for a dead-letter record that carries a rejected 1 MB message (text or base64) with its reason.
MAX_REQUEST_BYTES = 8 * 1024 * 1024


class Message(Protocol):
    """A record a consumer hands out. kafka-python's ConsumerRecord is one as it is: the Kafka consumer
    passes those on rather than copy each into a tuple of ours (~0.5 µs a record)."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None:  # None: a tombstone
        ...


class Record(NamedTuple):
    """A `Message` of the in-process bus."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class DeliveryFailed(RuntimeError):
    """The broker did not acknowledge messages sent since the last flush; `causes`: why, for each."""

    def __init__(self, message: str, causes: Sequence[BaseException] = ()) -> None:
        super().__init__(message)
        self.causes = tuple(causes)


# A record refused for its size, by the client (over `max_request_size`) or by the broker (over its
# `message.max.bytes` or the topic's `max.message.bytes`): sending the same record again cannot succeed.
_TOO_LARGE_ERRORS = ("MessageSizeTooLargeError", "RecordListTooLargeError")


def refused_for_size(exc: BaseException) -> bool:
    """Whether a send or flush failed because a record was too large for the client, broker or topic."""
    causes = exc.causes if isinstance(exc, DeliveryFailed) else (exc,)
    return any(type(cause).__name__ in _TOO_LARGE_ERRORS for cause in causes)


class CommitRejected(RuntimeError):
    """The group rebalanced: these partitions are no longer this consumer's to commit."""


class UndecodableBatch(RuntimeError):
    """The consumer fetched a record batch it cannot decode (a codec it lacks, a corrupt batch): nothing after
    it in that partition can be read, and polling again would not get past it."""

    def __init__(self, topic: str | None, partition: int | None, offset: int | None, cause: BaseException):
        self.topic, self.partition, self.offset, self.cause = topic, partition, offset, cause
        where = f"topic {topic} partition {partition} offset {offset}" if topic else "an unknown partition"
        super().__init__(f"cannot decode the record batch at {where}: {type(cause).__name__}: {cause}")


class BusProducer(Protocol):
    def send(self, topic: str, value: bytes, key: bytes | None = None) -> None: ...

    def flush(self) -> None:
        """Block until everything sent so far is acknowledged; raise `DeliveryFailed` if anything was not."""

    def close(self) -> None: ...


class BusConsumer(Protocol):
    def poll(self, max_records: int, timeout_ms: int) -> list[Message]: ...

    def partitions(self) -> int:
        """How many partitions this consumer is assigned right now."""

    def commit(self, messages: Sequence[Message]) -> None:
        """Commit the offsets just after these messages (each partition's highest offset + 1)."""

    def close(self) -> None: ...


class Bus(Protocol):
    def ensure_topic(self, name: str, partitions: int) -> None: ...

    def producer(self) -> BusProducer: ...

    def consumer(self, topic: str, group: str) -> BusConsumer: ...


@dataclass(frozen=True, slots=True)
class ConsumerTuning:
    session_timeout_ms: int = 6000
    heartbeat_interval_ms: int = 1000
    # Big fetches: kafka-python's defaults (1 MB per partition) cap a consumer at a fraction of what the
    # broker can serve; these let one poll return a whole batch.
    max_partition_fetch_bytes: int = 8 * 1024 * 1024
    fetch_max_bytes: int = 64 * 1024 * 1024

    @classmethod
    def from_settings(cls, settings: IngestSettings) -> ConsumerTuning:
        return cls(
            session_timeout_ms=settings.session_timeout_ms,
            heartbeat_interval_ms=settings.heartbeat_interval_ms,
        )


def offsets_after(messages: Sequence[Message]) -> dict[tuple[str, int], int]:
    """Per (topic, partition), the offset to commit after these messages: the highest one + 1."""
    after: dict[tuple[str, int], int] = {}
    for message in messages:
        tp = (message.topic, message.partition)
        after[tp] = max(after.get(tp, 0), message.offset + 1)
    return after


# --- Kafka ------------------------------------------------------------------------------------------------


def create_topic(bootstrap: str, name: str, partitions: int) -> bool:
    """Create a topic with `partitions` partitions (replication 1 is enough for the embedded broker; a
    production cluster applies its own default); returns False when it already existed."""
    from kafka import KafkaAdminClient
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="finetwin-admin")
    try:
        admin.create_topics({name: {"num_partitions": partitions}}, wait_for_metadata=True)
        return True
    except TopicAlreadyExistsError:
        return False
    finally:
        admin.close()


def make_producer(bootstrap: str, **overrides: Any) -> Any:
    """A KafkaProducer tuned for throughput without giving up durability: every replica acknowledges
    (acks=all, idempotent), records are batched for a few milliseconds."""
    from kafka import KafkaProducer

    config: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "client_id": "finetwin-producer",
        "acks": "all",
        "linger_ms": 10,
        "batch_size": 256 * 1024,
        "max_request_size": MAX_REQUEST_BYTES,
        "metrics_enabled": False,  # kafka-python's client metrics cost CPU on every record
    }
    return KafkaProducer(**(config | overrides))


def make_consumer(
    bootstrap: str, topic: str | None, group: str | None, tuning: ConsumerTuning = ConsumerTuning(),
    **overrides: Any,
) -> Any:  # fmt: skip
    """A KafkaConsumer in `group` (subscribed to `topic` when given) that never commits on its own: offsets
    are committed by the caller, after the database transaction."""
    from kafka import KafkaConsumer

    config: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "client_id": "finetwin-consumer",
        "group_id": group,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "session_timeout_ms": tuning.session_timeout_ms,
        "heartbeat_interval_ms": tuning.heartbeat_interval_ms,
        "max_partition_fetch_bytes": tuning.max_partition_fetch_bytes,
        "fetch_max_bytes": tuning.fetch_max_bytes,
        "metrics_enabled": False,
    }
    config |= overrides
    return KafkaConsumer(topic, **config) if topic else KafkaConsumer(**config)


class KafkaBusProducer:
    def __init__(self, bootstrap: str) -> None:
        self._producer = make_producer(bootstrap)
        self._failures: list[BaseException] = []

    def send(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self._producer.send(topic, value=value, key=key).add_errback(self._failures.append)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Raises `DeliveryFailed` if the broker refused anything, kafka-python's KafkaTimeoutError if it did
        not acknowledge everything within `timeout_s` (the caller retries: nothing is committed before)."""
        self._producer.flush(timeout=timeout_s)
        if self._failures:
            failures = list(self._failures)
            self._failures.clear()
            raise DeliveryFailed(
                f"{len(failures)} message(s) not acknowledged by the broker, first: {failures[0]!r}", failures
            )

    def close(self) -> None:
        self._producer.close(timeout=CLOSE_TIMEOUT_S)  # what is still unsent was never acknowledged: resent


# A commit refused because the group is rebalancing or has moved on: retrying cannot succeed (a rebalance
# completes only in poll()), and the partitions' next owner starts from the last committed offsets.
_REBALANCED_ERRORS = (
    "CommitFailedError",
    "RebalanceInProgressError",
    "IllegalGenerationError",
    "UnknownMemberIdError",
)


# Errors of a fetched batch that no retry gets past. (Any error raised while a partition's records are being
# decoded is one too: `_stuck_at` finds those.)
_UNDECODABLE_ERRORS = ("UnsupportedCodecError", "CorruptRecordError", "InvalidRecordError")
# Bounds on the calls that wait for the broker, so that stopping never waits on a broker that is gone.
COMMIT_TIMEOUT_MS = 10_000
CLOSE_TIMEOUT_S = 5.0


class KafkaBusConsumer:
    def __init__(self, bootstrap: str, topic: str, group: str, tuning: ConsumerTuning) -> None:
        self._consumer = make_consumer(bootstrap, topic, group, tuning)

    def poll(self, max_records: int, timeout_ms: int) -> list[Message]:
        """Records, or `UndecodableBatch` when the next batch cannot be decoded.

        kafka-python raises a decoding error once and then, on the next poll, loops forever at full CPU over
        the records it could not decode (3.0.12: the partition's record iterator is exhausted but never
        drained), so such an error is final for this consumer."""
        try:
            records = self._consumer.poll(timeout_ms=timeout_ms, max_records=max_records)
        except Exception as exc:
            from kafka import errors

            stuck = self._stuck_at()
            undecodable = tuple(getattr(errors, name) for name in _UNDECODABLE_ERRORS)
            if isinstance(exc, errors.RetriableError) and not isinstance(exc, undecodable):
                raise  # the broker is gone or moving (connection, metadata): not about a batch; poll again
            if stuck is None and not isinstance(exc, undecodable):
                raise  # not about a batch: the caller polls again
            raise UndecodableBatch(*(stuck or (None, None, None)), cause=exc) from exc
        return list(chain.from_iterable(records.values()))

    def _stuck_at(self) -> tuple[str, int, int] | None:
        """The partition and offset the consumer was decoding when it failed, if it was decoding one (from
        kafka-python's fetcher, which keeps the partition it is taking records from)."""
        part = getattr(getattr(self._consumer, "_fetcher", None), "_next_partition_records", None)
        tp = getattr(part, "topic_partition", None)
        if tp is None:
            return None
        return tp.topic, tp.partition, int(part.next_fetch_offset)  # type: ignore[union-attr]

    def partitions(self) -> int:
        return len(self._consumer.assignment())

    def lag(self) -> int | None:
        """Messages behind the partitions' ends, from what the last fetches said (no request of its own);
        None until every assigned partition has been fetched once."""
        behind = 0
        for tp in self._consumer.assignment():
            end = self._consumer.highwater(tp)
            if end is None:
                return None
            behind += max(0, end - self._consumer.position(tp))
        return behind

    def commit(self, messages: Sequence[Message]) -> None:
        from kafka import errors
        from kafka.structs import OffsetAndMetadata, TopicPartition

        rebalanced = tuple(getattr(errors, name) for name in _REBALANCED_ERRORS)

        offsets = {
            TopicPartition(topic, partition): OffsetAndMetadata(offset, "", -1)
            for (topic, partition), offset in offsets_after(messages).items()
        }
        if not offsets:
            return
        try:
            self._consumer.commit(offsets, timeout_ms=COMMIT_TIMEOUT_MS)
        except rebalanced as exc:
            raise CommitRejected(str(exc)) from exc

    def close(self) -> None:
        # Offsets are committed explicitly after each transaction, never on close.
        self._consumer.close(autocommit=False, timeout_ms=int(CLOSE_TIMEOUT_S * 1000))


@dataclass
class KafkaBus:
    bootstrap: str
    tuning: ConsumerTuning = field(default_factory=ConsumerTuning)

    def ensure_topic(self, name: str, partitions: int) -> None:
        if create_topic(self.bootstrap, name, partitions):
            log.info("created topic %s with %d partitions", name, partitions)

    def producer(self) -> KafkaBusProducer:
        return KafkaBusProducer(self.bootstrap)

    def consumer(self, topic: str, group: str) -> KafkaBusConsumer:
        return KafkaBusConsumer(self.bootstrap, topic, group, self.tuning)


# --- in process -------------------------------------------------------------------------------------------


class InProcessBus:
    """Topics as lists in memory, shared by the threads of one process.

    Same delivery contract as Kafka for one consumer per group: per-partition order by key, committed
    offsets per group, redelivery of whatever was polled but not committed when a consumer closes. There is
    no rebalancing: every consumer of a group reads every partition (run one worker per group).
    """

    def __init__(self, default_partitions: int = 1) -> None:
        self.default_partitions = default_partitions
        self._topics: dict[str, list[list[tuple[bytes | None, bytes]]]] = {}
        self._committed: dict[tuple[str, str, int], int] = {}
        self._changed = threading.Condition()

    def ensure_topic(self, name: str, partitions: int) -> None:
        with self._changed:
            self._topics.setdefault(name, [[] for _ in range(max(1, partitions))])

    def producer(self) -> InProcessProducer:
        return InProcessProducer(self)

    def consumer(self, topic: str, group: str) -> InProcessConsumer:
        self.ensure_topic(topic, self.default_partitions)
        return InProcessConsumer(self, topic, group)

    def messages(self, topic: str) -> list[Message]:
        """Everything in a topic, partition by partition (for inspection)."""
        with self._changed:
            partitions = self._topics.get(topic, [])
            return [
                Record(topic, p, offset, key, value)
                for p, log_ in enumerate(partitions)
                for offset, (key, value) in enumerate(log_)
            ]

    def _append(self, topic: str, key: bytes | None, value: bytes) -> None:
        with self._changed:
            partitions = self._topics.setdefault(topic, [[] for _ in range(self.default_partitions)])
            partition = zlib.crc32(key) % len(partitions) if key else 0
            partitions[partition].append((key, value))
            self._changed.notify_all()


class InProcessProducer:
    def __init__(self, bus: InProcessBus) -> None:
        self._bus = bus

    def send(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self._bus._append(topic, key, value)

    def flush(self) -> None:
        return None  # appends are synchronous

    def close(self) -> None:
        return None


class InProcessConsumer:
    def __init__(self, bus: InProcessBus, topic: str, group: str) -> None:
        self._bus = bus
        self._topic = topic
        self._group = group
        with bus._changed:
            count = len(bus._topics[topic])
            self._positions = [bus._committed.get((group, topic, p), 0) for p in range(count)]

    def poll(self, max_records: int, timeout_ms: int) -> list[Message]:
        with self._bus._changed:
            self._bus._changed.wait_for(self._has_more, timeout=timeout_ms / 1000)
            out: list[Message] = []
            for p, log_ in enumerate(self._bus._topics[self._topic]):
                while self._positions[p] < len(log_) and len(out) < max_records:
                    key, value = log_[self._positions[p]]
                    out.append(Record(self._topic, p, self._positions[p], key, value))
                    self._positions[p] += 1
            return out

    def partitions(self) -> int:
        return len(self._positions)

    def lag(self) -> int:
        with self._bus._changed:
            logs = self._bus._topics[self._topic]
            return sum(len(log_) - self._positions[p] for p, log_ in enumerate(logs))

    def _has_more(self) -> bool:
        logs = self._bus._topics[self._topic]
        return any(self._positions[p] < len(log_) for p, log_ in enumerate(logs))

    def commit(self, messages: Sequence[Message]) -> None:
        with self._bus._changed:
            for (topic, partition), offset in offsets_after(messages).items():
                key = (self._group, topic, partition)
                self._bus._committed[key] = max(self._bus._committed.get(key, 0), offset)

    def close(self) -> None:
        return None
