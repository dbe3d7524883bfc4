"""The telemetry contract: one JSON envelope per Kafka message (key = job id), one payload per event type.

`parse_event` is the only way bytes become an event; whatever it rejects goes to the dead-letter topic with
the `InvalidEvent` reason.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from twin.cluster import MAX_GPUS_PER_NODE
from twin.domain import Rule
from twin.input_errors import causes
from twin.job_config import DescribedJobConfig
from twin.limits import (
    EVENT_TIME_WINDOW,
    MAX_GPU_POWER_WATTS,
    MAX_SIMULATED_SECONDS,
    StorableText,
    within_time_window,
)

SCHEMA_VERSION = 1
MAX_MESSAGE_BYTES = 256 * 1024  # a telemetry event is a few hundred bytes; anything this big is not one


# --- the bounds of every field (what the store and Python can hold: twin.limits) -------------------------
# Integers fit the store's integer columns; floats are finite; text holds no character the store refuses
# (NUL: JSON decoders already refuse lone surrogates); `ts` lies within ten years of now. The msgspec mirror
# (ingest.fastparse) states the same bounds.


# Physical ceilings, for the measurements a forecast computes with: far beyond any true reading, so that none
# is refused, yet small enough that what the twin derives from them stays finite (runtime x rate, GPUs x
# watts x seconds). Without them one report of 1e200 s at 1e200 tokens/s overflowed PostgreSQL's product and
# failed every forecast, and one of 1e308 W made the forecast's energy NaN.
# A run lasts at most ten years: no event outside that window of now is accepted either.
MAX_RUN_SECONDS = MAX_SIMULATED_SECONDS
# Power per GPU: twin.limits.MAX_GPU_POWER_WATTS (the twin reads stored power back within it too).
# A job processes at most a billion tokens a second: the benchmark's fastest job (32 GPUs) did 560,000, and
# a thousandfold more is more than any cluster fine-tunes at. Samples and steps are never more than tokens.
MAX_TOKENS_PER_SECOND = 1e9


# A node holds at most as many GPUs as a cluster file's node may (twin.cluster): a report of 2^31 - 1 made
# every forecast allocate per GPU until memory ran out.
GpuCount = Annotated[int, Field(ge=1, le=MAX_GPUS_PER_NODE, strict=True)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Percent = Annotated[float, Field(ge=0, le=1000, allow_inf_nan=False)]
RunSeconds = Annotated[float, Field(gt=0, le=MAX_RUN_SECONDS, allow_inf_nan=False)]
SecondsIntoRun = Annotated[float, Field(ge=0, le=MAX_RUN_SECONDS, allow_inf_nan=False)]
Rate = Annotated[float, Field(ge=0, le=MAX_TOKENS_PER_SECOND, allow_inf_nan=False)]
PositiveRate = Annotated[float, Field(gt=0, le=MAX_TOKENS_PER_SECOND, allow_inf_nan=False)]
Watts = Annotated[float, Field(ge=0, le=MAX_GPU_POWER_WATTS, allow_inf_nan=False)]
Text = StorableText


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JobSubmitted(DescribedJobConfig, _Payload):
    """The job's configuration (the one declaration: `twin.domain.JobConfig`, with the benchmark's
    descriptors), who submitted it and the work it has to do."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    tenant: Text | None = Field(default=None, max_length=200)
    dataset_tokens: PositiveFloat | None = None


class JobRejected(_Payload):
    rule: Rule
    message: Text | None = Field(default=None, max_length=2000)


class JobStarted(_Payload):
    node_ids: list[Annotated[Text, Field(min_length=1, max_length=200)]] = Field(min_length=1, max_length=64)


class JobProgress(_Payload):
    tokens_processed: NonNegativeFloat
    tokens_per_second: Rate
    gpu_memory_peak_pct: Percent | None = None
    power_watts: Watts | None = None  # per GPU


