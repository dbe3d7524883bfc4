"""Physical bounds of the telemetry contract (the probe's D1, D2, D8 and D11): one accepted report of 1e200 s
at 1e200 tokens/s, of a node with 2^31 - 1 GPUs or of 1e308 W broke every forecast after it; and a progress
report dated after its job ended rewrote the finished job's power. Both parsers (the contract and the worker's
fast path) refuse the same values, with the same reason."""

from __future__ import annotations

import json
import math
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from ingest.apply import apply_events
from ingest.events import (
    MAX_GPU_POWER_WATTS,
    MAX_RUN_SECONDS,
    MAX_TOKENS_PER_SECOND,
    InvalidEvent,
    JobCompleted,
    JobProgress,
    JobStarted,
    JobSubmitted,
    new_event,
    parse_event,
)
from ingest.worker import FALLBACK_DEAD_LETTER_BYTES, MAX_DEAD_LETTER_BYTES, parse_message
from twin.cluster import MAX_GPUS_PER_NODE
from twin.store import Job

DOC = Path(__file__).resolve().parents[2] / "docs" / "telemetry.md"
SUBMITTED: dict[str, Any] = {
    "model_name": "llama3-8b", "method": "lora", "gpu_model": "NVIDIA-A100-SXM4-80GB", "number_gpus": 4,
    "number_nodes": 1, "batch_size": 16, "tokens_per_sample": 2048,
}  # fmt: skip
COMPLETED: dict[str, Any] = {"train_runtime": 600.0, "dataset_tokens_per_second": 2e4}
PROGRESS: dict[str, Any] = {"tokens_processed": 1e6, "tokens_per_second": 2e4}
NODE: dict[str, Any] = {"node_id": "n0", "gpu_model": "L40S", "gpu_count": 8, "status": "up"}
JUST_PAST = math.nextafter  # the next float after a ceiling


def message(kind: str, payload: dict[str, Any], **envelope: Any) -> bytes:
    document = {
        "schema_version": 1, "event_id": str(uuid.uuid4()), "ts": datetime.now(UTC).isoformat(),
        "job_id": None if kind == "node.status" else "j-1", "type": kind, "payload": payload,
    } | envelope  # fmt: skip
    return json.dumps(document).encode()


# Each: the event type, its valid payload, the field, its largest accepted value, and values past it.
CEILINGS: dict[str, tuple[str, dict[str, Any], str, float, list[float]]] = {
    "runtime": ("job.completed", COMPLETED, "train_runtime", MAX_RUN_SECONDS, [1e200]),
    "throughput": ("job.completed", COMPLETED, "dataset_tokens_per_second", MAX_TOKENS_PER_SECOND, [1e200]),
    "train tokens/s": ("job.completed", COMPLETED, "train_tokens_per_second", MAX_TOKENS_PER_SECOND, [1e30]),
    "samples/s": ("job.completed", COMPLETED, "train_samples_per_second", MAX_TOKENS_PER_SECOND, [1e30]),
    "steps/s": ("job.completed", COMPLETED, "train_steps_per_second", MAX_TOKENS_PER_SECOND, [1e30]),
    "average power": ("job.completed", COMPLETED, "gpu_power_watts_avg", MAX_GPU_POWER_WATTS, [1e308]),
    "least power": ("job.completed", COMPLETED, "gpu_power_watts_min", MAX_GPU_POWER_WATTS, [1e308]),
    "most power": ("job.completed", COMPLETED, "gpu_power_watts_max", MAX_GPU_POWER_WATTS, [1e308]),
    "progress tokens/s": ("job.progress", PROGRESS, "tokens_per_second", MAX_TOKENS_PER_SECOND, [1e30]),
    "progress power": ("job.progress", PROGRESS, "power_watts", MAX_GPU_POWER_WATTS, [1e308]),
    "failed after": (
        "job.failed",
        {"reason": "oom", "seconds_into_run": 1.0},
        "seconds_into_run",
        MAX_RUN_SECONDS,
        [1e308],
    ),
    "GPUs of a node": ("node.status", NODE, "gpu_count", MAX_GPUS_PER_NODE, [2**31 - 1]),
}


