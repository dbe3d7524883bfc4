"""The worker's fast path (`ingest.fastparse`, msgspec) against the contract (`ingest.events.parse_event`,
pydantic): whatever the fast path accepts, `parse_event` accepts with the same values, so the worker, which
falls back to `parse_event` for the rest, accepts and refuses exactly what `parse_event` does, with its
reasons. Checked on generated messages, good and bad, from the envelope down to single bytes."""

from __future__ import annotations

import json
import math
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from ingest import events as contract
from ingest import fastparse as fast
from ingest.events import (
    EVENT_TYPES,
    MAX_GPU_POWER_WATTS,
    MAX_RUN_SECONDS,
    MAX_TOKENS_PER_SECOND,
    MEASURED_FIELDS,
    InvalidEvent,
    parse_event,
)
from ingest.fastparse import NotFast, decode_event
from ingest.replay import ReplayPlan
from ingest.worker import parse_message
from tests.ingest.conftest import same_event
from twin.cluster import MAX_GPUS_PER_NODE
from twin.domain import Rule
from twin.limits import STORE_INT_MAX

MANY = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def verdicts(raw: bytes) -> tuple[Any, Any]:
    """(the fast path's event or None, `parse_event`'s event or its InvalidEvent)."""
    try:
        quick = decode_event(raw)
    except NotFast:
        quick = None
    try:
        slow: Any = parse_event(raw)
    except InvalidEvent as exc:
        slow = exc
    return quick, slow


def check(raw: bytes) -> Any:
    """The property, for one message; returns the fast path's verdict."""
    quick, slow = verdicts(raw)
    if quick is not None:
        assert isinstance(slow, BaseModel), f"fast path accepted what parse_event refuses ({slow}): {raw!r}"
        assert same_event(quick, slow), f"fast path read other values: {raw!r}\n{quick}\n{slow}"
    # The worker's verdict is parse_event's: accepted with the same values, or refused with its reason.
    try:
        worker = parse_message(raw)
    except InvalidEvent as exc:
        assert isinstance(slow, InvalidEvent) and (exc.kind, exc.detail) == (slow.kind, slow.detail)
    else:
        assert isinstance(slow, BaseModel) and (worker == slow or same_event(worker, slow))
    return quick


# --- the two descriptions of the contract ------------------------------------------------------------------

PAIRS = [
    (fast.JobSubmitted, contract.JobSubmitted), (fast.JobRejected, contract.JobRejected),
    (fast.JobStarted, contract.JobStarted), (fast.JobProgress, contract.JobProgress),
    (fast.JobCompleted, contract.JobCompleted), (fast.JobFailed, contract.JobFailed),
    (fast.NodeStatus, contract.NodeStatus),
]  # fmt: skip


@pytest.mark.parametrize(("mirror", "model"), PAIRS, ids=lambda cls: cls.__name__)
def test_every_payload_has_the_same_fields_and_defaults(mirror: Any, model: type[BaseModel]) -> None:
    with_defaults = mirror.__struct_fields__[
        len(mirror.__struct_fields__) - len(mirror.__struct_defaults__) :
    ]
    defaults = dict(zip(with_defaults, mirror.__struct_defaults__, strict=True))
    assert mirror.__struct_fields__ == tuple(model.model_fields)
    for name, field in model.model_fields.items():
        # A default computed from other fields (number_nodes from number_gpus) is required in the mirror:
        # stricter, so such a message takes the slow path.
        expected = "required" if field.is_required() or field.default_factory else field.default
        assert defaults.get(name, "required") == expected, name


def test_every_event_type_has_a_mirror_with_the_same_envelope() -> None:
    assert {cls.type for cls in fast.FAST_EVENT_TYPES} == set(EVENT_TYPES)
    for cls in fast.FAST_EVENT_TYPES:
        model = EVENT_TYPES[cls.type]
        assert set(cls.__struct_fields__) == set(model.model_fields) - {"type"}


def test_the_replay_takes_the_fast_path(sample_plan: ReplayPlan) -> None:
    """What producers send (here: the replay's events) is decoded by the fast path, not the slow one."""
    for _, event in sample_plan.events[:3000]:
        assert check(event.to_json()) is not None