class JobCompleted(_Payload):
    """One observed run: the measured columns of a benchmark row."""

    train_runtime: RunSeconds
    dataset_tokens_per_second: PositiveRate
    train_tokens_per_second: Rate | None = None
    train_samples_per_second: Rate | None = None
    train_steps_per_second: Rate | None = None
    model_load_time: Finite | None = None
    gpu_memory_utilization_avg: Percent | None = None
    gpu_memory_utilization_min: Percent | None = None
    gpu_memory_utilization_max: Percent | None = None
    gpu_memory_utilization_peak: Percent | None = None
    gpu_compute_utilization_avg: Percent | None = None
    gpu_compute_utilization_min: Percent | None = None
    gpu_compute_utilization_max: Percent | None = None
    cpu_compute_utilization: Percent | None = None
    cpu_memory_utilization: Percent | None = None
    gpu_power_watts_avg: Watts | None = None
    gpu_power_watts_min: Watts | None = None
    gpu_power_watts_max: Watts | None = None
    gpu_power_percent_avg: Percent | None = None
    gpu_power_percent_max: Percent | None = None


MEASURED_FIELDS: tuple[str, ...] = tuple(JobCompleted.model_fields)


class JobFailed(_Payload):
    reason: Literal["oom", "other"]
    seconds_into_run: SecondsIntoRun
    message: Text | None = Field(default=None, max_length=2000)


class NodeStatus(_Payload):
    node_id: Text = Field(min_length=1, max_length=200)
    gpu_model: Text = Field(min_length=1, max_length=100)
    gpu_count: GpuCount
    status: Literal["up", "down", "drain"]


