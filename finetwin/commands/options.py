"""Options several command groups share."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from twin.settings import Settings

ModelsDir = Annotated[
    Path | None,
    typer.Option(
        "--models",
        metavar="DIR",
        help="model registry directory (default FINETWIN_MODELS_DIR or DATA_DIR/models)",
    ),
]
Json = Annotated[bool, typer.Option("--json", help="print JSON")]


def models_dir(option: Path | None, settings: Settings) -> Path:
    return option if option is not None else settings.resolved_models_dir()


def first_error(exc: Exception) -> str:
    """The first problem pydantic found, as `field.path: message`."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        return f"{where}: {first.get('msg', 'invalid')}" if where else str(first.get("msg", ""))
    return str(exc)
