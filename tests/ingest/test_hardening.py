"""No message stops or stalls ingest (issue 10): values Python or the store cannot hold are refused by the
schema, events dated ahead of the worker's clock (or before the store's record) are dead-lettered, any
failure to parse one message dead-letters that message, and an event the store refuses is isolated on SQLite
as on PostgreSQL."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, insert, select

from finetwin.settings import Settings
from ingest.apply import apply_events
from ingest.bus import Record
from ingest.events import InvalidEvent, JobSubmitted, NodeStatus, new_event, parse_event
from ingest.worker import IngestWorker, parse_message, read_dead_letter
from tests.conftest import unique
from tests.ingest.conftest import new_topic, produce, read_topic, store_count, worker_thread
from twin.cluster import MAX_GPUS_PER_NODE
from twin.limits import STORE_INT_MAX
from twin.retention import prune
from twin.store import Job, Node, TelemetryEvent

SUBMITTED: dict[str, Any] = {
    "model_name": "llama3-8b", "method": "lora", "gpu_model": "NVIDIA-A100-SXM4-80GB", "number_gpus": 4,
    "number_nodes": 1, "batch_size": 16, "tokens_per_sample": 2048,
}  # fmt: skip


def document(
    kind: str = "job.submitted", payload: dict[str, Any] | None = None, **envelope: Any
) -> dict[str, Any]:
    return {
        "schema_version": 1, "event_id": str(uuid.uuid4()), "ts": datetime.now(UTC).isoformat(),
        "job_id": "j-1", "type": kind, "payload": SUBMITTED if payload is None else payload, **envelope,
    }  # fmt: skip


def submitted(**changes: Any) -> bytes:
    return json.dumps(document(payload=SUBMITTED | changes)).encode()


def node_status(node_id: str, status: str, ts: datetime, **changes: Any) -> bytes:
    payload = {"node_id": node_id, "gpu_model": "L40S", "gpu_count": 8, "status": status} | changes
    return json.dumps(document("node.status", payload, job_id=None, ts=ts.isoformat())).encode()


def huge_integer_literal() -> bytes:
    """An integer literal longer than Python's int-from-string limit (4300 digits), in a valid event."""
    return submitted().replace(b'"number_gpus": 4', b'"number_gpus": ' + b"9" * 5000)


def deeply_nested() -> bytes:
    """JSON nested deeper than Python's recursion limit, in a valid envelope."""
    depth = 100_000
    return submitted().replace(b'"number_gpus": 4', b'"number_gpus": ' + b"[" * depth + b"]" * depth)


# Each: a message, the reason the worker must dead-letter it with, and a fragment of the detail.
UNREADABLE: dict[str, tuple[bytes, str, str]] = {
    "integer literal of 5000 digits": (huge_integer_literal(), "schema", "number"),
    "nested 100,000 deep": (deeply_nested(), "schema", "nested"),
    "deep nesting at the top": (b"[" * 100_000 + b"]" * 100_000, "schema", "nested"),
}
OUT_OF_BOUNDS: dict[str, tuple[bytes, str]] = {
    "GPU count beyond 64 bits": (submitted(number_gpus=2**64), "number_gpus"),
    "GPU count beyond the integer column": (submitted(number_gpus=STORE_INT_MAX + 1), "number_gpus"),
    "node GPU count beyond 64 bits": (
        node_status("n", "up", datetime.now(UTC), gpu_count=2**70),
        "gpu_count",
    ),
    "a time after year 9999 in UTC": (json.dumps(document(ts="9999-12-31T23:59:59-01:00")).encode(), "ts"),
    "a time before year 1 in UTC": (json.dumps(document(ts="0001-01-01T00:00:00+01:00")).encode(), "ts"),
    "a time 11 years ago": (
        json.dumps(document(ts=(datetime.now(UTC) - timedelta(days=4020)).isoformat())).encode(),
        "ts",
    ),
    "NUL in a name": (submitted(model_name="llama\x00"), "model_name"),
    "NUL in the job id": (json.dumps(document(job_id="j\x00")).encode(), "job_id"),
    "NaN load time": (
        json.dumps(
            document(
                "job.completed",
                {"train_runtime": 1.0, "dataset_tokens_per_second": 1.0, "model_load_time": float("nan")},
            )
        ).encode(),
        "model_load_time",
    ),  # fmt: skip
}