# --- generated messages -----------------------------------------------------------------------------------
#
# A message is a valid event's document with a few things wrong (most often exactly one, so that a single
# wrong bound in the fast path shows: the rest of the document is fine, and the slow path says no), written
# the ways producers write JSON.

LENGTHS = [0, 1, 2, 49, 50, 51, 63, 64, 65, 99, 100, 101, 199, 200, 201, 1999, 2000, 2001]
# Characters that are 1 code point but several UTF-8 bytes (or 2 UTF-16 units), and JSON's special ones.
ALPHABET = st.sampled_from(["a", "Z", "0", " ", "-", ".", "é", "€", "😀", '"', "\\", "\n", "\t", "\x00"])
edge_text = st.builds(lambda n, c: c * n, st.sampled_from(LENGTHS), ALPHABET)
edge_numbers = st.sampled_from(
    [0, 1, -1, 2, 7, 8, 1000, 1001, 2**31, 2**63, 2**64, 10**30, -(2**63) - 1,
     0.0, -0.0, 0.5, 1.0, 1.5, -1.5, -1e-300, 999.9999, 1000.0, 1000.0000001, 1e-320, 1e308]
)  # fmt: skip
edge_values = st.one_of(
    edge_text, edge_numbers, st.sampled_from([None, True, False, [], {}, ["a"], {"a": 1}, "1", "1.5", "true"])
)

names = st.text(min_size=1, max_size=60)
counts = st.integers(min_value=1, max_value=STORE_INT_MAX)
amounts = st.one_of(
    st.floats(min_value=0, allow_nan=False, allow_infinity=False), st.integers(0, 10**9), st.just(0.0)
)
percents = st.floats(min_value=0, max_value=1000, allow_nan=False)
optional = st.one_of(st.none(), names)


def up_to(ceiling: float) -> st.SearchStrategy[Any]:
    """Amounts from 0 to a physical ceiling of the contract, the ceiling itself included."""
    return st.one_of(
        st.floats(min_value=0, max_value=ceiling),
        st.integers(0, int(ceiling)),
        st.sampled_from([0.0, ceiling]),
    )


def past(ceiling: float) -> st.SearchStrategy[Any]:
    """Amounts just past a physical ceiling, and far past it (what overflowed the store's arithmetic)."""
    return st.sampled_from([math.nextafter(ceiling, math.inf), int(ceiling) + 1, ceiling * 10, 1e200, 1e308])


def too_long(limit: int) -> st.SearchStrategy[str]:
    return st.sampled_from(["x" * (limit + 1), "é" * (limit + 1), "😀" * (limit + 1)])


# Wrong values, each just past a limit of the contract or of another type, or of a type pydantic coerces.
WRONG_COUNT = st.sampled_from(
    [0, -1, 1.0, 2.5, True, "1", None, STORE_INT_MAX + 1, 2**63, 2**64, -(2**63) - 1, int("9" * 4000)]
)
WRONG_POSITIVE = st.sampled_from([0, 0.0, -0.0, -1e-300, -1, "1.5", True, None, float("inf"), float("nan")])
WRONG_AMOUNT = st.sampled_from(
    [-1e-300, -0.5, -1, "0", True, None, float("inf"), float("-inf"), float("nan")]
)
WRONG_PERCENT = st.sampled_from([-1e-9, 1000.0000001, 1001, 1e6, "50", True, float("nan")])
WRONG_NAME = st.one_of(st.sampled_from(["", 1, None, ["a"]]), too_long(200))
WRONG_FLAG = st.sampled_from([0, 1, "false", "yes", None])
# Within the physical ceilings of the contract (ingest.events), and past them.
RATES, WRONG_RATE = up_to(MAX_TOKENS_PER_SECOND), st.one_of(WRONG_AMOUNT, past(MAX_TOKENS_PER_SECOND))
WATTS, WRONG_WATTS = up_to(MAX_GPU_POWER_WATTS), st.one_of(WRONG_AMOUNT, past(MAX_GPU_POWER_WATTS))
RUN_SECONDS = up_to(MAX_RUN_SECONDS)
WRONG_RUN_SECONDS = st.one_of(WRONG_POSITIVE, past(MAX_RUN_SECONDS))
GPUS_OF_A_NODE = st.integers(1, MAX_GPUS_PER_NODE)
WRONG_GPUS_OF_A_NODE = st.one_of(WRONG_COUNT, st.just(MAX_GPUS_PER_NODE + 1))

