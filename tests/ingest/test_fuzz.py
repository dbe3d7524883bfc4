"""Fuzzing the worker's real parse-and-apply path, on SQLite and PostgreSQL: arbitrary bytes, arbitrary JSON
(deep, huge numbers, odd unicode, odd times) and damaged events go through `IngestWorker.process`; every
message ends either applied or in the dead-letter topic, exactly once, with `parse_event`'s reason, and the
worker is alive afterwards. Bounded (examples, sizes) to run in CI in seconds; deadline off."""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, select

from ingest.apply import _same_value
from ingest.bus import InProcessBus
from ingest.events import InvalidEvent, JobProgress, JobSubmitted, new_event, parse_event
from ingest.worker import IngestWorker, read_dead_letter
from tests.ingest.test_fastparse import documents, encode
from twin.limits import DEFAULT_MAX_CLOCK_SKEW
from twin.store import Job, TelemetryEvent

# Derandomized: the run's outcome counts (at least 100 dead letters, 30 applied) fell short in about one run
# of six with fresh random examples, a failure that said nothing of the code; the same examples each run
# keep the property's check, and a change of the strategies still draws new ones.
FUZZ = settings(
    max_examples=60, deadline=None, database=None, derandomize=True,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large,
    ],
)  # fmt: skip
STALL_S = 30.0  # a batch of a dozen messages takes milliseconds; this long means the worker is stuck

# --- messages ----------------------------------------------------------------------------------------------

NOW = datetime.now(UTC)
odd_times = st.one_of(
    st.sampled_from([
        "9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59.999999-23:59",
        "0001-01-01T00:00:00+23:59", "1970-01-01T00:00:00Z", "2038-01-19T03:14:08Z",
        (NOW + timedelta(hours=2)).isoformat(), (NOW + timedelta(minutes=59)).isoformat(),
        (NOW - timedelta(days=3660)).isoformat(), NOW.isoformat(),
    ]),
    st.from_regex(r"\A[0-9]{4}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-6][0-9](\.[0-9]{1,9})?(Z|[+-][0-2][0-9]:[0-5][0-9])\Z"),
    st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat()),
)  # fmt: skip
huge_numbers = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([2**31 - 1, 2**31, 2**63, 2**64, -(2**63) - 1, 10**4000]),
    st.floats(allow_nan=True, allow_infinity=True),
)
odd_text = st.one_of(
    st.text(max_size=30),
    st.text(st.characters(codec=None, exclude_categories=()), max_size=10),  # surrogates and controls too
    st.sampled_from(["\x00", "a\x00b", "\ud800", "\udfff\ud800", "😀" * 201, "\u202e", "\ufeff"]),
)
json_values = st.recursive(
    st.none() | st.booleans() | huge_numbers | odd_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(odd_text, inner, max_size=4),
    max_leaves=20,
)
FIELDS = ["ts", "event_id", "job_id", "cluster_id", "type", "schema_version", "payload"]
PAYLOAD_FIELDS = ["number_gpus", "gpu_count", "batch_size", "model_name", "node_id", "tokens_processed",
                  "train_runtime", "model_load_time", "node_ids", "status", "reason"]  # fmt: skip


@st.composite
def twisted_events(draw: st.DrawFn) -> bytes:
    """A valid-looking event (from the contract's generator) with an envelope or payload field replaced by an
    odd time, a huge number, odd text or any JSON value."""
    document: dict[str, Any] = draw(documents())
    odd = st.one_of(odd_times, huge_numbers, odd_text, json_values)
    if draw(st.booleans()) or not isinstance(document.get("payload"), dict):
        name = draw(st.sampled_from(FIELDS))
        document[name] = draw(odd_times) if name == "ts" and draw(st.booleans()) else draw(odd)
    else:
        document["payload"][draw(st.sampled_from(PAYLOAD_FIELDS))] = draw(odd)
    return json.dumps(document, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")


@st.composite
def deep(draw: st.DrawFn) -> bytes:
    """A valid envelope whose payload (or the whole message) is nested hundreds to 100,000 levels deep."""
    depth = draw(st.sampled_from([500, 999, 1000, 1001, 5000, 100_000]))
    opening, closing = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
    nested = (opening * depth + "1" + closing * depth).encode()
    if draw(st.booleans()):
        return nested
    base = json.loads(encode(draw(documents()), 0))
    base["payload"] = "@@"
    return json.dumps(base).encode().replace(b'"@@"', nested)


@st.composite
def long_integers(draw: st.DrawFn) -> bytes:
    """A valid event with an integer literal of thousands of digits (Python reads at most 4300)."""
    base = json.loads(encode(draw(documents()), 0))
    base["payload"] = "@@"
    digits = draw(st.sampled_from([4299, 4300, 4301, 10_000]))
    return json.dumps(base).encode().replace(b'"@@"', b"9" * digits)


def _is_event(raw: bytes) -> bool:
    try:
        parse_event(raw)
    except InvalidEvent:
        return False
    return True


@st.composite
def valid_events(draw: st.DrawFn) -> bytes:
    """An undamaged event (a quarter of the generator's documents) dated in the last year: the worker's
    clock takes it (the generator's times reach years ahead, which are `clock_skew`)."""
    for _ in range(20):
        document = draw(documents())
        document["ts"] = (NOW - timedelta(seconds=draw(st.integers(0, 365 * 86400)))).isoformat()
        raw = encode(document, 0)
        if _is_event(raw):
            return raw
    return new_event(
        "job.progress", JobProgress(tokens_processed=1, tokens_per_second=1), job_id="j"
    ).to_json()


messages = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: json.dumps(v).encode("utf-8", "surrogatepass")),
    valid_events(), valid_events(), documents().map(lambda d: encode(d, 0)),
    twisted_events(), twisted_events(), deep(), long_integers(),
)  # fmt: skip


