"""`finetwin models list | show | promote | rollback`: the model registry."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from finetwin import output
from finetwin.commands import add_command
from finetwin.commands.options import Json, ModelsDir, models_dir
from finetwin.errors import CommandError
from finetwin.numbers import num, pct
from finetwin.settings import Settings

Version = Annotated[str, typer.Argument(help="e.g. v0003")]


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="list, show, promote or roll back model versions", no_args_is_help=True)
    add_command(
        group,
        list_versions,
        "list",
        help="every version, its held-out metrics, the one in use",
        group="models",
    )
    add_command(
        group, show, "show", help="one version's metadata (default: the one in use), verified", group="models"
    )
    add_command(
        group,
        promote,
        "promote",
        help="put a version in use if it is not worse than the current",
        group="models",
    )
    add_command(
        group, rollback, "rollback", help="back to the version in use before the current one", group="models"
    )
    app.add_typer(group, name="models")


def list_versions(ctx: typer.Context, models: ModelsDir = None, as_json: Json = False) -> int:
    from calibrate.registry import ModelRegistry

    settings: Settings = ctx.obj
    registry = ModelRegistry(models_dir(models, settings))
    versions = registry.list_versions()
    if as_json:
        print(json.dumps([_listed(info) for info in versions], indent=2))
        return 0
    if not versions:
        output.say(f"no model versions in {registry.root}")
        return 0
    rows = []
    for info in versions:
        m, data = info.metadata.get("heldout_metrics", {}), info.metadata.get("data", {})
        rows.append([
            f"{'*' if info.in_use else ' '} {info.version}", info.metadata.get("created_at", ""),
            data.get("n_rows", 0), _sources(data), pct(m.get("throughput_mdape")),
            pct(m.get("throughput_mape")), num(m.get("failure_balanced_accuracy")),
            pct(m.get("band_coverage")), info.metadata.get("reason", ""),
        ])  # fmt: skip
    columns = ["  version", "created", ("rows", "right"), "learned from", ("MdAPE", "right"),
               ("MAPE", "right"), ("bal.acc", "right"), ("band", "right"), "reason"]  # fmt: skip
    output.show(output.table(columns, rows))
    output.say("* = in use")
    return 0


def _sources(data: dict[str, Any]) -> str:
    """What a version learned from, in a few words: "benchmark", "benchmark + 120 observed", "observed".
    Every version's reason read "finetwin calibrate", whether or not it learned from observed runs."""
    by_source = data.get("rows_by_source") or {}
    benchmark = sum(n for name, n in by_source.items() if str(name).startswith("benchmark"))
    observed = sum(n for name, n in by_source.items() if not str(name).startswith("benchmark"))
    parts = (["benchmark"] if benchmark else []) + ([f"{observed:,} observed"] if observed else [])
    return " + ".join(parts) or "-"


def _listed(info: Any) -> dict[str, Any]:
    """One version as `models list --json` gives it."""
    metadata = info.metadata
    return {
        "version": info.version, "in_use": info.in_use, "created_at": metadata.get("created_at"),
        "reason": metadata.get("reason"), "rows": metadata.get("data", {}).get("n_rows"),
        "rows_by_source": metadata.get("data", {}).get("rows_by_source", {}),
        "heldout_metrics": metadata.get("heldout_metrics", {}),
    }  # fmt: skip


def show(
    ctx: typer.Context,
    version: Annotated[str | None, typer.Argument(help="e.g. v0003")] = None,
    models: ModelsDir = None,
) -> int:
    from calibrate.registry import ModelRegistry, RegistryError

    settings: Settings = ctx.obj
    registry = ModelRegistry(models_dir(models, settings))
    version = version or registry.in_use()
    if version is None:
        raise CommandError(f"no version is in use in {registry.root}; name one (finetwin models list)")
    metadata = registry.metadata(version)
    try:
        registry.verify(version)
        verified, status = "every artifact matches its manifest", 0
    except RegistryError as exc:
        # Shown, and said by the exit status too: a script that checks a version by `models show` read 0.
        verified, status = f"FAILED: {exc}", 1
    print(json.dumps({**metadata, "in_use": version == registry.in_use(), "verified": verified}, indent=2))
    if status:
        output.error("models show", f"{version} fails verification")
    return status


def promote(
    ctx: typer.Context,
    version: Version,
    force: Annotated[bool, typer.Option("--force", help="promote even if its metrics are worse")] = False,
    models: ModelsDir = None,
) -> int:
    from calibrate.promotion import manual_verdict
    from calibrate.registry import ModelRegistry, RegistryError

    settings: Settings = ctx.obj
    registry = ModelRegistry(models_dir(models, settings))
    pointer_damaged = False  # the in-use pointer cannot be read: --force replaces it
    candidate = registry.metadata(version)
    try:
        current = registry.in_use()
    except RegistryError:
        if not force:
            raise
        current, pointer_damaged = None, True
    if current == version:
        output.say(f"{version} is already in use")
        return 0
    in_use = registry.metadata(current) if current else None
    verdict, basis = manual_verdict(candidate, in_use, settings.promote_tolerance)
    if not verdict.not_worse and not force:
        reasons = "; ".join(r for r in verdict.reasons if "WORSE" in r or "cannot" in r)
        raise CommandError(
            f"{version} is worse than {current} in use ({basis}): {reasons}. "
            "Use --force to promote it anyway."
        )
    reason = "finetwin models promote" + (" --force" if force and not verdict.not_worse else "")
    if pointer_damaged:
        reason += " (the in-use pointer could not be read, and was replaced)"
    registry.promote(version, reason=reason, mend=pointer_damaged)
    if pointer_damaged:
        output.say(
            f"{version} is in use; the in-use pointer that could not be read was replaced, and with it what "
            "`models rollback` could go back to"
        )
        return 0
    output.say(f"{version} is in use (was {current or 'none'}; {basis})")
    return 0


def rollback(ctx: typer.Context, models: ModelsDir = None) -> int:
    from calibrate.registry import ModelRegistry

    settings: Settings = ctx.obj
    registry = ModelRegistry(models_dir(models, settings))
    current = registry.in_use()
    version = registry.rollback(reason="finetwin models rollback")
    output.say(f"{version} is in use again (was {current})")
    return 0
