"""The ingest worker's fast path: the telemetry contract of `ingest.events`, mirrored in msgspec.

`parse_event` (pydantic) is the contract and the only source of rejection reasons, but validating with it
was a fifth of the worker's CPU per event, and decoding straight into these msgspec structs takes half as
long; the structs are also cheaper to read and to serialize again (bench/ingest.py). So the worker decodes
each message with `decode_event` first and falls back to `parse_event` for anything the fast path refuses
(which then says why, or accepts a form only pydantic takes, such as `"true"` for a boolean).

The rule that makes this safe: whatever `decode_event` accepts, `parse_event` accepts too, with the same
values. The fast path may be stricter, never looser. tests/ingest/test_fastparse.py checks it with
hypothesis over generated good and bad messages, and checks that both describe the same fields.

The structs quack like the pydantic events where ingest and its batch hooks look: `type`, `event_id`,
`ts`, `cluster_id`, `job_id` and `payload`, whose fields read as attributes or, like a mapping, through
`dict(payload)`.
"""

from __future__ import annotations

import math
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Annotated, ClassVar, Literal, get_args

import msgspec
from msgspec import Meta, Struct

from ingest.events import (
    MAX_GPU_POWER_WATTS,
    MAX_MESSAGE_BYTES,
    MAX_RUN_SECONDS,
    MAX_TOKENS_PER_SECOND,
)
from twin.cluster import MAX_GPUS_PER_NODE
from twin.domain import MAX_TIME_LIMIT_S, Method, Rule
from twin.limits import STORE_INT_MAX, time_window

# The bounds of `ingest.events`, from the same constants (twin.limits, twin.cluster, and the physical ceilings
# of ingest.events). `allow_inf_nan=False` needs no counterpart: msgspec never decodes a JSON number to inf or
# nan (1e400 is "out of range").
PositiveInt = Annotated[int, Meta(ge=1, le=STORE_INT_MAX)]  # msgspec ints are strict, as pydantic's here
NonNegativeInt = Annotated[int, Meta(ge=0, le=STORE_INT_MAX)]
GpuCount = Annotated[int, Meta(ge=1, le=MAX_GPUS_PER_NODE)]
PositiveFloat = Annotated[float, Meta(gt=0)]
TimeLimit = Annotated[float, Meta(gt=0, le=MAX_TIME_LIMIT_S)]
NonNegativeFloat = Annotated[float, Meta(ge=0)]
Percent = Annotated[float, Meta(ge=0, le=1000)]
RunSeconds = Annotated[float, Meta(gt=0, le=MAX_RUN_SECONDS)]
SecondsIntoRun = Annotated[float, Meta(ge=0, le=MAX_RUN_SECONDS)]
Rate = Annotated[float, Meta(ge=0, le=MAX_TOKENS_PER_SECOND)]
PositiveRate = Annotated[float, Meta(gt=0, le=MAX_TOKENS_PER_SECOND)]
Watts = Annotated[float, Meta(ge=0, le=MAX_GPU_POWER_WATTS)]
# Lengths count characters, as pydantic's do. Text the store cannot hold: a NUL can only reach a JSON string
# as the escape \u0000, which `decode_event` looks for in the raw message (one scan of its bytes costs a
# fraction of a regular expression per field); a lone surrogate msgspec refuses itself.
Name = Annotated[str, Meta(min_length=1, max_length=200)]
GpuModel = Annotated[str, Meta(min_length=1, max_length=100)]
Text50 = Annotated[str, Meta(max_length=50)]
Text200 = Annotated[str, Meta(max_length=200)]
Text2000 = Annotated[str, Meta(max_length=2000)]


# RFC 3339 with an offset: the form every producer writes, and one that `datetime.fromisoformat` and pydantic
# read alike (both truncate a fraction beyond microseconds; msgspec's own datetime would round it).
_RFC3339 = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})\Z"
Timestamp = Annotated[str, Meta(pattern=_RFC3339)]


