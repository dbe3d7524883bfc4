"""The ingest worker against the real Tansu broker and a real PostgreSQL: apply, dead-letter, commit."""

from __future__ import annotations

import json
import random
from collections import Counter

import pandas as pd
import pytest
from sqlalchemy import Engine

from finetwin.cli import main
from ingest.events import MAX_MESSAGE_BYTES, InvalidEvent, JobSubmitted, new_event, parse_event
from ingest.replay import ReplayPlan
from ingest.worker import MAX_DEAD_LETTER_BYTES, parse_message, read_dead_letter
from tests.conftest import unique
from tests.ingest.conftest import (
    as_messages,
    assert_store_matches_benchmark,
    new_topic,
    produce,
    read_topic,
    same_event,
    store_count,
    worker_thread,
)


def malformed_messages(good: list[bytes], count: int, seed: int = 1) -> list[tuple[bytes, str]]:
    """`count` bad messages of every kind, each with the reason kind the worker must give it."""
    rng = random.Random(seed)
    template = next(json.loads(raw) for raw in good if b'"job.submitted"' in raw)
    makers = [
        (lambda: bytes(rng.randrange(256) for _ in range(40)), "not_json"),
        (lambda: b'{"schema_version": 1, "type": "job.submitted", "event_id": ', "not_json"),
        (lambda: b"\xff\xfe not utf-8 at all", "not_json"),
        (lambda: json.dumps({**template, "type": "job.exploded"}).encode(), "unknown_type"),
        (lambda: json.dumps({k: v for k, v in template.items() if k != "type"}).encode(), "unknown_type"),
        (lambda: json.dumps({**template, "type": ["job.submitted"]}).encode(), "unknown_type"),
        (lambda: json.dumps({k: v for k, v in template.items() if k != "event_id"}).encode(), "schema"),
        (
            lambda: json.dumps(
                {**template, "payload": {**template["payload"], "number_gpus": "eight"}}
            ).encode(),
            "schema",
        ),
        (
            lambda: json.dumps({**template, "payload": {**template["payload"], "batch_size": -3}}).encode(),
            "schema",
        ),
        (lambda: json.dumps({**template, "ts": "yesterday"}).encode(), "schema"),
        (lambda: json.dumps({**template, "schema_version": 99}).encode(), "schema"),
        (lambda: json.dumps([1, 2, 3]).encode(), "schema"),
    ]
    one_megabyte = (lambda: b'{"padding": "' + b"x" * (1024 * 1024) + b'"}', "too_large")
    bad = []
    for n in range(count):
        # A handful of 1 MB messages (each travels to the DLQ cut to its start, under Kafka's default limit
        # of 1 MB a record); the other kinds in turn.
        make, kind = one_megabyte if n % 200 == 199 else makers[n % len(makers)]
        bad.append((make(), kind))
    return bad


def test_parse_message_agrees_with_parse_event(sample_plan: ReplayPlan) -> None:
    good = [event.to_json() for _, event in sample_plan.events[:3000]]
    for raw in good:
        assert same_event(parse_message(raw), parse_event(raw))
    for raw, kind in malformed_messages(good, 60):
        with pytest.raises(InvalidEvent) as caught:
            parse_message(raw)
        assert caught.value.kind == kind
    submitted = next(json.loads(raw) for raw in good if b'"job.submitted"' in raw)
    payload = submitted["payload"] | {"experiment_id": "e" * 2000}
    big = json.dumps({**submitted, "payload": payload}).encode()
    assert len(big) < MAX_MESSAGE_BYTES and same_event(parse_message(big), parse_event(big))
    too_long = json.dumps({**submitted, "payload": payload | {"experiment_id": "e" * 2001}}).encode()
    with pytest.raises(InvalidEvent):
        parse_message(too_long)


def test_a_batch_redelivered_by_the_broker_is_applied_once(
    kafka_bootstrap: str, pg_engine: Engine, sample_plan: ReplayPlan
) -> None:
    topic = new_topic(kafka_bootstrap, unique("dup"))
    events = [event for _, event in sample_plan.events[:2000]]
    messages = as_messages(events)
    produce(kafka_bootstrap, topic, messages + messages[:700])  # the producer retried: duplicates on the log
    with worker_thread(pg_engine, kafka_bootstrap, topic, unique("g"), f"{topic}.dlq") as (worker, _):
        worker.wait_until(lambda s: s.messages >= 2700, timeout_s=60)
        assert (worker.stats.applied, worker.stats.duplicates, worker.stats.dead_letters) == (2000, 700, 0)
    assert store_count(pg_engine) == 2000


