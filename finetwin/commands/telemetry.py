"""`finetwin ingest` (consume job telemetry into the store) and `finetwin replay` (a benchmark CSV as job
telemetry on Kafka)."""

from __future__ import annotations

import functools
import logging
import math
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from finetwin import output
from finetwin.commands import add_command
from finetwin.commands.options import BUNDLED, Bootstrap, bench_option
from finetwin.errors import CommandError
from finetwin.settings import Settings
from finetwin.signals import stop_on_signals

if TYPE_CHECKING:
    import pandas as pd
    from sqlalchemy import Engine

    from ingest.replay import ReplayPlan

log = logging.getLogger(__name__)

EXIT_UNDECODABLE = 3  # `finetwin ingest` stopped at a record batch it cannot decode
# After SIGTERM / Ctrl-C, `finetwin ingest` finishes its batch and exits; if a broker or database that is
# gone holds it up longer than this, it exits anyway (status 1): what it had not committed is redelivered.
STOP_DEADLINE_S = 15.0

Topic = Annotated[
    str | None, typer.Option(help="telemetry topic (default FINETWIN_TELEMETRY_TOPIC or finetwin.telemetry)")
]
Seed = Annotated[int, typer.Option(help="seed of the arrival process and event ids")]
JobPrefix = Annotated[str | None, typer.Option(help="job id prefix (default replay-<seed>-)")]
MeanInterarrival = Annotated[float, typer.Option(help="mean seconds between submissions")]
Quiet = Annotated[bool, typer.Option("--quiet", help="no progress bar")]
Load = Annotated[float, typer.Option(help="utilization the replayed cluster is sized for, in (0, 1]")]
# `finetwin replay`'s cluster is sized for this utilization (ingest.replay.TARGET_UTILIZATION): jobs mostly
# start within minutes.
REPLAY_DEFAULT_LOAD = 0.35
# A replayed job's id is the prefix, `up`'s pass number (at most `1000-`) and the row's line: the telemetry
# holds ids of at most 200 characters, so this leaves room for the pass and a line of up to 15 digits.
MAX_JOB_PREFIX = 180
SECONDS_PER_YEAR = 365.25 * 86400


def _epoch(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(f"not an RFC 3339 time: {text!r}") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


Epoch = Annotated[
    datetime | None,
    typer.Option(
        parser=_epoch, metavar="TIME",
        help="RFC 3339 time the replay's timeline starts at (default: now; pin it for reproducible runs)",
    ),
]  # fmt: skip


def register(app: typer.Typer) -> None:
    add_command(
        app, ingest, "ingest", help="consume job telemetry from Kafka into the store (until SIGTERM / Ctrl-C)"
    )
    add_command(app, replay, "replay", help="replay a benchmark CSV as job telemetry on Kafka")


# --- finetwin ingest


@dataclass(frozen=True)
class IngestOptions:
    """What each consumer of `finetwin ingest` needs (pickled into the children of --processes N)."""

    bootstrap: str
    topic: str
    group: str | None
    batch_size: int | None
    metrics_port: int | None


def ingest(
    ctx: typer.Context,
    bootstrap: Bootstrap = None,
    topic: Topic = None,
    group: Annotated[
        str | None, typer.Option(help="consumer group (default FINETWIN_CONSUMER_GROUP or finetwin-ingest)")
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(help="messages per transaction (default FINETWIN_INGEST_BATCH_SIZE)")
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="serve Prometheus metrics on this port (with --processes N: process i on this port + i), on "
            "the address FINETWIN_API_HOST names (127.0.0.1 by default: 0.0.0.0 lets another host scrape)"
        ),
    ] = None,
    processes: Annotated[
        int, typer.Option(help="consumers to run in the group, each a child process: more use more cores")
    ] = 1,
) -> int:
    from finetwin.wiring import ensure_topics, kafka_bootstrap, migrated_engine
    from ingest.bus import KafkaBus

    settings: Settings = ctx.obj
    if processes < 1:
        raise CommandError(f"--processes must be 1 or more, not {processes}")
    if metrics_port:
        _check_metrics_ports(metrics_port, processes, settings.api_host)
    options = IngestOptions(
        kafka_bootstrap(bootstrap, settings),
        topic or settings.telemetry_topic,
        group,
        batch_size,
        metrics_port,
    )
    engine = migrated_engine(settings)  # migrated here, once, before any consumer starts
    ensure_topics(KafkaBus(options.bootstrap), settings, options.topic)
    if processes == 1:
        return _consume(options, settings, engine, metrics_port)
    engine.dispose()  # each child opens connections of its own
    from ingest.processes import run_children

    child = functools.partial(_consume_in_child, options, settings, logging.getLogger().level)
    return run_children(processes, child, "ingest")


def _check_metrics_ports(first: int, processes: int, host: str) -> None:
    """Said before anything starts: a port taken would otherwise stop its consumer, and with it the rest,
    after the others had joined the group."""
    from ingest.broker import bindable

    for index in range(processes):
        if not bindable(first + index, host):
            whose = f" (process {index}'s: with --processes N, process i serves on --metrics-port + i)"
            raise CommandError(
                f"--metrics-port: {host}:{first + index} is in use{whose if processes > 1 else ''}"
            )