# gc=False: the garbage collector does not track these structs (they hold scalars, strings and lists of
# strings, so they can never be part of a reference cycle); a batch is thousands of them.
class _Payload(Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """A payload reads as a mapping too (`dict(payload)`), as batch hooks read pydantic payloads."""

    def keys(self) -> tuple[str, ...]:
        return self.__struct_fields__

    def __getitem__(self, name: str) -> object:
        return getattr(self, name)


class JobSubmitted(_Payload, frozen=True):
    """Mirrors `twin.domain.JobConfig` plus the descriptors of `twin.job_config.DescribedJobConfig`, then the
    payload's own fields. Stricter in one place: `number_nodes` is required here (the contract defaults it
    from `number_gpus`, which a struct default cannot), so a message without it takes the slow path."""

    model_name: Name
    method: Method
    gpu_model: GpuModel
    number_gpus: PositiveInt
    number_nodes: PositiveInt
    batch_size: PositiveInt
    tokens_per_sample: PositiveInt
    enable_roce: bool = False
    fast_moe: NonNegativeInt = 0
    fast_kernels: bool = False
    time_limit_s: TimeLimit | None = None
    experiment_id: Text2000 | None = None
    identifier: Text2000 | None = None
    fms_hf_tuning_version: Text50 | None = None
    torch_dtype: Text50 | None = None
    tenant: Text200 | None = None
    dataset_tokens: PositiveFloat | None = None


class JobRejected(_Payload, frozen=True):
    rule: Rule
    message: Text2000 | None = None


class JobStarted(_Payload, frozen=True):
    node_ids: Annotated[list[Name], Meta(min_length=1, max_length=64)]


class JobProgress(_Payload, frozen=True):
    tokens_processed: NonNegativeFloat
    tokens_per_second: Rate
    gpu_memory_peak_pct: Percent | None = None
    power_watts: Watts | None = None


class JobCompleted(_Payload, frozen=True):
    train_runtime: RunSeconds
    dataset_tokens_per_second: PositiveRate
    train_tokens_per_second: Rate | None = None
    train_samples_per_second: Rate | None = None
    train_steps_per_second: Rate | None = None
    # Unconstrained in the contract, so pydantic takes inf and nan here; msgspec cannot decode them from JSON,
    # which only sends such messages to the slow path.
    model_load_time: float | None = None
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


class JobFailed(_Payload, frozen=True):
    reason: Literal["oom", "other"]
    seconds_into_run: SecondsIntoRun
    message: Text2000 | None = None


class NodeStatus(_Payload, frozen=True):
    node_id: Name
    gpu_model: GpuModel
    gpu_count: GpuCount
    status: Literal["up", "down", "drain"]


class _Envelope(Struct, kw_only=True, forbid_unknown_fields=True, tag_field="type", gc=False):
    """Not frozen only so that `decode_event` can put the parsed time in `ts`; treat it as read-only."""

    type: ClassVar[str]  # the event type: set from the subclass's tag below
    # No default, unlike the pydantic envelope's: `parse_event` refuses a message without it.
    schema_version: Literal[1]
    event_id: uuid.UUID
    ts: Timestamp  # the text as decoded; `decode_event` replaces it with its datetime
    cluster_id: Name = "default"


class _JobEnvelope(_Envelope, kw_only=True):
    job_id: Name  # job events must name their job (pydantic: a model validator)


class JobSubmittedEvent(_JobEnvelope, kw_only=True, tag="job.submitted"):
    payload: JobSubmitted


class JobRejectedEvent(_JobEnvelope, kw_only=True, tag="job.rejected"):
    payload: JobRejected


class JobStartedEvent(_JobEnvelope, kw_only=True, tag="job.started"):
    payload: JobStarted


class JobProgressEvent(_JobEnvelope, kw_only=True, tag="job.progress"):
    payload: JobProgress


class JobCompletedEvent(_JobEnvelope, kw_only=True, tag="job.completed"):
    payload: JobCompleted


class JobFailedEvent(_JobEnvelope, kw_only=True, tag="job.failed"):
    payload: JobFailed


class NodeStatusEvent(_Envelope, kw_only=True, tag="node.status"):
    job_id: Name | None = None
    payload: NodeStatus


FastEvent = (
    JobSubmittedEvent
    | JobRejectedEvent
    | JobStartedEvent
    | JobProgressEvent
    | JobCompletedEvent
    | JobFailedEvent
    | NodeStatusEvent
)
FAST_EVENT_TYPES: tuple[type[_Envelope], ...] = get_args(FastEvent)
for _event_type in FAST_EVENT_TYPES:
    # `type` reads as on the pydantic events; its one spelling is the tag msgspec decodes by.
    _event_type.type = _event_type.__struct_config__.tag  # type: ignore[misc]
_DECODER = msgspec.json.Decoder(FastEvent)


# The contract's time window (`parse_event` reads the clock for each message) costs more than the rest of the
# decoding if computed per message; the fast path reads it once a minute and keeps a day inside it, so it
# stays stricter than `parse_event` whenever that reads the clock: near the edges, `parse_event` decides.
_WINDOW_REFRESH_S = 60.0
_WINDOW_MARGIN = timedelta(days=1)
_window: tuple[float, datetime, datetime] = (
    -math.inf,
    datetime.max.replace(tzinfo=UTC),
    datetime.min.replace(tzinfo=UTC),
)


def _well_inside_the_time_window(ts: datetime) -> bool:
    global _window
    read_at, earliest, latest = _window
    now = time.monotonic()
    if now - read_at > _WINDOW_REFRESH_S:
        earliest, latest = time_window()
        earliest, latest = earliest + _WINDOW_MARGIN, latest - _WINDOW_MARGIN
        _window = (now, earliest, latest)
    return earliest <= ts <= latest


class NotFast(ValueError):
    """The fast path does not take this message; `parse_event` decides what it is."""


def decode_event(raw: bytes) -> FastEvent:
    """A valid event in its common form, or `NotFast`. Never accepts what `parse_event` refuses."""
    if len(raw) > MAX_MESSAGE_BYTES:
        raise NotFast("too large")
    # A NUL in some string (or text that only looks like one: then parse_event decides). Most messages hold
    # no escape at all, and looking for one byte is the cheaper scan.
    if b"\\" in raw and b"\\u0000" in raw:
        raise NotFast("NUL")
    try:
        event: FastEvent = _DECODER.decode(raw)
        ts = datetime.fromisoformat(event.ts)  # type: ignore[arg-type]
    except Exception as exc:  # msgspec.DecodeError (its ValidationError too), ValueError, or anything else
        raise NotFast(str(exc)) from None
    if not _well_inside_the_time_window(ts):
        raise NotFast("ts outside the time window, or near its edge")
    event.ts = ts  # type: ignore[assignment]
    return event