# Each payload field: how to write it right, and how to get it wrong.
PAYLOADS: dict[str, dict[str, tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]]] = {
    "job.submitted": {
        "model_name": (names, WRONG_NAME), "gpu_model": (names, st.one_of(WRONG_NAME, too_long(100))),
        "method": (st.sampled_from(["full", "lora", "gptq-lora"]), st.sampled_from(["qlora", "LORA", None])),
        "number_gpus": (counts, WRONG_COUNT), "number_nodes": (counts, WRONG_COUNT),
        "batch_size": (counts, WRONG_COUNT), "tokens_per_sample": (counts, WRONG_COUNT),
        "enable_roce": (st.booleans(), WRONG_FLAG), "fast_kernels": (st.booleans(), WRONG_FLAG),
        "fast_moe": (st.integers(0, 64), st.sampled_from([-1, 0.0, True, "0", None, STORE_INT_MAX + 1])),
        "time_limit_s": (st.one_of(st.none(), amounts), WRONG_POSITIVE),
        "dataset_tokens": (st.one_of(st.none(), amounts), WRONG_POSITIVE),
        "tenant": (optional, too_long(200)), "experiment_id": (optional, too_long(2000)),
        "identifier": (optional, too_long(2000)), "fms_hf_tuning_version": (optional, too_long(50)),
        "torch_dtype": (optional, too_long(50)),
    },
    "job.rejected": {
        "rule": (st.sampled_from([r.value for r in Rule]), st.sampled_from(["no_rule", "GPUS_NOT", 1])),
        "message": (optional, too_long(2000)),
    },
    "job.started": {
        "node_ids": (
            st.lists(names, min_size=1, max_size=8),
            st.sampled_from([[], ["n"] * 65, [""], ["x" * 201], ["😀" * 201], "n", [1], None]),
        ),
    },
    "job.progress": {
        "tokens_processed": (amounts, WRONG_AMOUNT), "tokens_per_second": (RATES, WRONG_RATE),
        "gpu_memory_peak_pct": (st.one_of(st.none(), percents), WRONG_PERCENT),
        "power_watts": (st.one_of(st.none(), WATTS), WRONG_WATTS),
    },
    "job.completed": {
        "train_runtime": (RUN_SECONDS, WRONG_RUN_SECONDS),
        "dataset_tokens_per_second": (RATES, st.one_of(WRONG_POSITIVE, past(MAX_TOKENS_PER_SECOND))),
        **{f"train_{n}_per_second": (st.one_of(st.none(), RATES), WRONG_RATE)
           for n in ("tokens", "samples", "steps")},
        "model_load_time": (st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)),
                            st.sampled_from([float("inf"), float("nan"), "1", True])),
        **{name: (st.one_of(st.none(), percents), WRONG_PERCENT) for name in MEASURED_FIELDS
           if "utilization" in name or "percent" in name},
        **{name: (st.one_of(st.none(), WATTS), WRONG_WATTS) for name in MEASURED_FIELDS
           if "watts" in name},
    },
    "job.failed": {
        "reason": (st.sampled_from(["oom", "other"]), st.sampled_from(["OOM", "", "oom ", None])),
        "seconds_into_run": (RUN_SECONDS, st.one_of(WRONG_AMOUNT, past(MAX_RUN_SECONDS))),
        "message": (optional, too_long(2000)),
    },
    "node.status": {
        "node_id": (names, WRONG_NAME), "gpu_model": (names, st.one_of(WRONG_NAME, too_long(100))),
        "gpu_count": (GPUS_OF_A_NODE, WRONG_GPUS_OF_A_NODE),
        "status": (st.sampled_from(["up", "down", "drain"]), st.sampled_from(["gone", "UP", None])),
    },
}  # fmt: skip
assert set(PAYLOADS["job.completed"]) == set(MEASURED_FIELDS)