@pytest.mark.parametrize(("raw", "kind", "fragment"), UNREADABLE.values(), ids=UNREADABLE)
def test_a_message_python_cannot_read_is_refused_with_a_reason_not_an_exception(
    raw: bytes, kind: str, fragment: str
) -> None:
    for parse in (parse_event, parse_message):  # the contract and the worker's fast path agree
        with pytest.raises(InvalidEvent) as caught:
            parse(raw)
        assert caught.value.kind == kind and fragment in caught.value.detail


@pytest.mark.parametrize(("raw", "field"), OUT_OF_BOUNDS.values(), ids=OUT_OF_BOUNDS)
def test_values_the_store_or_python_cannot_hold_fail_the_schema(raw: bytes, field: str) -> None:
    for parse in (parse_event, parse_message):
        with pytest.raises(InvalidEvent) as caught:
            parse(raw)
        assert caught.value.kind == "schema" and field in caught.value.detail


def test_a_schema_detail_names_the_cause_not_what_followed_from_it() -> None:
    """Without number_nodes, its default is worked out from number_gpus: a bad GPU count also read "The
    default factory uses validated data, but at least one validation error occurred" (number_nodes)."""
    payload = {k: v for k, v in SUBMITTED.items() if k != "number_nodes"} | {"number_gpus": 0}
    raw = json.dumps(document(payload=payload)).encode()
    for parse in (parse_event, parse_message):
        with pytest.raises(InvalidEvent) as caught:
            parse(raw)
        assert caught.value.detail == "payload.number_gpus: Input should be greater than or equal to 1"


def test_the_bounds_themselves_are_accepted() -> None:
    """The largest integer the store holds, the most GPUs a node holds, and times just inside the window, are
    events."""
    now = datetime.now(UTC)
    for raw in (
        submitted(number_gpus=STORE_INT_MAX, batch_size=STORE_INT_MAX, fast_moe=STORE_INT_MAX),
        node_status("n", "up", now, gpu_count=MAX_GPUS_PER_NODE),
        json.dumps(document(ts=(now - timedelta(days=3600)).isoformat())).encode(),
        json.dumps(document(ts=(now + timedelta(days=3600)).isoformat())).encode(),
    ):
        assert parse_message(raw) is not None and parse_event(raw) is not None


def test_the_clock_skew_limit_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().max_clock_skew == timedelta(hours=1)
    monkeypatch.setenv("FINETWIN_MAX_CLOCK_SKEW", "PT10M")
    assert Settings().max_clock_skew == timedelta(minutes=10)
    monkeypatch.setenv("FINETWIN_MAX_CLOCK_SKEW", "90")
    assert Settings().max_clock_skew == timedelta(seconds=90)


def test_no_message_stalls_the_worker_on_either_store(kafka_bootstrap: str, engine: Engine) -> None:
    """The issue's messages, through the real worker on Tansu into SQLite and PostgreSQL, interleaved with
    good events: each bad one dead-lettered once with its reason, every good one applied, and the worker
    still alive to apply an event sent afterwards."""
    topic = new_topic(kafka_bootstrap, unique("harden"), partitions=2)
    dlq = new_topic(kafka_bootstrap, f"{topic}.dlq", 1)
    now = datetime.now(UTC)
    bad: dict[bytes, tuple[bytes, str]] = {}
    for n, (raw, kind, _) in enumerate(UNREADABLE.values()):
        bad[f"unreadable-{n}".encode()] = (raw, kind)
    for n, (raw, _) in enumerate(OUT_OF_BOUNDS.values()):
        bad[f"bounds-{n}".encode()] = (raw, "schema")
    ahead = json.dumps(document(ts=(now + timedelta(hours=2)).isoformat(), job_id="ahead")).encode()
    bad[b"ahead"] = (ahead, "clock_skew")
    # The store keeps telemetry from a day ago (twin.retention): a node's report from before that is refused.
    prune(engine, "default", now - timedelta(days=1))
    bad[b"before-horizon"] = (node_status("n-old", "up", now - timedelta(days=2)), "before_retention")
    good = {f"good-{n}".encode(): submitted() for n in range(20)}
    # Ahead of this clock, but within the default skew (1 h): an event.
    good[b"slightly-ahead"] = json.dumps(document(ts=(now + timedelta(minutes=30)).isoformat())).encode()
    stream = [(key, raw) for key, (raw, _) in bad.items()]
    for n, item in enumerate(good.items()):
        stream.insert(2 * n, item)
    # After the good submissions of job j-1: one with another configuration, and another cluster's.
    conflicts = {
        b"resubmitted": (submitted(number_gpus=8), "conflict"),
        b"other-cluster": (json.dumps(document(cluster_id="lab-b")).encode(), "conflict"),
    }
    bad |= conflicts
    stream += [(key, raw) for key, (raw, _) in conflicts.items()]
    produce(kafka_bootstrap, topic, stream)
    with worker_thread(engine, kafka_bootstrap, topic, unique("g"), dlq, batch_size=7) as (worker, thread):
        assert worker.wait_until(lambda s: s.messages >= len(stream), timeout_s=60), worker.stats
        assert (worker.stats.applied, worker.stats.dead_letters) == (len(good), len(bad))
        produce(kafka_bootstrap, topic, [(b"late", submitted())])
        assert worker.wait_until(lambda s: s.applied == len(good) + 1, timeout_s=30)
        assert thread.is_alive()
    assert store_count(engine) == len(good) + 1
    letters = read_topic(kafka_bootstrap, dlq, len(bad))
    assert sorted(letter.key for letter in letters) == sorted(bad)
    for letter in letters:
        record, original = read_dead_letter(letter.value)
        assert (original, record["kind"]) == bad[letter.key], record["detail"]


