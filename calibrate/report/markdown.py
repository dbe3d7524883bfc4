"""The few Markdown pieces every section of report.md is built from: a number, a table, a figure, the
summary of a set of pair ratios, and the sentence a section without data says instead."""

from __future__ import annotations

from typing import Any

NO_DATA = "_No data"


def fmt(value: float | None, digits: int = 2, suffix: str = "") -> str:
    """`value` rounded to `digits`; "—" (without the suffix: "—×" reads as a typo) when there is none. A value
    that rounds to zero is written without a sign: "-0 %" says a loss the data does not show."""
    if value is None:
        return "—"
    text = f"{value:,.{digits}f}"
    if text.startswith("-") and not text.strip("-0.,"):
        text = text[1:]
    return f"{text}{suffix}"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def figure(figures: dict[str, str | None], name: str, caption: str, missing: str) -> str:
    file = figures.get(name)
    return f"![{caption}]({file})\n\n*{caption}*" if file else f"{NO_DATA}: {missing}._"


def summary_cells(s: dict[str, Any], unit: str = "") -> list[str]:
    if not s["pairs"]:
        return ["0", "no data", "—", "—"]
    return [str(s["pairs"]), fmt(s["median"], 2, unit), f"{fmt(s['q25'])}–{fmt(s['q75'])}", fmt(s["iqr"])]
