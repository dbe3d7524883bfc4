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
    found = description(settings, with_counts=False)
    return {
        "version": str(found["version"]),
        "data directory": f"{found['data_dir']}{'' if found['data_dir_exists'] else ' (not created yet)'}",
        "store": f"{found['store']}{'' if found['store_exists'] else ' (not created yet)'}",
        "models": f"{found['models_dir']}{'' if found['models_dir_exists'] else ' (none yet)'}",
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


def description(settings: Settings, *, with_counts: bool = True) -> dict[str, object]:
    """What `finetwin info --json` prints, as values a script reads without parsing: where the data, the
    store and the models are, and (with counts) the model versions and how this machine runs the trees."""
    data_dir, models = settings.data_dir.resolve(), settings.resolved_models_dir().resolve()
    store = settings.store_description()
    found: dict[str, object] = {
        "version": finetwin_version(),
        "data_dir": str(data_dir),
        "data_dir_exists": data_dir.exists(),
        "store": store,
        "store_exists": bool(settings.database_url) or Path(store).exists(),
        "models_dir": str(models),
        "models_dir_exists": models.exists(),
    }
    if with_counts:
        found.update(_registry(models))
    return found


def _registry(models: Path) -> dict[str, object]:
    """The versions, the one in use and how its trees run; `models_problem`: why the registry cannot be read
    (a damaged in-use pointer or version), said here where every other command stops at it."""
    from calibrate.registry import ModelRegistry, RegistryError

    registry = ModelRegistry(models)
    try:
        versions = registry.list_versions() if registry.root.exists() else []
    except RegistryError as exc:
        return {"model_versions": len(registry.versions()), "model_in_use": None, "trees": None,
                "models_problem": str(exc)}  # fmt: skip
    in_use = next((info.version for info in versions if info.in_use), None)
    trees = None
    if in_use is not None:
        from calibrate import serving

        trees = serving.engine_of_in_use(registry)
    return {"model_versions": len(versions), "model_in_use": in_use, "trees": trees, "models_problem": None}


def _counts(settings: Settings) -> dict[str, str]:
    described = _registry(settings.resolved_models_dir().resolve())
    in_use = described["model_in_use"]
    counts = {"model versions": f"{described['model_versions']}" + (f", {in_use} in use" if in_use else "")}
    if described["models_problem"]:
        counts["model registry"] = f"cannot be read: {described['models_problem']}"
    if in_use is not None:
        counts["trees"] = str(described["trees"] or "none")
    return counts