def refused(raw: bytes) -> list[InvalidEvent]:
    """What both parsers say: each refuses with the same reason, or the test fails."""
    found = []
    for parse in (parse_event, parse_message):
        with pytest.raises(InvalidEvent) as caught:
            parse(raw)
        found.append(caught.value)
    assert (found[0].kind, found[0].detail) == (found[1].kind, found[1].detail)
    return found


@pytest.mark.parametrize(("kind", "payload", "field", "ceiling", "far"), CEILINGS.values(), ids=CEILINGS)
def test_a_value_past_its_physical_ceiling_fails_the_schema(
    kind: str, payload: dict[str, Any], field: str, ceiling: float, far: list[float]
) -> None:
    past = ceiling + 1 if isinstance(ceiling, int) else JUST_PAST(ceiling, math.inf)
    for value in (past, *far):
        [error, _] = refused(message(kind, payload | {field: value}))
        assert (
            error.kind == "schema"
            and f"payload.{field}: Input should be less than or equal to" in error.detail
        )


@pytest.mark.parametrize(("kind", "payload", "field", "ceiling", "far"), CEILINGS.values(), ids=CEILINGS)
def test_the_ceiling_itself_is_accepted(
    kind: str, payload: dict[str, Any], field: str, ceiling: float, far: list[float]
) -> None:
    raw = message(kind, payload | {field: ceiling})
    assert getattr(parse_event(raw).payload, field) == ceiling
    assert getattr(parse_message(raw).payload, field) == ceiling


def test_the_probe_s_reports_are_refused() -> None:
    """D1: 1e200 s at 1e200 tokens/s; D2: a node of 2^31 - 1 GPUs; D8: 1e308 W, 1e30 tokens/s."""
    for raw in (
        message("job.completed", {"train_runtime": 1e200, "dataset_tokens_per_second": 1e200}),
        message("node.status", NODE | {"gpu_count": 2147483647}),
        message("job.progress", PROGRESS | {"power_watts": 1e308}),
        message("job.progress", PROGRESS | {"tokens_per_second": 1e30}),
    ):
        assert refused(raw)[0].kind == "schema"


# --- D11: text lengths are said in characters ---------------------------------------------------------------

# Each: a message with one text too long, where, its bound and its length (in characters, not bytes).
TOO_LONG: dict[str, tuple[bytes, str, int, int]] = {
    "model_name": (
        message("job.submitted", SUBMITTED | {"model_name": "x" * 100_000}),
        "payload.model_name", 200, 100_000,
    ),
    "gpu_model": (
        message("job.submitted", SUBMITTED | {"gpu_model": "é" * 101}), "payload.gpu_model", 100, 101
    ),
    "tenant": (message("job.submitted", SUBMITTED | {"tenant": "😀" * 201}), "payload.tenant", 200, 201),
    "job_id": (message("job.submitted", SUBMITTED, job_id="j" * 201), "job_id", 200, 201),
    "message": (
        message("job.rejected", {"rule": "gpus_not_multiple_of_nodes", "message": "m" * 2001}),
        "payload.message", 2000, 2001,
    ),
    "node_id": (message("node.status", NODE | {"node_id": "n" * 300}), "payload.node_id", 200, 300),
}  # fmt: skip


@pytest.mark.parametrize(("raw", "where", "limit", "given"), TOO_LONG.values(), ids=TOO_LONG)
def test_a_text_too_long_is_said_in_characters(raw: bytes, where: str, limit: int, given: int) -> None:
    """It read "Value should have at most 200 items after validation, not 100000" for the texts whose bound
    sits on top of a validator (all but node_id)."""
    [error, _] = refused(raw)
    assert f"{where}: String should have at most {limit} characters, not {given:,}" in error.detail
    assert "items" not in error.detail


