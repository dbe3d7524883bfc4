"""What `finetwin --version` and `finetwin info` print: the version, where the data lives, the store in
use. Reads nothing that could be slow or missing: a store that is not there yet is said to be so."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from finetwin import output
from finetwin.settings import Settings


def finetwin_version() -> str:
    try:
        return version("finetwin")
    except PackageNotFoundError:  # run from a source tree without an install
        return "unknown"


def facts(settings: Settings) -> dict[str, str]:
    """Each line of the description: name -> value (paths absolute, a missing one marked)."""
    data_dir = settings.data_dir.resolve()
    store = settings.store_description()
    if not settings.database_url and not Path(store).exists():
        store += " (not created yet)"
    models = settings.resolved_models_dir().resolve()
    return {
        "version": finetwin_version(),
        "data directory": f"{data_dir}{'' if data_dir.exists() else ' (not created yet)'}",
        "store": store,
        "models": f"{models}{'' if models.exists() else ' (none yet)'}",
    }


def describe(settings: Settings, *, with_counts: bool) -> None:
    """Prints the facts (and, with counts, what the store and the registry hold)."""
    lines = facts(settings)
    if with_counts:
        lines.update(_counts(settings))
    width = max(len(name) for name in lines)
    output.say(f"finetwin {lines.pop('version')}")
    for name, value in lines.items():
        output.say(f"  {name.ljust(width)}  {value}")
    output.say("  (FINETWIN_DATA_DIR moves the data directory; FINETWIN_DATABASE_URL names another store)")


def _counts(settings: Settings) -> dict[str, str]:
    from calibrate.registry import ModelRegistry

    registry = ModelRegistry(settings.resolved_models_dir())
    versions = registry.list_versions() if registry.root.exists() else []
    in_use = next((info.version for info in versions if info.in_use), None)
    counts = {"model versions": f"{len(versions)}" + (f", {in_use} in use" if in_use else "")}
    if in_use is not None:
        from calibrate import serving

        counts["trees"] = serving.engine_of_in_use(registry) or "none"
    return counts