@pytest.mark.slow
def test_malformed_messages_go_to_the_dlq_and_the_good_ones_are_applied(
    kafka_bootstrap: str, pg_engine: Engine, sample_plan: ReplayPlan
) -> None:
    topic = new_topic(kafka_bootstrap, unique("dlq"))
    dlq = new_topic(kafka_bootstrap, f"{topic}.dlq", 1)
    good = as_messages([event for _, event in sample_plan.events[:3000]])
    bad = [
        (f"bad-{n}".encode(), raw, kind)
        for n, (raw, kind) in enumerate(malformed_messages([v for _, v in good], 1000))
    ]
    # A number that does not fit its column (PostgreSQL integer): refused by the schema's bounds, before the
    # database sees it (an event the database still refuses is isolated: tests/ingest/test_hardening.py).
    fits = JobSubmitted(
        model_name="m", method="lora", gpu_model="L40S", number_gpus=8, number_nodes=1, batch_size=8,
        tokens_per_sample=512,
    )  # fmt: skip
    refused = new_event("job.submitted", fits, job_id="too-many-gpus")
    refused = refused.model_copy(update={"payload": fits.model_copy(update={"number_gpus": 10**12})})
    bad.append((b"too-many-gpus", refused.to_json(), "schema"))
    stream: list[tuple[bytes | None, bytes]] = list(good)
    rng = random.Random(9)
    for key, raw, _ in bad:  # interleaved with the good ones
        stream.insert(rng.randrange(len(stream) + 1), (key, raw))
    produce(kafka_bootstrap, topic, stream)
    with worker_thread(pg_engine, kafka_bootstrap, topic, unique("g"), dlq) as (worker, thread):
        worker.wait_until(lambda s: s.messages >= len(stream), timeout_s=120)
        assert worker.stats.applied == len(good) and worker.stats.dead_letters == len(bad)
        letters = read_topic(kafka_bootstrap, dlq, len(bad))
        # The worker is still running: a good event sent now is applied.
        late = new_event("job.submitted", fits, job_id="late")
        produce(kafka_bootstrap, topic, [(b"late", late.to_json())])
        worker.wait_until(lambda s: s.applied == len(good) + 1, timeout_s=30)
        assert thread.is_alive()
    assert store_count(pg_engine) == len(good) + 1
    expected = {key: (raw, kind) for key, raw, kind in bad}
    assert len(letters) == len(bad)
    kinds: Counter[str] = Counter()
    for letter in letters:
        record, original = read_dead_letter(letter.value)
        raw, kind = expected[letter.key]
        assert len(letter.value) <= MAX_DEAD_LETTER_BYTES
        assert record["truncated"] is (len(raw) > MAX_DEAD_LETTER_BYTES)
        assert original == (raw[: len(original)] if record["truncated"] else raw)
        assert record["kind"] == kind and record["detail"] and record["original_bytes"] == len(raw)
        assert record["topic"] == topic and isinstance(record["offset"], int)
        kinds[kind] += 1
    assert set(kinds) == {"not_json", "unknown_type", "schema", "too_large"}
    assert (
        "number_gpus: Input should be less than or equal to 2147483647"
        in read_dead_letter(next(r.value for r in letters if r.key == b"too-many-gpus"))[0]["detail"]
    )


@pytest.mark.slow
def test_the_whole_sample_through_kafka_into_postgresql(
    kafka_bootstrap: str, pg_engine: Engine, sample_table: pd.DataFrame, sample_plan: ReplayPlan
) -> None:
    """End to end: `finetwin replay` of the real sample, ingested into PostgreSQL; every job present with its
    outcome and measured throughput, none missing, none applied twice."""
    from calibrate.loader import bundled_benchmark_path

    topic = new_topic(kafka_bootstrap, unique("e2e"))
    with worker_thread(pg_engine, kafka_bootstrap, topic, unique("g"), f"{topic}.dlq", batch_size=2000) as (
        worker,
        _,
    ):
        # Pinned to the plan's own epoch (in the past): a replay anchored now would run ahead of the worker's
        # clock by its whole span at --speed 0, beyond the worker's bound on clock skew.
        assert main(["replay", "--bench", str(bundled_benchmark_path()), "--seed", "0", "--bootstrap",
                     kafka_bootstrap, "--topic", topic, "--quiet",
                     "--epoch", sample_plan.epoch.isoformat()]) == 0  # fmt: skip
        total = len(sample_plan.events)
        # Under the worker's lock, which its counts are changed together under: polled without it, the
        # message count could be read before the same batch's applied count.
        assert worker.wait_until(lambda s: s.messages >= total, timeout_s=120), "the replay was not ingested"
        assert (worker.stats.applied, worker.stats.dead_letters) == (total, 0)
    assert_store_matches_benchmark(pg_engine, sample_table, sample_plan, "replay-0-")
