"""`finetwin advise`: advice for one job configuration (will it run, repair, fewest GPUs, best throughput
and cost, placement, optimizations)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from finetwin import output
from finetwin.commands import add_command
from finetwin.commands.options import ModelsDir, validation_message
from finetwin.errors import CommandError
from finetwin.settings import Settings


def register(app: typer.Typer) -> None:
    add_command(app, advise, "advise", help="advice for one job configuration (JSON or YAML file)")


def advise(
    ctx: typer.Context,
    config: Annotated[Path, typer.Argument(help="JSON or YAML file with one configuration ('-' = stdin)")],
    as_json: Annotated[bool, typer.Option("--json", help="print the whole answer as JSON")] = False,
    models: ModelsDir = None,
) -> int:
    from advisor.advice import advise_job
    from advisor.advice_plan import AdviceError
    from advisor.advice_predict import ModelsUnusable
    from advisor.advice_schemas import AdviceRequest
    from advisor.advice_text import render_text
    from advisor.config_file import ConfigFileError, read_config_file
    from calibrate.registry import ModelRegistry, RegistryError, load_in_use_quickly

    settings: Settings = ctx.obj
    try:
        raw = read_config_file(config)
    except ConfigFileError as exc:
        raise CommandError(str(exc)) from exc
    try:
        request = AdviceRequest.model_validate(raw)
    except ValueError as exc:
        raise CommandError(f"{config}: {validation_message(exc, AdviceRequest)}") from exc
    directory = models if models is not None else settings.resolved_models_dir()
    try:
        loaded = load_in_use_quickly(ModelRegistry(directory))
    except RegistryError as exc:
        raise CommandError(f"the model in use cannot be loaded: {exc}") from exc
    if loaded is None:
        raise CommandError(f"no calibrated models yet in {directory}: run `finetwin calibrate` first")
    version, models = loaded
    job, dataset_tokens = request.to_job()
    try:
        answer = advise_job(job, dataset_tokens, models, model_version=version)
    except AdviceError as exc:
        raise CommandError(f"{config}: {exc}") from exc
    except ModelsUnusable as exc:
        raise CommandError(f"{exc}; run `finetwin calibrate`") from exc
    if as_json:
        # As the API answers: a number JSON cannot hold (infinity, NaN) is null, never `Infinity`.
        print(answer.model_dump_json(indent=2))
    else:
        output.say(render_text(answer))
    return 0
