"""Options several command groups share."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

import typer

from finetwin.settings import Settings

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


def validation_message(exc: Exception, known: Iterable[str]) -> str:
    """What is wrong with a document pydantic refused, all at once: unknown keys with the known key they
    most resemble (`batchsize` -> did you mean `batch_size`?), then missing keys, else the first error."""
    import difflib

    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    found = errors()
    known = list(known)
    unknown = [".".join(map(str, e["loc"])) for e in found if e.get("type") == "extra_forbidden"]
    missing = [".".join(map(str, e["loc"])) for e in found if e.get("type") == "missing"]
    if not unknown and not missing:
        return first_error(exc)
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(key.rsplit(".", 1)[-1], known, n=1, cutoff=0.6)
        parts.append(f"unknown key {key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    if missing:
        parts.append(f"missing: {', '.join(missing)}")
    return "; ".join(parts) + f" (known keys: {', '.join(known)})"
