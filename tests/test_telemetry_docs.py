"""docs/telemetry.md stays true: one example per event type, each accepted by the contract."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ingest.events import EVENT_TYPES, parse_event
from ingest.worker import DEAD_LETTER_KINDS
from twin.limits import EVENT_TIME_WINDOW, STORE_INT_MAX

DOC = Path(__file__).resolve().parents[1] / "docs" / "telemetry.md"


def test_every_event_type_has_one_example_that_parses() -> None:
    blocks = re.findall(r"```json\n(.*?)```", DOC.read_text(), flags=re.S)
    parsed = [parse_event(block.encode()) for block in blocks]
    assert sorted(e.type for e in parsed) == sorted(EVENT_TYPES)
    for block, event in zip(blocks, parsed, strict=True):
        # The example says exactly what the model would say back (no field silently ignored).
        assert json.loads(event.model_dump_json(exclude_none=True)) == json.loads(block)


def test_the_bounds_and_every_dead_letter_reason_are_documented() -> None:
    text = DOC.read_text()
    dead_letters = text.split("## Dead letters", 1)[1]
    for kind in DEAD_LETTER_KINDS:
        assert f"`{kind}`" in dead_letters, kind
    bounds = text.split("## Bounds", 1)[1].split("## Event types", 1)[0]
    assert f"{STORE_INT_MAX:,}" in bounds
    assert f"within {round(EVENT_TIME_WINDOW.days / 365.25)} years of now" in bounds
    assert "FINETWIN_MAX_CLOCK_SKEW" in bounds and "`clock_skew`" in bounds
