"""docs/telemetry.md stays true: one example per event type, each accepted by the contract."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ingest.events import EVENT_TYPES, parse_event

DOC = Path(__file__).resolve().parents[1] / "docs" / "telemetry.md"


def test_every_event_type_has_one_example_that_parses() -> None:
    blocks = re.findall(r"```json\n(.*?)```", DOC.read_text(), flags=re.S)
    parsed = [parse_event(block.encode()) for block in blocks]
    assert sorted(e.type for e in parsed) == sorted(EVENT_TYPES)
    for block, event in zip(blocks, parsed, strict=True):
        # The example says exactly what the model would say back (no field silently ignored).
        assert json.loads(event.model_dump_json(exclude_none=True)) == json.loads(block)
