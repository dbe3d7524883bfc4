"""Options several command groups share."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from pydantic import BaseModel

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
    from pydantic import ValidationError

    from twin.input_errors import first_error as first_validation_error

    return first_validation_error(exc) if isinstance(exc, ValidationError) else str(exc)


def validation_message(exc: Exception, model: type[BaseModel], also: Sequence[str] = ()) -> str:
    """What is wrong with a document pydantic refused (`twin.input_errors.validation_message`)."""
    from pydantic import ValidationError

    from twin.input_errors import validation_message as describe

    return describe(exc, model, also) if isinstance(exc, ValidationError) else str(exc)