def test_an_event_the_store_refuses_is_isolated_on_both_stores(engine: Engine) -> None:
    """An event past the schema (here: built without validation, as a bug or an older contract could let
    through) whose value the store cannot hold: the batch is halved until that event is found, it is
    dead-lettered as `store`, and the rest are applied. SQLite's driver refuses an integer beyond 64 bits
    with OverflowError, PostgreSQL with NumericValueOutOfRange."""
    from ingest.bus import InProcessBus

    bus = InProcessBus()
    worker = IngestWorker(engine, bus.consumer("t", "g"), bus.producer(), dlq_topic="t.dlq")
    events = [new_event("job.submitted", JobSubmitted(**SUBMITTED), job_id=f"j-{n}") for n in range(9)]
    events[5] = events[5].model_copy(
        update={"payload": JobSubmitted.model_construct(**(SUBMITTED | {"number_gpus": 2**70}))}
    )
    sources = [Record("t", 0, n, None, b"") for n in range(len(events))]
    result, refused = worker.apply_isolating(events, sources)  # type: ignore[arg-type]
    assert result.applied == 8
    assert [(letter.message.offset, letter.kind) for letter in refused] == [(5, "store")]
    assert any(name in refused[0].detail for name in ("OverflowError", "NumericValueOutOfRange"))
    assert store_count(engine) == 8 and store_count(engine, Job) == 8


def test_an_event_its_job_contradicts_is_isolated_as_a_conflict(engine: Engine) -> None:
    """A second submission of a job with another configuration: dead-lettered alone (`conflict`), the rest
    applied, and the job keeps the configuration it ran with."""
    from ingest.bus import InProcessBus

    bus = InProcessBus()
    worker = IngestWorker(engine, bus.consumer("t", "g"), bus.producer(), dlq_topic="t.dlq")
    events = [new_event("job.submitted", JobSubmitted(**SUBMITTED), job_id=f"c-{n}") for n in range(9)]
    other = JobSubmitted(**(SUBMITTED | {"batch_size": 32}))
    events[5] = new_event("job.submitted", other, job_id="c-2")
    sources = [Record("t", 0, n, None, b"") for n in range(len(events))]
    result, refused = worker.apply_isolating(events, sources)  # type: ignore[arg-type]
    assert result.applied == 8
    assert [(letter.message.offset, letter.kind) for letter in refused] == [(5, "conflict")]
    assert "batch_size 16 -> 32" in refused[0].detail
    with engine.connect() as connection:
        assert connection.execute(select(Job.batch_size).where(Job.job_id == "c-2")).scalar_one() == 16


def test_a_store_outage_is_retried_not_dead_lettered(tmp_path: Any) -> None:
    """The other side of the line: a database that cannot be reached refuses the batch for no event in it,
    so nothing is dead-lettered (the worker retries the batch until it is back)."""
    from ingest.bus import InProcessBus
    from twin.db import make_engine

    engine = make_engine(f"sqlite:///{tmp_path / 'missing-dir' / 'no.db'}")
    bus = InProcessBus()
    worker = IngestWorker(engine, bus.consumer("t", "g"), bus.producer(), dlq_topic="t.dlq")
    event = new_event("job.submitted", JobSubmitted(**SUBMITTED), job_id="j")
    with pytest.raises(Exception) as caught:
        worker.apply_isolating([event], [Record("t", 0, 0, None, b"")])
    assert "unable to open database" in str(caught.value)


