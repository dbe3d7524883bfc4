"""Publishing one record at a time with the broker's answer, and finding records again by a header: what the
advisor's outbox relay needs from Kafka (the wiring hands it an `AckedPublisher`; the advisor does not import
ingest, and all Kafka client settings stay here, next to `ingest.bus`).

`publish` blocks until the broker acknowledged the record and returns where it landed, or raises. The
producer never retries on its own (retries 0, one request in flight, linger 0): a failed send is "in doubt"
and the caller reconciles it by reading the topic with `find`, never by resending blindly.

Why "read to the end" is sound on Tansu, whose reported end offsets lag: for a batch of several records
Tansu reports the last batch's base offset + 1, a lower bound of the true end; consuming up to it fetches
that whole last batch, so every record that existed when we asked is read. This producer sends one record
per request, where the two agree.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

from ingest.bus import CLOSE_TIMEOUT_S, make_consumer, make_producer


class TopicNotReadable(RuntimeError):
    """The topic could not be read to its end in time: whatever was looked for may still be on it."""


class AckedPublisher:
    """A lazily created one-record-per-request producer plus a header scan, against `bootstrap`."""

    def __init__(self, bootstrap: str, *, send_timeout_s: float = 15.0, scan_timeout_s: float = 30.0) -> None:
        self.bootstrap = bootstrap
        self.send_timeout_s = send_timeout_s
        self.scan_timeout_s = scan_timeout_s
        self._producer: Any = None

    def _producer_or_new(self) -> Any:
        if self._producer is None:
            self._producer = make_producer(
                self.bootstrap,
                client_id="finetwin-outbox-relay",
                retries=0,  # a failed send is "in doubt": reconciled against the topic, never resent blindly
                # Without retries idempotence adds nothing (and kafka-python warned once per start that it
                # turned it off); the outbox's reconciliation is what keeps each action sent once.
                enable_idempotence=False,
                linger_ms=0,
                max_in_flight_requests_per_connection=1,
            )
        return self._producer

    def publish(
        self, topic: str, key: bytes, value: bytes, headers: Sequence[tuple[str, bytes]] = ()
    ) -> tuple[int, int]:
        """Send one record and wait for the broker's ack; returns (partition, offset). Any failure raises,
        and drops the producer (the next publish starts a fresh one)."""
        try:
            future = self._producer_or_new().send(topic, key=key, value=value, headers=list(headers))
            metadata = future.get(timeout=self.send_timeout_s)
        except BaseException:
            self.reset()
            raise
        return metadata.partition, metadata.offset

    def find(self, topic: str, header: str, values: set[str]) -> dict[str, tuple[int, int]]:
        """Which of `values` the topic holds in `header`, as value -> (partition, offset), reading every
        partition from the earliest offset; raises `TopicNotReadable` when that cannot be done in time."""
        from kafka import TopicPartition

        found: dict[str, tuple[int, int]] = {}
        consumer = make_consumer(self.bootstrap, None, None, client_id="finetwin-outbox-relay-scan")
        try:
            partitions = consumer.partitions_for_topic(topic)
            if not partitions:
                if topic in consumer.topics():  # it exists, but its partitions are not known: try later
                    raise TopicNotReadable(f"no partition metadata for {topic}")
                return found  # no such topic: nothing was ever published to it
            tps = [TopicPartition(topic, p) for p in sorted(partitions)]
            consumer.assign(tps)
            ends = consumer.end_offsets(tps)
            starts = consumer.beginning_offsets(tps)
            remaining = {tp: ends[tp] for tp in tps if ends[tp] > starts[tp]}
            consumer.seek_to_beginning(*tps)
            deadline = time.monotonic() + self.scan_timeout_s
            while remaining and len(found) < len(values):
                if time.monotonic() > deadline:
                    raise TopicNotReadable(f"{topic} not read to its end in {self.scan_timeout_s:.0f} s")
                for tp, records in consumer.poll(timeout_ms=500).items():
                    for record in records:
                        value = dict(record.headers or []).get(header, b"").decode("utf-8", "replace")
                        if value in values:
                            found[value] = (tp.partition, record.offset)
                for tp in list(remaining):
                    if consumer.position(tp) >= remaining[tp]:
                        del remaining[tp]
            return found
        finally:
            consumer.close()

    def reset(self) -> None:
        """Drop the producer (after a failure): the next publish connects afresh."""
        if self._producer is not None:
            with contextlib.suppress(Exception):
                self._producer.close(timeout=CLOSE_TIMEOUT_S)
            self._producer = None

    def close(self) -> None:
        self.reset()