# Every batch holds an undamaged event somewhere among the others, so that both outcomes occur in every run
# whatever the draws: with the batch drawn from `messages` alone, the applied count (29 one day, 30 or more
# before) moved with the draws and the calendar (absolute times ageing out of the ten-year window).
batches = st.tuples(valid_events(), st.lists(messages, max_size=11)).flatmap(
    lambda drawn: st.permutations([drawn[0], *drawn[1]])
)


# --- the property -------------------------------------------------------------------------------------------


def expected_outcome(raw: bytes, now: datetime) -> tuple[str, str | None]:
    """("applied", event id) or ("dead", reason), by the contract and the worker's clock."""
    try:
        event = parse_event(raw)
    except InvalidEvent as exc:
        return "dead", exc.kind
    if event.ts > now + DEFAULT_MAX_CLOCK_SKEW:
        return "dead", "clock_skew"
    return "applied", str(event.event_id)


def stored_ids(engine: Engine, ids: list[str]) -> set[str]:
    with engine.connect() as connection:
        query = select(TelemetryEvent.event_id).where(TelemetryEvent.event_id.in_(ids))  # type: ignore[attr-defined]
        return {str(value) for value in connection.execute(query).scalars()}


def contradicted(engine: Engine, raw: bytes) -> bool:
    """Whether the store's job contradicts an event: it is another cluster's, or the event submits it with a
    field the job holds otherwise."""
    event = parse_event(raw)
    with engine.connect() as connection:
        job = connection.execute(select(Job).where(Job.job_id == event.job_id)).one_or_none()
    if job is None:
        return False
    if job.cluster_id != event.cluster_id:
        return True
    return event.type == "job.submitted" and any(
        value is not None and getattr(job, name) is not None and not _same_value(getattr(job, name), value)
        for name, value in dict(event.payload).items()
    )


def process_or_fail(worker: IngestWorker, polled: list[Any]) -> bool:
    """`worker.process` in a thread: a stall (a retry loop over one message) fails the test, not the run."""
    stop = threading.Event()
    done: list[bool] = []
    thread = threading.Thread(target=lambda: done.append(worker.process(polled, stop)), daemon=True)
    thread.start()
    thread.join(STALL_S)
    if thread.is_alive():
        stop.set()
        thread.join(10)
        raise AssertionError(f"the worker stalled on: {[m.value[:200] for m in polled]!r}")
    return done == [True]


def test_every_message_is_applied_or_dead_lettered_exactly_once(engine: Engine) -> None:
    bus = InProcessBus()
    seen: Counter[str] = Counter()  # outcomes over the run: the property means something only if both occur

    @FUZZ
    @given(batches)
    def one_batch(batch: list[bytes]) -> None:
        topic = f"fuzz-{uuid.uuid4().hex[:8]}"
        producer = bus.producer()
        for n, raw in enumerate(batch):
            producer.send(topic, raw, f"k{n}".encode())
        worker = IngestWorker(engine, bus.consumer(topic, "g"), producer, dlq_topic=f"{topic}.dlq")
        now = datetime.now(UTC)
        polled = worker.consumer.poll(100, 0)
        assert len(polled) == len(batch)
        assert process_or_fail(worker, polled)
        letters: Counter[tuple[int, int]] = Counter()
        kinds: dict[tuple[int, int], str] = {}
        for record in bus.messages(f"{topic}.dlq"):
            letter, original = read_dead_letter(record.value or b"")
            where = (int(letter["partition"]), int(letter["offset"]))  # type: ignore[call-overload]
            letters[where] += 1
            kinds[where] = str(letter["kind"])
            assert original == next(m.value for m in polled if (m.partition, m.offset) == where)
        expected = {(m.partition, m.offset): expected_outcome(m.value or b"", now) for m in polled}
        applied_ids = [ident for outcome, ident in expected.values() if outcome == "applied" and ident]
        in_store = stored_ids(engine, applied_ids)
        for where, (outcome, detail) in expected.items():
            seen[outcome] += 1
            if outcome == "dead":
                assert letters[where] == 1 and kinds[where] == detail, (where, detail, kinds.get(where))
            elif kinds.get(where) == "conflict":  # valid, but a job the store holds contradicts it
                raw = next(m.value for m in polled if (m.partition, m.offset) == where)
                assert letters[where] == 1 and contradicted(engine, raw), raw
                seen["conflict"] += 1
            else:
                assert letters[where] == 0, f"a valid event was dead-lettered: {kinds[where]}"
                assert detail in in_store

    one_batch()
    assert seen["applied"] >= 30 and seen["dead"] >= 100, seen
    # Alive afterwards: a good event is applied.
    event = new_event("job.submitted", JobSubmitted(
        model_name="m", method="lora", gpu_model="L40S", number_gpus=1, number_nodes=1, batch_size=1,
        tokens_per_sample=1,
    ), job_id="after-the-fuzz")  # fmt: skip
    producer = bus.producer()
    producer.send("after", event.to_json(), b"after-the-fuzz")
    worker = IngestWorker(engine, bus.consumer("after", "g"), producer, dlq_topic="after.dlq")
    assert process_or_fail(worker, worker.consumer.poll(10, 0))
    assert stored_ids(engine, [str(event.event_id)]) == {str(event.event_id)}
