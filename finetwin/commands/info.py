"""`finetwin info`: the version, the data directory, the store and the model versions in use."""

from __future__ import annotations

import json

import typer

from finetwin.commands import add_command
from finetwin.commands.options import Json
from finetwin.settings import Settings


def register(app: typer.Typer) -> None:
    add_command(app, info, "info", help="version, data directory, store and model versions in use")


def info(ctx: typer.Context, as_json: Json = False) -> int:
    from finetwin.info import describe, description

    settings: Settings = ctx.obj
    if as_json:
        print(json.dumps(description(settings), indent=2))
        return 0
    describe(settings, with_counts=True)
    return 0
