"""Help that shows a flag as a flag: typer 0.29's rich help gives every option a type column, flags too,
so `--quiet <bool>` and `-v --verbose <int>` read as options that take a value (`--quiet true`, `-v 2`),
which typer then refuses. A flag or a counter takes none: its type cell is left empty."""

from __future__ import annotations

from typing import Any

from typer.core import TyperOption

_PATCHED = "_finetwin_flags_take_no_value"


def flags_take_no_value() -> None:
    """Once per process: flags and counters show no type in `--help` (every other option keeps its own)."""
    original = TyperOption.display_type_rich
    if getattr(original, _PATCHED, False):
        return

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        if (self.is_flag or self.count) and self.metavar is None:
            return None
        return original(self, ctx)

    setattr(display_type_rich, _PATCHED, True)
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]
