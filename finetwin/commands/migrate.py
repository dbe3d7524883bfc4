"""`finetwin migrate`: bring the store's schema to the newest version (as the role that owns the schema)."""

from __future__ import annotations

import typer

from finetwin import output
from finetwin.commands import add_command
from finetwin.errors import CommandError
from finetwin.settings import Settings


def register(app: typer.Typer) -> None:
    add_command(
        app,
        migrate,
        "migrate",
        help="bring the store's schema to the newest version (run as the role that owns the schema)",
        epilog="Applies the pending migrations to FINETWIN_DATABASE_URL. In production this runs as the "
        "schema's owner, and the services connect as a role that owns nothing (docs/advisor.md).",
    )


def migrate(ctx: typer.Context) -> int:
    from sqlalchemy.exc import DBAPIError

    from finetwin.schema import StoreError, store_failure
    from finetwin.schema import migrate as migrate_schema
    from twin.db import engine_from_settings

    settings: Settings = ctx.obj
    engine = engine_from_settings(settings)
    where = engine.url.render_as_string(hide_password=True)
    try:
        migrate_schema(engine)
    except (DBAPIError, StoreError) as exc:
        raise CommandError(f"cannot migrate {where}: {store_failure(exc)}") from None
    finally:
        engine.dispose()
    output.say(f"{where}: schema up to date")
    return 0
