"""The telemetry contract refuses what is not an event, with a reason the dead-letter topic can carry."""

from __future__ import annotations

import json
import uuid

import pytest

from ingest.events import (
    MAX_MESSAGE_BYTES,
    InvalidEvent,
    JobSubmitted,
    JobSubmittedEvent,
    NodeStatus,
    new_event,
    parse_event,
)


def _submitted() -> dict:
    event = new_event(
        "job.submitted",
        JobSubmitted(
            model_name="llama3.1-8b",
            method="lora",
            gpu_model="L40S",
            number_gpus=2,
            number_nodes=1,
            batch_size=8,
            tokens_per_sample=1024,
        ),  # fmt: skip
        job_id="j-1",
    )
    return json.loads(event.to_json())


def test_round_trip_keeps_every_field() -> None:
    document = _submitted()
    event = parse_event(json.dumps(document).encode())
    assert isinstance(event, JobSubmittedEvent)
    assert event.payload.number_gpus == 2 and event.key == "j-1"
    assert json.loads(event.to_json()) == document


def test_node_events_are_keyed_by_node() -> None:
    event = new_event(
        "node.status", NodeStatus(node_id="n7", gpu_model="L40S", gpu_count=8, status="up"), job_id=None
    )
    assert parse_event(event.to_json()).key == "n7"


@pytest.mark.parametrize(
    ("mutate", "kind", "fragment"),
    [
        (lambda d: d.update(type="job.exploded"), "unknown_type", "job.exploded"),
        (lambda d: d.pop("type"), "unknown_type", "None"),
        (lambda d: d.update(schema_version=2), "schema", "schema_version 2"),
        (lambda d: d["payload"].update(number_gpus="two"), "schema", "number_gpus"),
        (lambda d: d["payload"].update(number_gpus=2.5), "schema", "number_gpus"),
        (lambda d: d["payload"].update(number_gpus=0), "schema", "number_gpus"),
        (lambda d: d["payload"].pop("batch_size"), "schema", "batch_size"),
        (lambda d: d["payload"].update(method="qlora"), "schema", "method"),
        (lambda d: d["payload"].update(surprise=1), "schema", "surprise"),
        (lambda d: d.update(event_id="not-a-uuid"), "schema", "event_id"),
        (lambda d: d.update(ts="2026-11-29T12:00:00"), "schema", "ts"),  # no offset: ambiguous
        (lambda d: d.pop("job_id"), "schema", "job_id"),
    ],
)
def test_schema_violations_say_what_is_wrong(mutate, kind: str, fragment: str) -> None:  # type: ignore[no-untyped-def]
    document = _submitted()
    mutate(document)
    with pytest.raises(InvalidEvent) as caught:
        parse_event(json.dumps(document).encode())
    assert caught.value.kind == kind
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        (b"{not json", "not_json"),
        (b"\xff\xfe\x00", "not_json"),
        (b"[1, 2]", "schema"),
        (b'"a string"', "schema"),
        (b"x" * (MAX_MESSAGE_BYTES + 1), "too_large"),
    ],
)
def test_non_events(raw: bytes, kind: str) -> None:
    with pytest.raises(InvalidEvent) as caught:
        parse_event(raw)
    assert caught.value.kind == kind


def test_event_ids_are_uuids() -> None:
    document = _submitted()
    assert uuid.UUID(document["event_id"])
