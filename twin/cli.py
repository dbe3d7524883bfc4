"""The `finetwin` command: the composition root. Each package registers its own subcommands; a handler
builds its parts from the one `Settings` object and calls into the packages (no business logic here).

Registration modules import only argparse-level things so `finetwin --help` stays fast; heavy imports
(pandas, scikit-learn, Kafka, FastAPI) happen inside the handlers.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from twin.settings import Settings

if TYPE_CHECKING:
    from datetime import datetime

    import pandas as pd
    from fastapi import FastAPI
    from sqlalchemy import Engine

    from ingest.apply import BatchHook
    from twin.protocols import JobModels

# Each module has `register(subparsers) -> None`; a subcommand sets `handler(args, settings) -> int`.
COMMAND_MODULES = (
    "ingest.commands",
    "calibrate.commands",
    "twin.commands",
    "twin.capacity_commands",
    "advisor.commands",
    "calibrate.report.commands",
)

Handler = Callable[[argparse.Namespace, Settings], int]


class CommandError(Exception):
    """A user error a command reports on stderr with exit status 2, without a traceback."""


# --- Cross-package wiring. The composition root is the one place in `twin` allowed to reach into the other
# packages; commands in `twin` and `ingest` get their collaborators from these functions.


def load_job_models(settings: Settings, models_dir: Path | None = None) -> JobModels | None:
    """The calibrated models in use (from the registry), or None when none has been fitted yet."""
    from calibrate.registry import load_models_in_use

    return load_models_in_use(models_dir or settings.resolved_models_dir())


def load_job_models_at(
    settings: Settings, at: datetime, models_dir: Path | None = None
) -> tuple[str, JobModels] | None:
    """The version that was in use at telemetry time `at` and was fitted on nothing after it, or None."""
    from calibrate.registry import ModelRegistry

    registry = ModelRegistry(models_dir or settings.resolved_models_dir())
    version = registry.version_in_use_at(at)
    return None if version is None else (version, registry.load(version))


def load_benchmark_table(path: Path) -> pd.DataFrame:
    """A benchmark CSV, validated and typed (raises calibrate.loader.BenchmarkFormatError)."""
    from calibrate.loader import load_benchmark

    return load_benchmark(path)


def fit_benchmark_models(path: Path, seed: int = 0) -> JobModels:
    """Models calibrated on one benchmark file, in memory and not registered (backtests on that file).
    Raises ModuleNotFoundError while calibrate.fit is not there, BenchmarkFormatError for a bad file."""
    from datetime import UTC, datetime

    from calibrate.dataset import WeightPolicy, assemble, load_benchmarks
    from calibrate.fit import fit_models

    tables, described = load_benchmarks([path])
    data = assemble(tables, None, now=datetime.now(UTC), policy=WeightPolicy(), described=described)
    return fit_models(data.table, data.weights, seed=seed)


def ingest_batch_hooks(settings: Settings) -> list[BatchHook]:
    """What ingest runs inside each batch's transaction after applying it (stored predictions, live error)."""
    try:
        from calibrate.live_error import prediction_hook
    except ModuleNotFoundError as exc:  # transitional until calibrate.live_error lands
        if exc.name != "calibrate.live_error":
            raise
        return []
    return [prediction_hook(settings)]


def bundled_benchmark_path() -> Path:
    """The real LLMFineTuningBench sample shipped with finetwin (the default benchmark to replay)."""
    from calibrate.loader import bundled_benchmark_path as bundled

    return bundled()


def build_api_app(
    settings: Settings,
    engine: Engine | None = None,
    *,
    run_migrations: bool = True,
    kafka_bootstrap: str | None = None,
) -> FastAPI:
    """The HTTP API and dashboard (`finetwin up` serves it next to ingest, on the same store).

    `kafka_bootstrap`: the broker `up` started (when FINETWIN_KAFKA_BOOTSTRAP is unset), so the API's outbox
    relay publishes approved actions to it. On a store without any API key, creates an approver key and
    prints it once on stderr: the user of `finetwin up` needs one to use the dashboard and the API.
    """
    from advisor.app import create_app
    from advisor.keys import ensure_first_key

    if kafka_bootstrap and not settings.kafka_bootstrap:
        settings = settings.model_copy(update={"kafka_bootstrap": kafka_bootstrap})
    app = create_app(settings, engine, run_migrations=run_migrations)
    key = ensure_first_key(app.state.engine)
    if key is not None:
        print(
            f"first API key (role approver; shown once, keep it; more with `finetwin keys create`):\n  {key}",
            file=sys.stderr,
            flush=True,
        )
    return app


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="finetwin", description="A digital twin for GPU clusters that run LLM fine-tuning jobs."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2) if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("kafka").setLevel(logging.WARNING if args.verbose < 2 else logging.DEBUG)
    settings = Settings()
    handler: Handler = args.handler
    try:
        return int(handler(args, settings) or 0)
    except CommandError as exc:
        print(f"finetwin {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
