"""`finetwin info`: the version, the data directory, the store and the model versions in use."""

from __future__ import annotations

import typer

from finetwin.commands import add_command
from finetwin.settings import Settings


def register(app: typer.Typer) -> None:
    add_command(app, info, "info", help="version, data directory, store and model versions in use")


def info(ctx: typer.Context) -> int:
    from finetwin.info import describe

    settings: Settings = ctx.obj
    describe(settings, with_counts=True)
    return 0