class _Envelope(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    event_id: uuid.UUID
    ts: AwareDatetime
    cluster_id: Text = Field(default="default", min_length=1, max_length=200)
    job_id: Text | None = Field(default=None, min_length=1, max_length=200)

    @field_validator("ts")
    @classmethod
    def _within_the_time_window(cls, ts: datetime) -> datetime:
        if not within_time_window(ts):
            years = EVENT_TIME_WINDOW.days // 365
            raise ValueError(f"{ts.isoformat()} is more than {years} years from now")
        return ts

    @model_validator(mode="after")
    def _job_events_name_their_job(self) -> _Envelope:
        if self.type.startswith("job.") and not self.job_id:  # type: ignore[attr-defined]
            raise ValueError(f"{self.type} needs a job_id")  # type: ignore[attr-defined]
        return self

    @property
    def key(self) -> str:
        """The Kafka key: the job id keeps one job's events in one partition, in order."""
        return self.job_id or getattr(self.payload, "node_id", "")  # type: ignore[attr-defined]

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()


class JobSubmittedEvent(_Envelope):
    type: Literal["job.submitted"] = "job.submitted"
    payload: JobSubmitted


class JobRejectedEvent(_Envelope):
    type: Literal["job.rejected"] = "job.rejected"
    payload: JobRejected


class JobStartedEvent(_Envelope):
    type: Literal["job.started"] = "job.started"
    payload: JobStarted


class JobProgressEvent(_Envelope):
    type: Literal["job.progress"] = "job.progress"
    payload: JobProgress


class JobCompletedEvent(_Envelope):
    type: Literal["job.completed"] = "job.completed"
    payload: JobCompleted


class JobFailedEvent(_Envelope):
    type: Literal["job.failed"] = "job.failed"
    payload: JobFailed


class NodeStatusEvent(_Envelope):
    type: Literal["node.status"] = "node.status"
    payload: NodeStatus


Event = Annotated[
    JobSubmittedEvent
    | JobRejectedEvent
    | JobStartedEvent
    | JobProgressEvent
    | JobCompletedEvent
    | JobFailedEvent
    | NodeStatusEvent,
    Field(discriminator="type"),
]
EVENT_TYPES: dict[str, type[_Envelope]] = {
    cls.model_fields["type"].default: cls
    for cls in (
        JobSubmittedEvent, JobRejectedEvent, JobStartedEvent, JobProgressEvent,
        JobCompletedEvent, JobFailedEvent, NodeStatusEvent,
    )
}  # fmt: skip
_EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


class InvalidEvent(ValueError):
    """Why a message is not a telemetry event; the text is what the dead-letter record carries."""

    def __init__(self, kind: str, detail: str) -> None:
        self.kind = kind  # not_json | too_large | unknown_type | schema
        self.detail = detail
        super().__init__(f"{kind}: {detail}")


def parse_event(raw: bytes | str) -> Event:
    """Bytes from Kafka to a validated event, or `InvalidEvent` with a reason; never another exception, as
    one message must never stop ingest (whatever no one foresaw is refused as `schema`, with what it was)."""
    try:
        return _parse_event(raw)
    except InvalidEvent:
        raise
    except Exception as exc:
        raise InvalidEvent("schema", f"unreadable ({type(exc).__name__}: {str(exc)[:200]})") from None


def _parse_event(raw: bytes | str) -> Event:
    size = len(raw)
    if size > MAX_MESSAGE_BYTES:
        raise InvalidEvent("too_large", f"{size} bytes, the limit is {MAX_MESSAGE_BYTES}")
    try:
        document: Any = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidEvent("not_json", str(exc)) from None
    except ValueError as exc:  # valid JSON Python will not hold: an integer literal of over 4300 digits
        raise InvalidEvent("schema", f"a number no field can hold: {str(exc)[:200]}") from None
    except RecursionError:  # valid JSON nested deeper than Python's parser goes (no event nests 4 levels)
        raise InvalidEvent("schema", "JSON nested too deeply to be an event") from None
    if not isinstance(document, dict):
        raise InvalidEvent("schema", f"expected a JSON object, got {type(document).__name__}")
    kind = document.get("type")
    if not isinstance(kind, str) or kind not in EVENT_TYPES:  # a list or an object here is unhashable
        raise InvalidEvent("unknown_type", f"type {kind!r} is not one of {', '.join(EVENT_TYPES)}")
    version = document.get("schema_version")
    if version != SCHEMA_VERSION:
        raise InvalidEvent(
            "schema", f"schema_version {version!r} is not supported (expected {SCHEMA_VERSION})"
        )
    try:
        return _EVENT_ADAPTER.validate_python(document)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'][1:]) or '(envelope)'}: {_message(err)}"
            for err in causes(exc.errors(include_url=False))[:5]
        )
        raise InvalidEvent("schema", problems) from None


def _message(error: Any) -> str:
    """pydantic's message for one error, with a text's length in characters, and how long it was. A length
    bound declared on top of StorableText's validator (model_name and gpu_model in twin.domain; tenant,
    job_id, message here) is checked by pydantic's generic rule, which said "Value should have at most 200
    items after validation"; a plain string's bound (node_id) said "String should have at most 200
    characters": both now read alike."""
    kind, text, context = error["type"], error.get("input"), error.get("ctx") or {}
    if kind in ("too_long", "string_too_long") and isinstance(text, str) and "max_length" in context:
        return f"String should have at most {_characters(context['max_length'])}, not {len(text):,}"
    if kind in ("too_short", "string_too_short") and isinstance(text, str) and "min_length" in context:
        return f"String should have at least {_characters(context['min_length'])}"
    return str(error["msg"])


def _characters(count: int) -> str:
    return f"{count} character{'' if count == 1 else 's'}"


def new_event(
    kind: str, payload: _Payload, *, job_id: str | None, ts: datetime | None = None,
    cluster_id: str = "default", event_id: uuid.UUID | None = None,
) -> Event:  # fmt: skip
    """Build an event of a known type (producers: replay, tests)."""
    return EVENT_TYPES[kind](
        event_id=event_id or uuid.uuid4(),
        ts=ts or datetime.now(UTC),
        cluster_id=cluster_id,
        job_id=job_id,
        payload=payload,
    )  # type: ignore[return-value]
