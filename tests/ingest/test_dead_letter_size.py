"""A dead-letter record stays under Kafka's default limit of a record (1,048,588 bytes) whatever the message
it carries holds (the probe's D3): its original went through JSON whole, where a control byte is escaped to 6
bytes and bytes that are not UTF-8 grow by a third, so a 175 KB message of control bytes made a record a
broker with default settings refuses, and the worker retried that batch forever without committing."""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kafka.errors import MessageSizeTooLargeError
from sqlalchemy import Engine

from finetwin.schema import migrate
from ingest.bus import DeliveryFailed, InProcessBus, InProcessProducer, Record
from ingest.events import MAX_MESSAGE_BYTES
from ingest.worker import (
    FALLBACK_DEAD_LETTER_BYTES,
    MAX_DEAD_LETTER_BYTES,
    MAX_DEAD_LETTER_KEY_BYTES,
    DeadLetter,
    IngestWorker,
    read_dead_letter,
)
from tests.ingest.conftest import store_count
from twin.db import make_engine

KAFKA_DEFAULT_MAX_BYTES = 1_048_588  # message.max.bytes and max.message.bytes, as Kafka ships them
JUST_UNDER = MAX_MESSAGE_BYTES - 10  # dead-lettered as `not_json`, not `too_large`
MEGABYTE = 1024 * 1024

