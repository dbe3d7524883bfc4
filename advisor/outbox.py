"""The transactional outbox for `finetwin.actions`, and the relay that publishes it.

Writing: `enqueue` adds an outbox row in the caller's transaction, so the state change (an approval)
and the message announcing it are committed together or not at all.

Publishing: the relay reads unsent rows and sends each with its row id in the `finetwin-message-id`
header (key = recommendation id). It marks a row sent only after the broker acknowledged it. Delivery is
therefore at least once, and the message id is the dedupe key. The relay removes the one duplicate a
crash could cause on its own: before sending a row it sends for the first time it commits
`attempts += 1`; a row with attempts > 0 that is still unsent is "in doubt" (the process died, or the
ack was lost, between send and mark), and before resending it the relay reads the topic from the
earliest offset and marks the in-doubt rows it finds there as sent instead of sending them again. So
after any crash the topic holds each approved action exactly once, by message id.

The broker is reached through an `ActionsChannel` the wiring hands in (ingest's `AckedPublisher`, which
holds the Kafka client settings): `publish` blocks until the broker acknowledged the record or raises, and
never retries on its own (a failed send is in doubt, never resent blindly); `find` reads a topic to its end.

One relay per database: it holds a lock while it works (a PostgreSQL advisory lock, or a file lock next
to a SQLite database), which the operating system or the server releases if the process dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Protocol

from sqlalchemy import Connection, Engine, text, update
from sqlmodel import Session, col, select

from advisor.records import OutboxMessage
from advisor.store_errors import log_failure
from twin.store import utcnow

log = logging.getLogger(__name__)

MESSAGE_ID_HEADER = "finetwin-message-id"
CONTENT_TYPE_HEADER = "content-type"
_ADVISORY_LOCK_KEY = 0x66_74_6F_62  # "ftob": the relay's PostgreSQL advisory lock


def enqueue(
    session: Session, *, topic: str, key: str, payload: dict[str, Any], now: datetime | None = None
) -> OutboxMessage:
    """Queue a message in the caller's transaction; the relay publishes it after the commit."""
    message_id = str(uuid.uuid4())
    row = OutboxMessage(
        id=message_id,
        topic=topic,
        key=key,
        payload={"message_id": message_id, **payload},
        created_at=now or utcnow(),
    )
    session.add(row)
    return row


@dataclass(frozen=True)
class Published:
    partition: int
    offset: int


class ActionsChannel(Protocol):
    """What the relay needs from the broker (`ingest.acked.AckedPublisher`, handed in by the wiring)."""

    def publish(
        self, topic: str, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]] = ()
    ) -> tuple[int, int]:
        """Send one record and block until the broker acknowledged it: (partition, offset); raise if it
        did not (the record is then in doubt)."""

    def find(self, topic: str, header: str, values: set[str]) -> dict[str, tuple[int, int]]:
        """Which of `values` the topic holds in `header` (value -> (partition, offset)), read from the
        earliest offset to the end; raise when the topic cannot be read to its end."""

    def close(self) -> None: ...


def _serialize(row: OutboxMessage) -> bytes:
    return json.dumps(row.payload, sort_keys=True, separators=(",", ":")).encode("utf-8")