def _consume_in_child(options: IngestOptions, settings: Settings, log_level: int, index: int) -> None:
    """One of `finetwin ingest --processes N`'s consumers (runs in a spawned child process)."""
    from finetwin.logs import own_levels
    from twin.db import engine_from_settings

    logging.basicConfig(
        level=log_level, format="%(asctime)s %(levelname)s %(processName)s %(name)s: %(message)s"
    )
    own_levels(log_level)
    metrics_port = options.metrics_port + index if options.metrics_port else None
    try:
        status = _consume(options, settings, engine_from_settings(settings), metrics_port)
    except KeyboardInterrupt:  # a second Ctrl-C
        status = 130
    sys.exit(status)


def _consume(options: IngestOptions, settings: Settings, engine: Engine, metrics_port: int | None) -> int:
    """Run one ingest worker in this process until SIGTERM / Ctrl-C."""
    from finetwin.wiring import ingest_worker
    from ingest.bus import ConsumerTuning, KafkaBus, UndecodableBatch
    from ingest.worker import settle_garbage_collector

    bus = KafkaBus(options.bootstrap, ConsumerTuning.from_settings(settings))
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr=settings.api_host)
    stop = threading.Event()
    worker = ingest_worker(bus, engine, settings, options.topic, options.group, options.batch_size)
    log.info(
        "ingesting %s on %s into %s (group %s)",
        options.topic,
        options.bootstrap,
        engine.url.render_as_string(),
        options.group or settings.consumer_group,
    )
    settle_garbage_collector()
    status = 0
    with stop_on_signals(stop, deadline_s=STOP_DEADLINE_S):
        try:
            worker.run(stop)
        except UndecodableBatch:  # logged by the worker, with where and why
            status = EXIT_UNDECODABLE
    stats = worker.stats
    log.info(
        "stopped: %d messages, %d events applied, %d duplicates, %d dead letters",
        stats.messages, stats.applied, stats.duplicates, stats.dead_letters,
    )  # fmt: skip
    engine.dispose()
    return status


# --- finetwin replay


def replay(
    ctx: typer.Context,
    bootstrap: Bootstrap = None,
    topic: Topic = None,
    bench: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE", callback=bench_option, help=f"benchmark CSV, or {BUNDLED!r} (the default)"
        ),
    ] = None,
    speed: Annotated[
        float, typer.Option(help="simulated seconds per wall-clock second, 0 = as fast as possible")
    ] = 0.0,
    seed: Seed = 0,
    job_prefix: JobPrefix = None,
    mean_interarrival: MeanInterarrival = 60.0,
    epoch: Epoch = None,
    load: Load = REPLAY_DEFAULT_LOAD,
    quiet: Quiet = False,
) -> int:
    from finetwin.wiring import ensure_topics, kafka_bootstrap
    from ingest.bus import KafkaBus
    from ingest.replay import send_replay

    settings: Settings = ctx.obj
    # The options and the file first: what is wrong with them is said before what is missing to send it.
    check_replay_options(
        speed=speed, seed=seed, job_prefix=job_prefix, mean_interarrival=mean_interarrival, load=load,
        epoch=epoch,
    )  # fmt: skip
    plan = replay_plan(
        settings, bench, speed=speed, seed=seed, job_prefix=job_prefix, mean_interarrival=mean_interarrival,
        epoch=epoch, load=load,
    )  # fmt: skip
    address = kafka_bootstrap(bootstrap, settings)
    topic = topic or settings.telemetry_topic
    ahead = _ahead_of_wall_s(plan, speed)
    if ahead > settings.max_clock_skew.total_seconds():
        log.warning(
            "the replay's timeline starts at %s and runs up to %.0f s ahead of the wall clock: an ingest "
            "bounded by FINETWIN_MAX_CLOCK_SKEW (%s) dead-letters what runs further ahead; raise it there, "
            "or pin --epoch in the past",
            plan.epoch.isoformat(), ahead, settings.max_clock_skew,
        )  # fmt: skip
    bus = KafkaBus(address)
    ensure_topics(bus, settings, topic)
    producer = bus.producer()
    stop = threading.Event()
    try:
        with (
            stop_on_signals(stop),
            output.progress(len(plan.events), "replay", "events", quiet=quiet) as tick,
        ):
            sent = send_replay(plan, producer, topic, speed=speed, stop=stop, progress=tick)
    finally:
        producer.close()
    output.say(f"replayed {sent} of {len(plan.events)} events ({plan.jobs} jobs) to {topic}", stderr=True)
    return 0


def _ahead_of_wall_s(plan: ReplayPlan, speed: float) -> float:
    """How far the replay's last event is dated ahead of the wall clock when it is sent."""
    sent_after = plan.duration_s / speed if speed > 0 else 0.0
    last_sent = datetime.now(UTC) + timedelta(seconds=sent_after)
    return (plan.epoch + timedelta(seconds=plan.duration_s) - last_sent).total_seconds()