def test_a_node_status_dated_in_the_future_does_not_pin_the_node(engine: Engine) -> None:
    """A status stored with a future time (before ingest refused such times, or within the allowed skew)
    gives way to the next report, whatever its time."""
    now = datetime.now(UTC)

    def status(state: str, ts: datetime) -> Any:
        payload = NodeStatus(node_id="l40s-00", gpu_model="L40S", gpu_count=8, status=state)  # type: ignore[arg-type]
        return new_event("node.status", payload, job_id=None, ts=ts)

    apply_events(engine, [status("up", now + timedelta(minutes=30))])
    apply_events(engine, [status("down", now)])
    with engine.connect() as connection:
        assert connection.execute(select(Node.status)).scalar_one() == "down"
    # A row from before the fix, dated years ahead: replaced by the next report too.
    with engine.begin() as connection:
        connection.execute(
            insert(Node).values(
                node_id="h100-07", cluster_id="default", gpu_model="H100", gpu_count=8, status="up",
                updated_at=datetime(2099, 1, 1, tzinfo=UTC),
            )
        )  # fmt: skip
    drained = NodeStatus(node_id="h100-07", gpu_model="H100", gpu_count=8, status="drain")
    apply_events(engine, [new_event("node.status", drained, job_id=None, ts=now)])
    with engine.connect() as connection:
        assert (
            connection.execute(select(Node.status).where(Node.node_id == "h100-07")).scalar_one() == "drain"
        )
    # And an older report still does not overwrite a newer one that is not in the future.
    apply_events(engine, [status("up", now - timedelta(minutes=5))])
    with engine.connect() as connection:
        assert connection.execute(select(Node.status).where(Node.node_id == "l40s-00")).scalar_one() == "down"
    assert store_count(engine, TelemetryEvent) == 4


def test_times_stored_before_the_bounds_do_not_break_the_api(pg_engine: Engine, tmp_path: Any) -> None:
    """Rows PostgreSQL stored before the schema bounded times: year 10000 and 1 BC in UTC and `infinity`,
    which no Python datetime holds, and an event dated year 9999: the cluster, the jobs, a fresh forecast and
    a what-if still answer, with those times unknown (None) and the twin's clock on this side of 9999,
    instead of 500 until the rows are deleted by hand."""
    from fastapi.testclient import TestClient
    from sqlalchemy import text

    from tests.conftest import api_app, api_headers
    from tests.twin.test_store import populate

    populate(pg_engine, datetime.now(UTC))
    job = "INSERT INTO jobs (job_id, cluster_id, state, submitted_at, started_at, updated_at) VALUES "
    with pg_engine.begin() as connection:
        connection.execute(
            text(job + "('far', 'default', 'submitted', '9999-12-31T23:59:59-01:00', NULL, now())")
        )
        connection.execute(
            text(job + "('bc', 'default', 'running', '0001-01-01T00:00:00+01:00', 'infinity', now())")
        )
        connection.execute(text(
            "INSERT INTO nodes (node_id, cluster_id, gpu_model, gpu_count, status, updated_at) VALUES "
            "('far-node', 'default', 'NVIDIA-A100-SXM4-80GB', 8, 'up', '9999-12-31T23:59:59-01:00')"
        ))  # fmt: skip
        connection.execute(text(
            "INSERT INTO telemetry_events (event_id, type, ts, cluster_id, job_id, payload, received_at) "
            "VALUES "
            "(gen_random_uuid(), 'job.submitted', '9999-06-01T00:00:00Z', 'default', 'far', '{}', now())"
        ))  # fmt: skip
    settings = Settings(
        data_dir=tmp_path / "data", models_dir=tmp_path / "models", scheduler_enabled=False, forecast_runs=2
    )
    with TestClient(api_app(settings, pg_engine)) as client:
        headers = api_headers(pg_engine, "operator")
        cluster = client.get("/v1/cluster", headers=headers)
        assert cluster.status_code == 200, cluster.text
        assert {n["node_id"]: n["updated_at"] for n in cluster.json()["nodes"]}["far-node"] is None
        jobs = client.get("/v1/jobs", headers=headers)
        assert jobs.status_code == 200, jobs.text
        far = client.get("/v1/jobs/far", headers=headers)
        assert far.status_code == 200 and far.json()["submitted_at"] is None
        assert client.get("/v1/jobs/bc", headers=headers).status_code == 200
        forecast = client.get("/v1/forecast", headers=headers)
        assert forecast.status_code == 200, forecast.text
        # The event dated year 9999 (Python reads it, ingest now refuses it) does not set the twin's clock.
        assert forecast.json()["start"][:4] == str(datetime.now(UTC).year)
        whatif = client.post("/v1/whatif", json={"runs": 2}, headers=headers)
        assert whatif.status_code == 200, whatif.text