class OutboxRelay:
    """Publishes unsent outbox rows through `channel`; safe to kill at any instant (see the module
    docstring)."""

    def __init__(self, engine: Engine, channel: ActionsChannel) -> None:
        self.engine = engine
        self.channel = channel

    def send(self, row: OutboxMessage) -> Published:
        """Send one row and wait for the broker's ack."""
        partition, offset = self.channel.publish(
            row.topic,
            row.key.encode("utf-8"),
            _serialize(row),
            [(MESSAGE_ID_HEADER, row.id.encode("utf-8")), (CONTENT_TYPE_HEADER, b"application/json")],
        )
        return Published(partition=partition, offset=offset)

    def find_on_topic(self, topic: str, message_ids: set[str]) -> dict[str, Published]:
        """Which of `message_ids` the topic holds."""
        found = self.channel.find(topic, MESSAGE_ID_HEADER, message_ids)
        return {mid: Published(partition=p, offset=o) for mid, (p, o) in found.items()}

    # --- the round -----------------------------------------------------------------------------------------

    def publish_pending(self, limit: int = 100) -> int:
        """Publish unsent rows, oldest first; returns how many were published (or found already published)."""
        with Session(self.engine) as session:
            rows = list(
                session.exec(
                    select(OutboxMessage)
                    .where(col(OutboxMessage.sent_at).is_(None))
                    .order_by(col(OutboxMessage.created_at), col(OutboxMessage.id))
                    .limit(limit)
                )
            )
        if not rows:
            return 0
        done = 0
        in_doubt: dict[str, set[str]] = {}
        for row in rows:
            if row.attempts > 0:
                in_doubt.setdefault(row.topic, set()).add(row.id)
        already: dict[str, Published] = {}
        for topic, ids in in_doubt.items():
            already.update(self.find_on_topic(topic, ids))
        for row in rows:
            if row.id in already:
                log.info("outbox %s was already on %s; marking it sent without resending", row.id, row.topic)
                self._mark_sent(row.id, already[row.id])
                done += 1
                continue
            self._count_attempt(row.id)
            try:
                published = self.send(row)
            except Exception as exc:  # noqa: BLE001 - any send failure leaves the row in doubt, to reconcile
                self._record_error(row.id, f"{type(exc).__name__}: {exc}")
                log.warning("outbox %s not confirmed by the broker (%s); will reconcile", row.id, exc)
                break
            self._mark_sent(row.id, published)
            done += 1
        return done

    def _count_attempt(self, message_id: str) -> None:
        with Session(self.engine) as session:
            session.execute(
                update(OutboxMessage)
                .where(col(OutboxMessage.id) == message_id)
                .values(attempts=OutboxMessage.attempts + 1)
            )
            session.commit()

    def _mark_sent(self, message_id: str, published: Published) -> None:
        with Session(self.engine) as session:
            session.execute(
                update(OutboxMessage)
                .where(col(OutboxMessage.id) == message_id, col(OutboxMessage.sent_at).is_(None))
                .values(sent_at=utcnow(), partition=published.partition, offset=published.offset)
            )
            session.commit()

    def _record_error(self, message_id: str, error: str) -> None:
        with Session(self.engine) as session:
            session.execute(
                update(OutboxMessage)
                .where(col(OutboxMessage.id) == message_id)
                .values(last_error=error[:2000])
            )
            session.commit()

    def close(self) -> None:
        self.channel.close()


# --- one relay per database ---------------------------------------------------------------------------


@contextlib.contextmanager
def relay_lock(engine: Engine) -> Iterator[bool]:
    """Hold the relay's lock for the block; yields False (and holds nothing) when another relay has it."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as connection:
            query = text("SELECT pg_try_advisory_lock(:k)")
            held = bool(connection.execute(query, {"k": _ADVISORY_LOCK_KEY}).scalar())
            try:
                yield held
            finally:
                if held:
                    _pg_unlock(connection)
        return
    path = _sqlite_lock_path(engine)
    if path is None:  # an in-memory database lives in one process: nothing to share
        yield True
        return
    with open(path, "a+") as handle:
        held = _try_flock(handle)
        try:
            yield held
        finally:
            if held:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _pg_unlock(connection: Connection) -> None:
    with contextlib.suppress(Exception):
        connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _ADVISORY_LOCK_KEY})
        connection.commit()


def _sqlite_lock_path(engine: Engine) -> Path | None:
    database = engine.url.database
    if not database or database == ":memory:":
        return None
    return Path(database).with_name(Path(database).name + ".relay.lock")


def _try_flock(handle: IO[str]) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def relay_round(relay: OutboxRelay) -> int | None:
    """One round of the relay: publish what is pending if this process holds the outbox's lock. Returns how
    many were sent, or None when another relay holds the lock."""
    with relay_lock(relay.engine) as held:
        return relay.publish_pending() if held else None


class RelayThread:
    """The relay loop (in the API process, and in `finetwin relay`): woken after each approval, and every
    `poll_s` for leftovers; a failed round is logged and retried (the channel
    reconnects after a failed send)."""

    def __init__(self, relay: OutboxRelay, poll_s: float) -> None:
        self.relay = relay
        self.poll_s = poll_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="outbox-relay", daemon=True)

    def start(self) -> RelayThread:
        self._thread.start()
        return self

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=timeout_s)
        self.relay.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(timeout=self.poll_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                sent = relay_round(self.relay)
                if sent:
                    log.info("published %d action(s)", sent)
            except Exception as exc:  # noqa: BLE001 - a broker or database hiccup must not end the relay
                log_failure(log, f"outbox relay round failed; retrying in {self.poll_s:.0f} s", exc)