zones = st.sampled_from(
    [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-23, minutes=-59))]
)


# Nine years either side of now: inside the contract's window (ten years), whatever the clock says.
NOW = datetime.now().replace(microsecond=0)
WITHIN_WINDOW = st.datetimes(
    min_value=NOW - timedelta(days=9 * 365), max_value=NOW + timedelta(days=9 * 365), timezones=zones
)


@st.composite
def timestamps(draw: st.DrawFn) -> str:
    """Real instants in RFC 3339 within the contract's window, with 0 to 12 fraction digits (a microsecond
    has 6)."""
    text = draw(WITHIN_WINDOW).isoformat(timespec="seconds")
    digits = draw(st.from_regex(r"[0-9]{0,12}", fullmatch=True))
    text = text[:19] + (f".{digits}" if digits else "") + text[19:]
    return text.replace("+00:00", draw(st.sampled_from(["Z", "+00:00"])))


@st.composite
def wrong_timestamps(draw: st.DrawFn) -> Any:
    """A timestamp with one part at or past its limit, or written another way, or not a text at all."""
    text = draw(timestamps())
    twists = [
        lambda t: t.replace("T", draw(st.sampled_from(["t", " ", "_", "TT"]))),
        lambda t: t.replace("Z", draw(st.sampled_from(["z", "", "+00", "+0000", "UTC"]))),
        lambda t: t[:19] + t[19:].replace("+", "-").replace(":", ""),
        lambda t: t[:5] + draw(st.sampled_from(["00", "13", "1"])) + t[7:],
        lambda t: t[:8] + draw(st.sampled_from(["00", "29", "30", "31", "32"])) + t[10:],
        lambda t: t[:11] + draw(st.sampled_from(["24", "25", "9"])) + t[13:],
        lambda t: t[:14] + draw(st.sampled_from(["60", "61"])) + t[16:],
        lambda t: t[:17] + draw(st.sampled_from(["60", "61"])) + t[19:],
        lambda t: t[:19] + ",5" + t[19:],
        lambda t: t[:19] + "." + t[19:],
        lambda t: t[:19] + draw(st.sampled_from(["+24:00", "+23:60", "-25:00", "+05:30:15", "+5:30"])),
        lambda t: draw(st.sampled_from(["0000", "10000", "-001", "0001", "1970", "9999"])) + t[4:],
        lambda t: t + draw(st.sampled_from(["\n", " ", "Z"])),
    ]
    if draw(st.integers(0, len(twists))) == len(twists):
        return draw(st.one_of(st.integers(-10, 2**33), st.floats(allow_nan=False), edge_text))
    return draw(st.sampled_from(twists))(text)


