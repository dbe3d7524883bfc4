"""docs/report.md documents numbers.json field by field, and docs/report-example/ holds a run's figures:
checked against what a report on the bundled sample actually writes, so a new field cannot go undocumented."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from calibrate.loader import load_benchmark
from calibrate.report import compute_numbers
from calibrate.report.figures import FIGURE_FILES
from twin.domain import GPU_TYPES, METHODS

DOCS = Path(__file__).resolve().parents[2] / "docs"


def is_data_key(key: str, parent: str) -> bool:
    """A key that is a value of the data (a GPU type, a batch size, a campaign, a model, a doubling "1->2"),
    not a field: field names are snake_case words; data keys hold a digit first, a hyphen or a space, or
    name a GPU type or a method. The definitions are terms, documented as a whole."""
    return parent == "definitions" or key in GPU_TYPES or key in METHODS or bool(re.search(r"[-\s]|^\d", key))


def field_paths(value: Any, path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every path of field names (data keys dropped) in the numbers."""
    paths: set[tuple[str, ...]] = set()
    if isinstance(value, dict):
        for key, inner in value.items():
            parent = path[-1] if path else ""
            step = path if is_data_key(key, parent) else (*path, key)
            paths |= field_paths(inner, step) or {step}
    elif isinstance(value, list) and value and isinstance(value[0], dict):
        paths |= field_paths(value[0], path)
    return paths


def sections(text: str) -> dict[str, str]:
    """`### `key`` headings (one or several keys) → the text under them."""
    out: dict[str, str] = {}
    for heading, body in re.findall(r"^### ([^\n]+)\n(.*?)(?=^### |^## |\Z)", text, flags=re.M | re.S):
        for key in re.findall(r"`([a-z0-9_]+)`", heading):
            out[key] = body
    return out


@pytest.fixture(scope="module")
def numbers(sample_csv: Path) -> dict[str, Any]:
    return compute_numbers(load_benchmark(sample_csv), source=str(sample_csv))


def test_every_field_of_numbers_json_is_documented(numbers: dict[str, Any]) -> None:
    numbers = {**numbers, "figures": dict.fromkeys(FIGURE_FILES)}  # build_report adds them
    text = (DOCS / "report.md").read_text(encoding="utf-8")
    documented = sections(text)
    summary = text.split("### The pair summary")[1].split("##")[0]  # the fields every pair summary has
    missing = []
    for path in sorted(field_paths(numbers)):
        top, *fields = path
        if top not in documented:
            missing.append(top)
            continue
        body = documented[top] + summary
        missing += [".".join(path) for name in fields if f"`{name}`" not in body]
    assert not missing, f"numbers.json fields missing from docs/report.md: {sorted(set(missing))}"


def test_the_example_holds_every_figure_of_a_run_on_the_sample() -> None:
    example = DOCS / "report-example"
    for name in FIGURE_FILES.values():
        assert (example / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    text = (example / "report.md").read_text(encoding="utf-8")
    assert "3,983 experiments" in text
    assert all(f"({name})" in text for name in FIGURE_FILES.values())
