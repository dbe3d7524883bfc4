"""The ingest consumer loop: poll a batch, validate each message, dead-letter the bad ones, apply the good
ones in one transaction, and only then commit the offsets.

Crash anywhere and the uncommitted batch is redelivered; the store applies each `event_id` once, so
redelivery is harmless. Bad input never stops the loop: a message that is not an event goes to the
dead-letter topic with its reason, and an event the database refuses (say, a number too big for its column)
is isolated from its batch and dead-lettered too. Infrastructure trouble (database or broker down) is
retried with backoff, without committing, until it clears or the worker is stopped.
"""

from __future__ import annotations

import base64
import gc
import hashlib
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from prometheus_client import Counter, Gauge
from sqlalchemy import Engine
from sqlalchemy.exc import (
    DBAPIError,
    DisconnectionError,
    InterfaceError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout

from ingest.apply import AnyEvent, ApplyResult, BatchHook, ConflictingEvent, apply_events
from ingest.bus import (
    BusConsumer,
    BusProducer,
    CommitRejected,
    Message,
    UndecodableBatch,
    refused_for_size,
)
from ingest.events import InvalidEvent, parse_event
from ingest.fastparse import NotFast, decode_event
from twin.limits import DEFAULT_MAX_CLOCK_SKEW

log = logging.getLogger(__name__)

APPLIED = Counter(
    "finetwin_ingest_events_applied", "Telemetry events applied to the store for the first time"
)
DUPLICATES = Counter(
    "finetwin_ingest_duplicate_events", "Telemetry events skipped because their event_id was already applied"
)
DEAD_LETTERS = Counter(
    "finetwin_ingest_dead_letters", "Messages sent to the dead-letter topic, by reason", ["kind"]
)
BATCHES = Counter("finetwin_ingest_batches", "Batches applied and committed")
UNDECODABLE = Counter(
    "finetwin_ingest_undecodable_batches",
    "Record batches the consumer could not decode (a compression codec it lacks, a corrupt batch); ingest "
    "stops at the first",
    ["topic", "partition"],
)
ASSIGNED = Gauge(
    "finetwin_ingest_assigned_partitions", "Telemetry partitions assigned to this process's ingest consumer"
)
LAG = Gauge(
    "finetwin_ingest_lag_messages",
    "Telemetry messages on this process's partitions not yet polled (high watermark minus position)",
)

# Why a message is dead-lettered: the first four from `parse_event`, then the worker's clock and the store.
DEAD_LETTER_KINDS = (
    "not_json", "too_large", "unknown_type", "schema", "clock_skew", "store", "conflict", "before_retention"
)  # fmt: skip
MAX_BACKOFF_S = 5.0
STATS_LOG_INTERVAL_S = 10.0
_T = TypeVar("_T")


@dataclass
class WorkerStats:
    """This worker's totals since it started (the Prometheus counters sum every worker of the process)."""

    messages: int = 0
    applied: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    batches: int = 0


# A dead-letter record's largest value. Kafka refuses a record over its broker's `message.max.bytes` and its
# topic's `max.message.bytes`, by default 1,048,588 bytes (1 MiB + 12), and the worker then retried the batch
# forever without committing: the partition stalled behind one bad message. A record carries its original
# through JSON, where a control byte is escaped to 6 (`\u0001`) and bytes that are not UTF-8 grow by a third
# (base64), so a 175 KB message made a record over the limit. 900,000 leaves room under it for the key
# (at most MAX_DEAD_LETTER_KEY_BYTES) and Kafka's own framing of the record and its batch (under 100 bytes).
MAX_DEAD_LETTER_BYTES = 900_000
# What a record is cut to when the broker refuses even that, for its size (a DLQ topic created with a smaller
# `max.message.bytes`): any event (a few hundred bytes) is still carried whole, with its reason.
FALLBACK_DEAD_LETTER_BYTES = 16 * 1024
# A key is kept up to this size: a job or node id (the key producers send) is at most 200 characters.
MAX_DEAD_LETTER_KEY_BYTES = 4096
# The reason is cut to this many characters (escaped in JSON: at most 12 bytes each): a detail repeats what
# it refused (an unknown `type` of 200 KB), and that repetition must not be what breaks the size bound.
MAX_DETAIL_CHARS = 1000


@dataclass(frozen=True, slots=True)
class DeadLetter:
    message: Message
    kind: str  # one of DEAD_LETTER_KINDS
    detail: str

    @property
    def key(self) -> bytes | None:
        """The original key, which keeps a job's dead letters in one partition; None if it is too long to
        send under the size bound (the record then says how long it was)."""
        key = self.message.key
        return key if key is None or len(key) <= MAX_DEAD_LETTER_KEY_BYTES else None

    def record(self, max_bytes: int = MAX_DEAD_LETTER_BYTES) -> bytes:
        """The dead-letter value: why, where the message came from, and the message itself, untouched when
        the record fits in `max_bytes`; otherwise as much of its start as fits (`truncated`). Either
        way the record says the original's size and SHA-256."""
        value = self.message.value or b""  # a tombstone (no value) is dead-lettered as empty
        about = self._about(value)
        whole = _record_json(about, value, truncated=False)
        if len(whole) <= max_bytes:
            return whole
        return _cut_record(about, value, max_bytes)

    def _about(self, value: bytes) -> dict[str, object]:
        """Every field of the record but the original's text and encoding."""
        detail = self.detail
        if len(detail) > MAX_DETAIL_CHARS:
            detail = f"{detail[:MAX_DETAIL_CHARS]}... (cut: {len(detail):,} characters in all)"
        about: dict[str, object] = {
            "kind": self.kind,
            "detail": detail,
            "topic": self.message.topic,
            "partition": self.message.partition,
            "offset": self.message.offset,
            "original_bytes": len(value),
            "original_sha256": hashlib.sha256(value).hexdigest(),
            "dead_lettered_at": datetime.now(UTC).isoformat(),
        }
        key = self.message.key
        if key is not None and self.key is None:
            about["key_dropped_bytes"] = len(key)
        return about


def _record_json(about: dict[str, object], original: bytes, *, truncated: bool) -> bytes:
    try:
        text, encoding = original.decode("utf-8"), "text"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(original).decode("ascii"), "base64"
    return json.dumps(about | {"encoding": encoding, "original": text, "truncated": truncated}).encode()


def _cut_record(about: dict[str, object], value: bytes, max_bytes: int) -> bytes:
    """The record with a start of `value` that fits in `max_bytes`. How much a start grows in JSON depends on
    what it holds (6 times for control bytes, a third for base64), so the second try shrinks it by how much it
    grew (exact when it grows evenly, as those do) and any further one halves it: at most six tries, each a
    `json.dumps` of under a megabyte."""
    budget = max(max_bytes - len(_record_json(about, b"", truncated=True)), 0)
    size = min(len(value), budget)
    for attempt in itertools.count():
        record = _record_json(about, value[: _character_start(value, size)], truncated=True)
        if len(record) <= max_bytes or size == 0:  # at 0, only a limit below the record's own fields
            return record
        grown = len(record) - (max_bytes - budget)  # what the start took in the record: more than budget
        # The slack: "base64" is a longer name than "text", and base64 rounds up to 4 characters.
        size = size * (budget - 16) // grown if attempt == 0 else size // 2
    raise AssertionError("unreachable")


def _character_start(value: bytes, size: int) -> int:
    """`size`, moved back (by at most 3 bytes) to the start of a UTF-8 character, so that a start of UTF-8
    text is still text, not base64."""
    end = size
    while end > max(size - 3, 0) and end < len(value) and value[end] & 0xC0 == 0x80:
        end -= 1
    return end


def read_dead_letter(value: bytes) -> tuple[dict[str, object], bytes]:
    """A dead-letter record and the original message bytes it carries (only their start if `truncated`:
    then `original_bytes` and `original_sha256` describe the whole)."""
    record = json.loads(value)
    original = str(record["original"])
    raw = base64.b64decode(original) if record["encoding"] == "base64" else original.encode("utf-8")
    return record, raw


# What a transaction applied, and the events the store refused.
_Applied = tuple[ApplyResult, list[DeadLetter]]


@dataclass
class _Batch:
    messages: Sequence[Message]
    events: list[AnyEvent] = field(default_factory=list)
    sources: list[Message] = field(default_factory=list)  # the message each event came from
    dead: list[DeadLetter] = field(default_factory=list)


def parse_message(raw: bytes) -> AnyEvent:
    """`parse_event`'s verdict, fast: a valid event in its common form is decoded by msgspec (`decode_event`,
    half the CPU); anything else goes through `parse_event`, which accepts it or says why not. Whatever the
    fast path accepts, `parse_event` accepts too, with the same values (tests/ingest/test_fastparse.py)."""
    try:
        return decode_event(raw)
    except NotFast:
        return parse_event(raw)


def refused_for_its_content(exc: BaseException) -> bool:
    """Whether the store refused a batch for a value in it (then halving the batch finds the event), rather
    than for being unreachable or busy (then the whole batch is retried).

    PostgreSQL's refusals are SQLAlchemy errors (DataError, IntegrityError, ...); SQLite's driver refuses
    some values before the statement runs, with plain Python errors SQLAlchemy passes on unwrapped: an
    integer beyond 64 bits (OverflowError), text it cannot encode (UnicodeEncodeError)."""
    if isinstance(exc, (OperationalError, InterfaceError, DisconnectionError, PoolTimeout)):
        return False  # connection lost, database down, locked, out of resources, or no connection free
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return False
    return isinstance(exc, (SQLAlchemyError, OverflowError, UnicodeError))


def _ahead(ts: datetime, now: datetime, limit: timedelta) -> str:
    return (
        f"ts {ts.isoformat()} is {ts - now} ahead of this worker's clock ({now.isoformat()}); "
        f"the limit is {limit} (FINETWIN_MAX_CLOCK_SKEW)"
    )


def _stale_letters(result: ApplyResult, events: list[AnyEvent], sources: list[Message]) -> list[DeadLetter]:
    """The dead letters of the events the store refused for being older than its record (`before_retention`),
    each with the message it came from."""
    if not result.stale:
        return []
    source_of = {id(event): source for event, source in zip(events, sources, strict=True)}
    return [DeadLetter(source_of[id(event)], "before_retention", why) for event, why in result.stale]


def settle_garbage_collector() -> None:
    """Make the cyclic garbage collector cheap for a process that now does nothing but ingest.

    Measured (bench/ingest.py, tmp profiles): it cost ~11 µs of the worker's CPU per event. Everything that
    exists when the worker starts (modules, schemas, pools: ~140k objects) lives as long as the process, yet
    each full collection re-scanned it (~0.1 s a time): frozen, it is never scanned again. And a batch
    allocates tens of thousands of objects that reference counting frees anyway, each 700 of which started
    a collection: every 10,000 is enough to catch the odd reference cycle. Together: ~1.5 µs per event.
    """
    gc.freeze()
    gc.set_threshold(10_000, *gc.get_threshold()[1:])


class IngestWorker:
    """One consumer in the ingest group; `run(stop)` loops until `stop` is set, finishing its batch."""

    def __init__(
        self, engine: Engine, consumer: BusConsumer, producer: BusProducer, *, dlq_topic: str,
        hooks: Sequence[BatchHook] = (), batch_size: int = 500, poll_timeout_ms: int = 500,
        max_clock_skew: timedelta = DEFAULT_MAX_CLOCK_SKEW,
    ) -> None:  # fmt: skip
        self.engine = engine
        self.consumer = consumer
        self.producer = producer
        self.dlq_topic = dlq_topic
        self.hooks = tuple(hooks)
        self.batch_size = batch_size
        self.poll_timeout_ms = poll_timeout_ms
        self.max_clock_skew = max_clock_skew  # events dated further ahead of this clock are dead-lettered
        self.stats = WorkerStats()
        self._changed = threading.Condition()
        self._last_log = time.monotonic()
        self._last_logged_messages = 0

    def run(self, stop: threading.Event) -> None:
        """Consume until `stop` is set, then finish the batch in hand; closes the consumer and producer.
        Raises `UndecodableBatch` (after finishing the batch in hand) when the next batch cannot be decoded.

        While one batch is applied in a second thread, the next one is polled and validated: the database
        does its part of the work while this thread does its own (psycopg releases the GIL as it waits).
        Batches are still applied one at a time and committed in order, each only after it is applied.
        """
        pending: tuple[_Batch, Future[_Applied | None]] | None = None
        with ThreadPoolExecutor(1, thread_name_prefix="ingest-apply") as applier:
            try:
                while not stop.is_set():
                    messages = self._poll(stop)
                    batch = self._parse(messages) if messages else None
                    if pending is not None:
                        self._finish(pending[0], pending[1].result(), stop)
                        pending = None
                    if batch is not None:
                        pending = (batch, applier.submit(self._apply_retrying, batch, stop))
                    self._log_progress()
            finally:
                if pending is not None:  # drain: the batch in hand is applied and committed before exit
                    self._finish(pending[0], pending[1].result(), stop)
                self.close()

    def _poll(self, stop: threading.Event) -> list[Message]:
        backoff = 0.1
        while not stop.is_set():
            try:
                messages = self.consumer.poll(self.batch_size, self.poll_timeout_ms)
                ASSIGNED.set(self.consumer.partitions())  # how the group split the topic (scale-out)
                behind = getattr(self.consumer, "lag", lambda: None)()
                if behind is not None:
                    LAG.set(behind)
                return messages
            except UndecodableBatch as exc:
                # Nothing after this batch in its partition can be read, and skipping it would lose its
                # events: stop, loudly, with its offset uncommitted, so that a supervisor shows the failure
                # and a worker that can decode it (say, with the codec installed) takes it from there.
                UNDECODABLE.labels(topic=str(exc.topic), partition=str(exc.partition)).inc()
                log.critical("%s; ingest stops here (nothing is lost: the offset is not committed)", exc)
                raise
            except Exception:  # the client reconnects by itself; keep polling
                log.exception("poll failed; retrying in %.1f s", backoff)
                stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
        return []

    def close(self) -> None:
        for part in (self.consumer, self.producer):
            try:
                part.close()
            except Exception:  # closing is best effort; nothing uncommitted is lost
                log.warning("closing %s failed", type(part).__name__, exc_info=True)

    def process(self, messages: Sequence[Message], stop: threading.Event | None = None) -> bool:
        """Apply one batch, dead-letter what is not an event, then commit its offsets; each step is retried
        until it succeeds. Returns False if `stop` was set first: the offsets stay uncommitted and the batch
        is redelivered (and its applied events skipped) later."""
        stop = stop or threading.Event()
        batch = self._parse(messages)
        return self._finish(batch, self._apply_retrying(batch, stop), stop)

    def _parse(self, messages: Sequence[Message]) -> _Batch:
        batch = _Batch(messages)
        now = datetime.now(UTC)
        horizon = now + self.max_clock_skew
        for message in messages:
            try:
                event = parse_message(message.value or b"")
            except InvalidEvent as exc:
                batch.dead.append(DeadLetter(message, exc.kind, exc.detail))
                continue
            if event.ts > horizon:  # a clock running ahead: stored, it would outrank every true report
                detail = _ahead(event.ts, now, self.max_clock_skew)
                batch.dead.append(DeadLetter(message, "clock_skew", detail))
                continue
            batch.events.append(event)
            batch.sources.append(message)
        return batch

    def _apply_retrying(self, batch: _Batch, stop: threading.Event) -> _Applied | None:
        return self._retry(
            stop, "applying a batch", lambda: self.apply_isolating(batch.events, batch.sources)
        )

    def _finish(self, batch: _Batch, applied: _Applied | None, stop: threading.Event) -> bool:
        """After the batch's transaction: send its dead letters, then commit its offsets."""
        if applied is None:
            return False
        result, refused = applied
        dead = batch.dead + refused
        if dead and not self._send_dead_letters(dead, stop):
            return False
        if self._retry(stop, "committing offsets", lambda: self._commit(batch.messages)) is None:
            return False
        self._count(len(batch.messages), result, dead)
        return True

    def _retry(self, stop: threading.Event, what: str, action: Callable[[], _T]) -> _T | None:
        """`action()` until it succeeds (its result) or `stop` is set (None), backing off between tries."""
        backoff = 0.1
        while True:
            try:
                return action()
            except Exception:
                if stop.is_set():
                    log.warning("stopping while %s failed; the batch will be redelivered", what)
                    return None
                log.exception("%s failed; retrying in %.1f s", what, backoff)
                stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    def apply_isolating(self, events: list[AnyEvent], sources: list[Message]) -> _Applied:
        """Apply the batch; if the database refuses it for what is in it (not for being down), find the
        events it refuses by halving the batch, and return those as dead letters (`store`)."""
        try:
            result = apply_events(self.engine, events, self.hooks)
            return result, _stale_letters(result, events, sources)
        except ConflictingEvent as exc:  # a job the store holds contradicts an event: find which
            if len(events) == 1:
                return ApplyResult(0, 0), [DeadLetter(sources[0], "conflict", str(exc)[:1000])]
        except Exception as exc:
            if not refused_for_its_content(exc):
                raise  # the database is down or busy: retry the whole batch until it is back
            if len(events) == 1:  # still refused after apply_events' retries: this event
                cause = exc.orig if isinstance(exc, DBAPIError) else exc
                detail = f"{type(cause).__name__}: {cause}"[:1000]
                return ApplyResult(0, 0), [DeadLetter(sources[0], "store", detail)]
        middle = len(events) // 2
        first, refused_first = self.apply_isolating(events[:middle], sources[:middle])
        second, refused_second = self.apply_isolating(events[middle:], sources[middle:])
        merged = ApplyResult(
            first.applied + second.applied, first.duplicates + second.duplicates,
            first.applied_events + second.applied_events, first.stale + second.stale,
        )  # fmt: skip
        return merged, refused_first + refused_second

    def _send_dead_letters(self, dead: Sequence[DeadLetter], stop: threading.Event) -> bool:
        """Send the batch's dead letters until the broker takes them all (False if `stop` came first). When
        the broker refuses a record for its size (a DLQ topic whose `max.message.bytes` is below the records'
        bound), they are sent again cut to FALLBACK_DEAD_LETTER_BYTES: sent as they were, they were refused
        forever, and nothing after them was committed."""
        limit = MAX_DEAD_LETTER_BYTES

        def send() -> bool:
            nonlocal limit
            try:
                return self._dead_letter(dead, limit)
            except Exception as exc:
                if refused_for_size(exc) and limit > FALLBACK_DEAD_LETTER_BYTES:
                    limit = FALLBACK_DEAD_LETTER_BYTES
                    log.warning("the broker refused a dead letter for its size: sending the batch's cut to "
                                "%d bytes (the original's size and SHA-256 kept)", limit)  # fmt: skip
                raise

        return self._retry(stop, "sending dead letters", send) is not None

    def _dead_letter(self, dead: Sequence[DeadLetter], max_bytes: int = MAX_DEAD_LETTER_BYTES) -> bool:
        for letter in dead:
            self.producer.send(self.dlq_topic, letter.record(max_bytes), letter.key)
        self.producer.flush()  # raises if any was not acknowledged: then all are sent again
        return True

    def _commit(self, messages: Sequence[Message]) -> bool:
        try:
            self.consumer.commit(messages)
        except CommitRejected as exc:
            # The group rebalanced under us: the batch is in the store and its new owner will skip it.
            log.warning("offset commit refused after a rebalance (%s); the batch will be redelivered", exc)
        return True

    def _count(self, messages: int, result: ApplyResult, dead: Sequence[DeadLetter]) -> None:
        APPLIED.inc(result.applied)
        DUPLICATES.inc(result.duplicates)
        BATCHES.inc()
        for letter in dead:
            DEAD_LETTERS.labels(kind=letter.kind).inc()
        with self._changed:
            self.stats.messages += messages
            self.stats.applied += result.applied
            self.stats.duplicates += result.duplicates
            self.stats.dead_letters += len(dead)
            self.stats.batches += 1
            self._changed.notify_all()

    def wait_until(self, predicate: Callable[[WorkerStats], bool], timeout_s: float | None = None) -> bool:
        """Block until `predicate(stats)` holds (checked after every batch); False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self.stats), timeout=timeout_s)

    def _log_progress(self) -> None:
        # Only when something came in since the last line: an idle worker says nothing.
        now = time.monotonic()
        if now - self._last_log >= STATS_LOG_INTERVAL_S and self.stats.messages != self._last_logged_messages:
            self._last_log = now
            self._last_logged_messages = self.stats.messages
            s = self.stats
            log.info(
                "ingest: %d messages, %d events applied, %d duplicates, %d dead letters",
                s.messages, s.applied, s.duplicates, s.dead_letters,
            )  # fmt: skip