def check_replay_options(
    *, speed: float, seed: int, job_prefix: str | None, mean_interarrival: float, load: float,
    epoch: datetime | None,
) -> None:  # fmt: skip
    """The replay's options, each named where it is wrong: the planner's own checks said `target_utilization`
    for --load, numpy's "expected non-negative integer" for --seed, and "benchmark line N" for a job id or a
    time an option had made too long or too far."""
    from finetwin.commands.twin_inputs import checked_seed
    from twin.limits import EVENT_TIME_WINDOW, within_time_window

    if not 0 <= speed < math.inf:
        raise CommandError(f"--speed must be 0 or more (0 = as fast as possible), not {speed:g}")
    checked_seed(seed)
    if job_prefix is not None and len(job_prefix) > MAX_JOB_PREFIX:
        raise CommandError(
            f"--job-prefix must be at most {MAX_JOB_PREFIX} characters (a job id, the prefix and the row's "
            f"line, is at most 200), not {len(job_prefix):,}"
        )
    if not 0 < mean_interarrival < math.inf:
        raise CommandError(
            f"--mean-interarrival must be a positive number of seconds, not {mean_interarrival:g}"
        )
    if not 0 < load <= 1:
        raise CommandError(
            f"--load must be more than 0 and at most 1 (the utilization the replayed cluster is sized for), "
            f"not {load:g}"
        )
    if epoch is not None and not within_time_window(epoch):
        years = EVENT_TIME_WINDOW.days // 365
        raise CommandError(
            f"--epoch {epoch.isoformat()} is more than {years} years from now, and telemetry must be dated "
            f"within {years} years of the clock that receives it"
        )


def _check_timeline(jobs: int, mean_interarrival: float) -> None:
    """The replay's submissions, `jobs` of them `mean_interarrival` apart on average, fit the span telemetry
    is dated in (else a row far down the file was said to be "more than 10 years from now")."""
    from twin.limits import EVENT_TIME_WINDOW

    span_s = jobs * mean_interarrival
    window_s = EVENT_TIME_WINDOW.total_seconds()
    if span_s > window_s:
        years = EVENT_TIME_WINDOW.days // 365
        raise CommandError(
            f"--mean-interarrival {mean_interarrival:g} s between {jobs:,} jobs spans "
            f"{span_s / SECONDS_PER_YEAR:,.0f} years, and telemetry is dated within {years} years of now: "
            f"at most {window_s / jobs:,.0f} s for this file"
        )


def job_prefix_of(job_prefix: str | None, seed: int) -> str:
    from ingest.replay import default_job_prefix

    return job_prefix if job_prefix is not None else default_job_prefix(seed)


def replay_plan(
    settings: Settings,
    bench: Path | None,
    *,
    speed: float,
    seed: int,
    job_prefix: str | None,
    mean_interarrival: float,
    epoch: datetime | None = None,
    load: float = REPLAY_DEFAULT_LOAD,
) -> ReplayPlan:
    """The benchmark's rows as timed telemetry events (the bundled sample when no file is given)."""
    plan_for = replay_planner(
        settings, bench, speed=speed, seed=seed, mean_interarrival=mean_interarrival, load=load
    )
    return plan_for(job_prefix_of(job_prefix, seed), epoch or datetime.now(UTC))


def rows_to_replay(path: Path) -> pd.DataFrame:
    """A benchmark file's rows to replay (`replay`, `up`, `backtest --bench`), or the CommandError that says
    why there are none: a bad cell (named by line and column), or a header without data rows (which `up`
    served as an empty cluster, and a backtest met as an IndexError from the replay's last arrival)."""
    from finetwin.wiring import load_benchmark_table

    try:
        table = load_benchmark_table(path)
    except ValueError as exc:  # BenchmarkFormatError names the file, line and column
        raise CommandError(str(exc)) from exc
    if not len(table):
        raise CommandError(f"{path}: no rows to replay (a header and no data rows)")
    return table


def replay_planner(
    settings: Settings,
    bench: Path | None,
    *,
    speed: float,
    seed: int,
    mean_interarrival: float,
    load: float = REPLAY_DEFAULT_LOAD,
) -> Callable[[str, datetime], ReplayPlan]:
    """`plan_for(job prefix, epoch)`: the benchmark's rows (read once, here: a bad file is said now) as
    timed telemetry events."""
    from finetwin.wiring import bundled_benchmark_path
    from ingest.replay import plan_replay

    table = rows_to_replay(bench or bundled_benchmark_path())
    _check_timeline(len(table), mean_interarrival)

    def plan_for(prefix: str, epoch: datetime) -> ReplayPlan:
        try:
            return plan_replay(
                table, seed=seed, job_prefix=prefix, mean_interarrival_s=mean_interarrival,
                cluster_id=settings.cluster_id, epoch=epoch, target_utilization=load,
            )  # fmt: skip
        except ValueError as exc:  # a row that cannot be telemetry, named by its line
            raise CommandError(str(exc)) from exc

    return plan_for