canonical_ids = st.uuids().map(str)
other_ids = st.one_of(
    st.uuids().map(lambda u: str(u).upper()), st.uuids().map(lambda u: u.hex),
    st.uuids().map(lambda u: "{" + str(u) + "}"), st.uuids().map(lambda u: f"urn:uuid:{u}"),
    st.uuids().map(lambda u: str(u)[:-1]), edge_values,
)  # fmt: skip
ENVELOPE_WRONG: dict[str, st.SearchStrategy[Any]] = {
    "schema_version": st.sampled_from([1.0, True, 2, 0, "1", None]),
    "event_id": other_ids,
    "ts": wrong_timestamps(),
    "cluster_id": WRONG_NAME,
    "job_id": WRONG_NAME,
    "type": st.sampled_from(["job.exploded", "JOB.STARTED", "job.started ", "", None]),
}


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    """A valid event's document (payload fields with defaults sometimes left out), then a few things wrong:
    none (a quarter of the time), most often one, sometimes up to five."""
    kind = draw(st.sampled_from(list(EVENT_TYPES)))
    fields = PAYLOADS[kind]
    optional_fields = set(EVENT_TYPES[kind].model_fields["payload"].annotation.model_fields) - {
        name for name, f in EVENT_TYPES[kind].model_fields["payload"].annotation.model_fields.items()
        if f.is_required()
    }  # fmt: skip
    payload = {
        name: draw(valid)
        for name, (valid, _) in fields.items()
        if name not in optional_fields or draw(st.booleans())
    }
    document: dict[str, Any] = {
        "schema_version": 1, "event_id": draw(canonical_ids), "ts": draw(timestamps()),
        "cluster_id": draw(names), "job_id": draw(names), "type": kind, "payload": payload,
    }  # fmt: skip
    if kind == "node.status":
        document["job_id"] = draw(optional)
    if kind == "node.status" or draw(st.integers(0, 9)) == 0:
        document.pop(draw(st.sampled_from(["job_id", "cluster_id"])))  # both may be left out, or not
    for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2, 3, 5]))):
        damage = draw(st.integers(0, 9))
        if damage < 4 and fields:  # a payload field gets a wrong value
            name = draw(st.sampled_from(sorted(fields)))
            payload[name] = draw(st.one_of(fields[name][1], fields[name][1], fields[name][1], edge_values))
        elif damage < 8:  # so does an envelope field
            name = draw(st.sampled_from(sorted(ENVELOPE_WRONG)))
            document[name] = draw(
                st.one_of(ENVELOPE_WRONG[name], ENVELOPE_WRONG[name], ENVELOPE_WRONG[name], edge_values)
            )
        elif damage == 8:  # a field goes missing
            target = payload if draw(st.booleans()) and payload else document
            target.pop(draw(st.sampled_from(sorted(target))))
        else:  # an unknown field comes along
            target = payload if draw(st.booleans()) else document
            target[draw(st.sampled_from(["extra", "Type", "ts ", "node_id", "rule"]))] = draw(edge_values)
    return document


def encode(document: dict[str, Any], style: int) -> bytes:
    """The document as a producer might write it: compact or spaced, escaped or not, with a key repeated."""
    if style == 1:
        return json.dumps(document, indent=1, ensure_ascii=True).encode()
    if style == 2 and document:  # a repeated key: JSON parsers keep the last value
        first = next(iter(document))
        return (
            json.dumps(document)[:-1].encode()
            + b', "'
            + first.encode()
            + b'": '
            + json.dumps(document[first]).encode()
            + b"}"
        )
    if style == 3:  # keys written with escapes
        return json.dumps(document).replace('"ts"', '"\\u0074s"').replace('"type"', '"typ\\u0065"').encode()
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


@MANY
@given(documents(), st.integers(0, 5))
@example({"schema_version": 1, "event_id": str(uuid.UUID(int=1)), "ts": "2025-01-01T00:00:00.1234567Z",
          "job_id": "j", "type": "job.started", "payload": {"node_ids": ["n"]}}, 0)  # fmt: skip
@example({"schema_version": 1, "event_id": str(uuid.UUID(int=1)), "ts": "2025-01-01T00:00:00Z",
          "job_id": "\ud800", "type": "job.started", "payload": {"node_ids": ["n"]}}, 0)  # fmt: skip
def test_generated_messages_get_parse_event_s_verdict(document: dict[str, Any], style: int) -> None:
    check(encode(document, style))


@MANY
@given(st.binary(max_size=300))
def test_arbitrary_bytes_get_parse_event_s_verdict(raw: bytes) -> None:
    check(raw)


@settings(max_examples=300, deadline=None)
@given(documents(), st.integers(0, 400), st.binary(min_size=1, max_size=3))
def test_damaged_messages_get_parse_event_s_verdict(document: dict[str, Any], at: int, junk: bytes) -> None:
    raw = encode(document, 0)
    assume(at < len(raw))
    check(raw[:at] + junk + raw[at + len(junk) :])


def test_the_generator_produces_both_verdicts() -> None:
    """The property means something only if both sides are well exercised: count the fast path's verdicts
    on a fixed sample of generated messages."""
    accepted = refused = 0

    @settings(max_examples=400, deadline=None, database=None, derandomize=True)
    @given(documents(), st.integers(0, 5))
    def sample(document: dict[str, Any], style: int) -> None:
        nonlocal accepted, refused
        if check(encode(document, style)) is None:
            refused += 1
        else:
            accepted += 1

    sample()
    assert accepted >= 20 and refused >= 100, (accepted, refused)
