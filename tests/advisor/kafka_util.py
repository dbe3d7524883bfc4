"""Reading a whole topic in tests (every partition from the earliest offset to its end)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer, TopicPartition


@dataclass(frozen=True)
class Message:
    key: str
    headers: dict[str, str]
    value: dict[str, Any]
    partition: int
    offset: int


def read_topic(bootstrap: str, topic: str, timeout_s: float = 20.0) -> list[Message]:
    """Every message on `topic` now. Reads until each partition's position reaches its end offset, which
    on Tansu is a lower bound reached only by fetching the last batch whole (see advisor.outbox)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        if not tps:
            return []
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        consumer.seek_to_beginning(*tps)
        messages: list[Message] = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"could not read {topic} to its end"
            for tp, records in consumer.poll(timeout_ms=200).items():
                for r in records:
                    headers = {k: v.decode() for k, v in (r.headers or [])}
                    messages.append(
                        Message(r.key.decode(), headers, json.loads(r.value), tp.partition, r.offset)
                    )
        return messages
    finally:
        consumer.close()
