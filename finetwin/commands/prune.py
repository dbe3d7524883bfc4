"""`finetwin prune`: delete the telemetry the store keeps no longer (`twin.retention`), now. The API does the
same every 10 minutes; this is for a store no API runs on, or to see what it would delete."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from finetwin import output
from finetwin.commands import add_command
from finetwin.commands.options import Json, first_error
from finetwin.errors import CommandError
from finetwin.settings import Settings

KeepDays = Annotated[
    float | None,
    typer.Option(
        "--keep-days",
        metavar="DAYS",
        help="days of telemetry time to keep (default FINETWIN_KEEP_TELEMETRY_DAYS)",
    ),
]
DryRun = Annotated[bool, typer.Option("--dry-run", help="count what would be deleted; delete nothing")]


def register(app: typer.Typer) -> None:
    add_command(
        app,
        prune,
        "prune",
        help="delete the telemetry older than FINETWIN_KEEP_TELEMETRY_DAYS of telemetry time",
        epilog="Deletes, dated before the horizon: the events of the jobs that ended before it, the nodes' "
        "reports (each node's latest stays), the forecasts' scores of the days before it (their daily sums "
        "stay). Jobs, observed runs, live errors, the audit log and model versions are kept. The API does "
        "this every 10 minutes (docs/telemetry.md).",
    )


def prune(
    ctx: typer.Context, keep_days: KeepDays = None, dry_run: DryRun = False, as_json: Json = False
) -> int:
    from pydantic import ValidationError

    from finetwin.wiring import migrated_engine
    from twin.retention import prune_due

    settings: Settings = ctx.obj
    if keep_days is not None:
        try:
            settings = Settings.model_validate(settings.model_dump() | {"keep_telemetry_days": keep_days})
        except ValidationError as exc:
            raise CommandError(f"--keep-days: {first_error(exc)}") from None
    if not settings.keep_telemetry_days:
        raise CommandError("FINETWIN_KEEP_TELEMETRY_DAYS is 0: the store keeps everything (--keep-days DAYS)")
    engine = migrated_engine(settings)
    try:
        pruned = prune_due(engine, settings, dry_run=dry_run)
    finally:
        engine.dispose()
    if pruned is None:  # the settings keep something (checked above): there is no telemetry
        output.say(f"the store holds no telemetry of cluster {settings.cluster_id!r}: nothing to prune")
        return 0
    if as_json:
        print(json.dumps(pruned.describe() | {"dry_run": dry_run}, indent=2))
        return 0
    verb = "would delete" if dry_run else "deleted"
    output.say(
        f"cluster {pruned.cluster_id!r}: telemetry kept from {pruned.kept_from.isoformat()}; {verb} "
        f"{pruned.events:,} events, {pruned.node_changes:,} node changes, {pruned.scores:,} forecast scores"
    )
    return 0