# The worst messages for the record's size: each byte escaped to 6 in JSON, or base64, at the largest size
# dead-lettered for its content, and at the largest a broker with default settings delivers; and whether
# the record cuts them (base64 of the message limit fits whole).
WORST: dict[str, tuple[bytes, str, bool]] = {
    "control bytes, just under the message limit": (b"\x01" * JUST_UNDER, "not_json", True),
    "control bytes, 1 MB": (b"\x01" * MEGABYTE, "too_large", True),
    "quotes and backslashes, 1 MB": (b'"\\' * (MEGABYTE // 2), "too_large", True),
    "invalid UTF-8, just under the message limit": (b"\xff" * JUST_UNDER, "not_json", False),
    "invalid UTF-8, 1 MB": (b"\xff\xfe" * (MEGABYTE // 2), "too_large", True),
    "4-byte characters, 1 MB": ("😀".encode() * (MEGABYTE // 4), "too_large", True),
    "text, then one bad byte at the end": (b"\x01" * (MEGABYTE - 1) + b"\xff", "too_large", True),
}


def letter(
    value: bytes | None, kind: str = "not_json", key: bytes | None = b"job-1", detail: str = "bad"
) -> DeadLetter:
    return DeadLetter(Record("finetwin.telemetry", 3, 42, key, value), kind, detail)


@pytest.mark.parametrize(("value", "kind", "cut"), WORST.values(), ids=WORST)
def test_a_record_fits_under_kafka_s_default_limit_whatever_its_original_holds(
    value: bytes, kind: str, cut: bool
) -> None:
    dead = letter(value, kind)
    record = dead.record()
    assert len(record) <= MAX_DEAD_LETTER_BYTES < KAFKA_DEFAULT_MAX_BYTES
    fields, start = read_dead_letter(record)
    assert fields["truncated"] is cut and fields["kind"] == kind
    assert value.startswith(start) and (len(start) < len(value) if cut else start == value)
    assert len(start) > MAX_DEAD_LETTER_BYTES // 12  # the start kept is not a token one
    # What was cut is described: the whole's size and digest, to match it against the producer's copy.
    assert fields["original_bytes"] == len(value)
    assert fields["original_sha256"] == hashlib.sha256(value).hexdigest()


def test_the_start_of_text_is_kept_as_text() -> None:
    """A cut falls on a character's start, so the start of UTF-8 text is still readable text."""
    fields, start = read_dead_letter(letter("é😀".encode() * 300_000, "too_large").record())
    assert fields["encoding"] == "text" and fields["truncated"] is True
    start.decode("utf-8")  # no partial character at the cut


def test_an_ordinary_bad_message_keeps_its_original_whole() -> None:
    """The largest ordinary messages still travel whole: text of the message limit, and its base64."""
    for value in (b'{"type": "job.exploded"}', b"x" * MAX_MESSAGE_BYTES, b"\xff" * MAX_MESSAGE_BYTES, b""):
        fields, original = read_dead_letter(letter(value).record())
        assert original == value and fields["truncated"] is False
        assert fields["original_bytes"] == len(value)
    fields, original = read_dead_letter(letter(None).record())  # a tombstone
    assert original == b"" and fields["truncated"] is False


def test_a_long_detail_is_cut_and_cannot_break_the_bound() -> None:
    """An unknown `type` of 200,000 control characters is repeated in the detail; alone, it made a record of
    over a megabyte."""
    detail = f"type {chr(1) * 200_000!r} is not one of job.submitted, ..."
    record = letter(b"{}", "unknown_type", detail=detail).record()
    fields, original = read_dead_letter(record)
    assert len(record) < 20_000 and original == b"{}"
    assert str(fields["detail"]).endswith(f"(cut: {len(detail):,} characters in all)")


def test_a_key_longer_than_any_id_is_not_sent_and_the_record_says_so() -> None:
    long_key = b"k" * (MAX_DEAD_LETTER_KEY_BYTES + 1)
    dead = letter(b"\x01" * MEGABYTE, "too_large", key=long_key)
    fields, _ = read_dead_letter(dead.record())
    assert dead.key is None and fields["key_dropped_bytes"] == len(long_key)
    assert letter(b"x", key=b"job-1").key == b"job-1" and letter(b"x", key=None).key is None


def test_a_record_fits_any_limit_above_its_own_fields() -> None:
    for limit in (FALLBACK_DEAD_LETTER_BYTES, 100_000, 500_001):
        for value, kind, _ in WORST.values():
            assert len(letter(value, kind).record(limit)) <= limit


# --- the worker, against a broker that refuses large records ------------------------------------------------


class SizeLimitedProducer:
    """A broker whose dead-letter topic takes records of at most `limit` bytes (key and value): a larger one
    is refused at flush, as kafka-python reports a broker's MESSAGE_TOO_LARGE."""

    def __init__(self, bus: InProcessBus, limit: int) -> None:
        self.inner, self.limit = InProcessProducer(bus), limit
        self.failures: list[BaseException] = []
        self.refused = 0

    def send(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        if len(value) + len(key or b"") > self.limit:
            self.refused += 1
            self.failures.append(MessageSizeTooLargeError(f"{len(value)} bytes"))
        else:
            self.inner.send(topic, value, key)

    def flush(self) -> None:
        failures, self.failures = self.failures, []
        if failures:
            raise DeliveryFailed(f"{len(failures)} message(s) refused", failures)

    def close(self) -> None:
        return None


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'finetwin.db'}")
    migrate(engine)
    yield engine
    engine.dispose()


def node_status() -> bytes:
    return json.dumps({
        "schema_version": 1, "event_id": str(uuid.uuid4()), "ts": datetime.now(UTC).isoformat(),
        "type": "node.status",
        "payload": {"node_id": "n0", "gpu_model": "L40S", "gpu_count": 8, "status": "up"},
    }).encode()  # fmt: skip


def process_with_deadline(worker: IngestWorker, messages: list[Record], deadline_s: float = 8.0) -> bool:
    """`worker.process`, stopped after `deadline_s`: a worker stuck retrying returns False, not forever."""
    stop = threading.Event()
    timer = threading.Timer(deadline_s, stop.set)
    timer.start()
    try:
        return worker.process(messages, stop)  # type: ignore[arg-type]
    finally:
        timer.cancel()


@pytest.mark.parametrize(
    ("limit", "bound"),
    [(KAFKA_DEFAULT_MAX_BYTES, MAX_DEAD_LETTER_BYTES), (100_000, FALLBACK_DEAD_LETTER_BYTES)],
    ids=["kafka-default-limit", "dlq-topic-with-a-smaller-limit"],
)
def test_a_poison_message_does_not_stall_the_worker(sqlite_engine: Engine, limit: int, bound: int) -> None:
    """The probe's case: 256 KiB - 10 bytes of control bytes, then a good event, in one batch. With Kafka's
    default limit the record is under it from the start; with a DLQ topic that takes less, the refused
    record is sent again cut to FALLBACK_DEAD_LETTER_BYTES. Either way the batch is committed."""
    bus = InProcessBus()
    bus.ensure_topic("t", 1)
    producer = SizeLimitedProducer(bus, limit)
    worker = IngestWorker(sqlite_engine, bus.consumer("t", "g"), producer, dlq_topic="t.dlq")  # type: ignore[arg-type]
    poison, good = b"\x01" * JUST_UNDER, node_status()
    messages = [Record("t", 0, 0, b"poison", poison), Record("t", 0, 1, b"n0", good)]
    assert process_with_deadline(worker, messages), "the worker never committed the batch"
    assert worker.stats.dead_letters == 1 and store_count(sqlite_engine) == 1
    [sent] = bus.messages("t.dlq")
    assert sent.key == b"poison" and len(sent.value or b"") <= bound
    fields, start = read_dead_letter(sent.value or b"")
    assert fields["kind"] == "not_json" and fields["truncated"] is True and poison.startswith(start)
    assert fields["original_sha256"] == hashlib.sha256(poison).hexdigest()
