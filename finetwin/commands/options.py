"""Options several command groups share."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Annotated

import typer
from pydantic import BaseModel

from finetwin.errors import CommandError
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
Bootstrap = Annotated[
    str | None, typer.Option(help="Kafka bootstrap servers (default FINETWIN_KAFKA_BOOTSTRAP)")
]

# The word that names the bundled real sample wherever a benchmark CSV is asked for (`--bench bundled`).
BUNDLED = "bundled"


def bundled_or_file(path: Path) -> Path:
    """The word `bundled` as the bundled real sample, unless a file of that name is where it is run."""
    if str(path) != BUNDLED or path.exists():
        return path
    from finetwin.wiring import bundled_benchmark_path

    return bundled_benchmark_path()


def bench_option(value: Path | list[Path] | None) -> Path | list[Path] | None:
    """A `--bench` option's callback (or a repeatable one's): `bundled_or_file` of its value. `report --bench
    bundled` took the word, and every other command read it as a file name."""
    if isinstance(value, list):
        return [bundled_or_file(v) for v in value]
    return None if value is None else bundled_or_file(value)


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


def given_options(ctx: typer.Context, names: Collection[str]) -> list[str]:
    """Those of the parameters `names` given on the command line, as spelled there (`--since`). Asked of
    the parser, not of the values: `--runs 8` where 8 is the default was still given. (Its ParameterSource
    is compared by name: typer carries a click of its own, whose enum is not click's.)"""
    return [
        max(param.opts, key=len)
        for param in ctx.command.params
        if param.name in names and _source_name(ctx, param.name) not in (None, "DEFAULT")
    ]


def _source_name(ctx: typer.Context, name: str) -> str | None:
    source = ctx.get_parameter_source(name)
    return None if source is None else source.name


def refuse_options(ctx: typer.Context, names: Collection[str], applies: str, fix: str) -> None:
    """A CommandError when any of `names` was given where it does nothing: `--window applies only to ...:
    FIX`, `{options}` in `fix` standing for the options. Said rather than ignored, as the user meant them
    to change something."""
    given = given_options(ctx, names)
    if not given:
        return
    options = given[0] if len(given) == 1 else f"{', '.join(given[:-1])} and {given[-1]}"
    verb = "applies" if len(given) == 1 else "apply"
    raise CommandError(f"{options} {verb} only {applies}: {fix.format(options=options)}")