def test_a_text_too_short_is_said_in_characters() -> None:
    [error, _] = refused(message("job.submitted", SUBMITTED, job_id="", cluster_id=""))
    assert "cluster_id: String should have at least 1 character;" in error.detail
    assert "job_id: String should have at least 1 character" in error.detail and "item" not in error.detail


# --- D8: a finished job's progress is final -----------------------------------------------------------------

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


@pytest.mark.parametrize("one_batch", [True, False], ids=["one-batch", "batch-per-event"])
def test_progress_dated_after_the_job_ended_does_not_rewrite_it(engine: Engine, one_batch: bool) -> None:
    """The probe's j3: a report of 9999 W dated after `job.completed` (which measured no power) became the
    finished job's power, and the energy recorded for its last interval exceeded the cluster's maximum."""
    events = [
        new_event("job.submitted", JobSubmitted(**SUBMITTED), job_id="j3", ts=at(0)),
        new_event("job.started", JobStarted(node_ids=["n0"]), job_id="j3", ts=at(1)),
        new_event(
            "job.progress",
            JobProgress(tokens_processed=4e6, tokens_per_second=2e4, power_watts=300.0),
            job_id="j3",
            ts=at(5),
        ),  # fmt: skip
        new_event(
            "job.completed",
            JobCompleted(train_runtime=600.0, dataset_tokens_per_second=2e4),
            job_id="j3",
            ts=at(11),
        ),  # fmt: skip
        new_event(
            "job.progress",
            JobProgress(tokens_processed=9e6, tokens_per_second=9e4, power_watts=9999.0),
            job_id="j3",
            ts=at(20),
        ),  # fmt: skip
    ]
    for batch in [events] if one_batch else [[event] for event in events]:
        apply_events(engine, batch)
    with engine.connect() as connection:
        row = connection.execute(select(Job).where(Job.job_id == "j3")).one()
    assert row.state == "completed"
    assert (row.tokens_processed, row.last_tokens_per_second, row.last_power_watts) == (4e6, 2e4, 300.0)


def test_progress_dated_before_the_end_still_counts_when_it_arrives_late(engine: Engine) -> None:
    """Delivery is out of order: a report from before the end that arrives after it is the job's progress."""
    apply_events(engine, [new_event("job.completed", JobCompleted(**COMPLETED), job_id="j4", ts=at(11))])
    late = JobProgress(tokens_processed=8e6, tokens_per_second=2e4, power_watts=310.0)
    apply_events(engine, [new_event("job.progress", late, job_id="j4", ts=at(7))])
    with engine.connect() as connection:
        row = connection.execute(select(Job).where(Job.job_id == "j4")).one()
    assert (row.state, row.tokens_processed, row.last_power_watts) == ("completed", 8e6, 310.0)


# --- the contract's page states the new bounds --------------------------------------------------------------


def test_the_telemetry_page_states_the_physical_bounds_and_the_dead_letter_size() -> None:
    text = DOC.read_text()
    bounds = text.split("## Bounds", 1)[1].split("## Event types", 1)[0]
    assert f"at most {MAX_GPUS_PER_NODE}" in bounds and "`gpu_count`" in bounds
    assert f"{MAX_TOKENS_PER_SECOND:,.0f}" in bounds and f"{MAX_GPU_POWER_WATTS:,.0f} W" in bounds
    assert f"{MAX_RUN_SECONDS:,.0f} s" in bounds
    dead_letters = text.split("## Dead letters", 1)[1].split("## Outbound", 1)[0]
    for name in ("`truncated`", "`original_bytes`", "`original_sha256`", "`key_dropped_bytes`"):
        assert name in dead_letters, name
    assert f"{MAX_DEAD_LETTER_BYTES:,}" in dead_letters and f"{FALLBACK_DEAD_LETTER_BYTES:,}" in dead_letters
