"""`finetwin ingest`, `finetwin replay` and `finetwin up` (the whole thing on embedded defaults).

Registration is argparse only; Kafka, SQLAlchemy, pandas and uvicorn are imported inside the handlers.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twin.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from ingest.bus import Bus
    from ingest.replay import ReplayPlan
    from ingest.worker import IngestWorker, WorkerStats

log = logging.getLogger(__name__)

UP_DEFAULT_SPEED = 600.0  # `finetwin up`: ten simulated minutes per second, so the dashboard moves
# `finetwin up`'s replayed cluster is sized for this utilization: busy enough that the default SLO on the p95
# wait (30 min) is missed some of the time (on the bundled sample: in 44 % of the hours, 2 days of 3) and
# steering has something to recommend; `finetwin replay` keeps the quiet default (jobs start within minutes).
UP_DEFAULT_LOAD = 0.5
TARGET_LOAD = 0.35  # ingest.replay.TARGET_UTILIZATION (not imported here: registration stays light)
EXIT_UNDECODABLE = 3  # `finetwin ingest` stopped at a record batch it cannot decode
# After SIGTERM / Ctrl-C, `finetwin ingest` finishes its batch and exits; if a broker or database that is gone
# holds it up longer than this, it exits anyway (status 1): what it had not committed is redelivered.
STOP_DEADLINE_S = 15.0


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    ingest = subparsers.add_parser(
        "ingest", help="consume job telemetry from Kafka into the store (until SIGTERM / Ctrl-C)"
    )
    _kafka_options(ingest)
    ingest.add_argument("--group", help="consumer group (default FINETWIN_CONSUMER_GROUP or finetwin-ingest)")
    ingest.add_argument(
        "--batch-size", type=int, help="messages per transaction (default FINETWIN_INGEST_BATCH_SIZE)"
    )
    ingest.add_argument(
        "--metrics-port", type=int,
        help="serve Prometheus metrics on this port (with --processes N: process i on this port + i)",
    )  # fmt: skip
    ingest.add_argument(
        "--processes", type=int, default=1,
        help="consumers to run in the group, each a child process (default 1): more use more cores",
    )  # fmt: skip
    ingest.set_defaults(handler=run_ingest)

    replay = subparsers.add_parser("replay", help="replay a benchmark CSV as job telemetry on Kafka")
    _kafka_options(replay)
    _replay_options(replay, default_speed=0.0, default_load=TARGET_LOAD)
    replay.set_defaults(handler=run_replay)

    up = subparsers.add_parser(
        "up", help="broker + ingest + API + benchmark replay in one process, on embedded defaults"
    )
    up.add_argument(
        "--bootstrap", help="use this Kafka instead of starting a broker (FINETWIN_KAFKA_BOOTSTRAP)"
    )
    up.add_argument("--host", help="API address (default FINETWIN_API_HOST or 127.0.0.1)")
    up.add_argument("--port", type=int, help="API port (default FINETWIN_API_PORT or 8080)")
    up.add_argument(
        "--replay",
        dest="bench",
        type=Path,
        metavar="FILE",
        help="benchmark CSV to replay (default: the bundled sample)",
    )
    up.add_argument("--no-replay", action="store_true", help="do not replay anything")
    _replay_options(up, default_speed=UP_DEFAULT_SPEED, bench_option=False, default_load=UP_DEFAULT_LOAD)
    up.add_argument(
        "--exit-when-done", action="store_true",
        help="exit once the replay is sent and every event of it is in the store",
    )  # fmt: skip
    up.add_argument(
        "--json", action="store_true",
        help='with --exit-when-done: print {"jobs", "valid", "rejected", "runtime"} of the replayed jobs '
        "found in the store",
    )  # fmt: skip
    up.set_defaults(handler=run_up)


def _kafka_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (default FINETWIN_KAFKA_BOOTSTRAP)")
    parser.add_argument(
        "--topic", help="telemetry topic (default FINETWIN_TELEMETRY_TOPIC or finetwin.telemetry)"
    )


def _replay_options(
    parser: argparse.ArgumentParser,
    *,
    default_speed: float,
    bench_option: bool = True,
    default_load: float = TARGET_LOAD,
) -> None:
    if bench_option:
        parser.add_argument(
            "--bench", type=Path, metavar="FILE", help="benchmark CSV (default: the bundled real sample)"
        )
    parser.add_argument(
        "--speed", type=float, default=default_speed,
        help=f"simulated seconds per wall-clock second, 0 = as fast as possible (default {default_speed:g})",
    )  # fmt: skip
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the arrival process and event ids (default 0)"
    )
    parser.add_argument("--job-prefix", help="job id prefix (default replay-<seed>-)")
    parser.add_argument(
        "--mean-interarrival", type=float, default=60.0, help="mean seconds between submissions (default 60)"
    )
    parser.add_argument(
        "--load", type=float, default=default_load,
        help=f"utilization the replayed cluster is sized for, in (0, 1] (default {default_load:g})",
    )  # fmt: skip
    parser.add_argument(
        "--epoch", type=_epoch, metavar="TIME",
        help="RFC 3339 time the replay's timeline starts at (default: now; pin it for reproducible runs)",
    )  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _epoch(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an RFC 3339 time: {text!r}") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


# --- finetwin ingest --------------------------------------------------------------------------------------


def run_ingest(args: argparse.Namespace, settings: Settings) -> int:
    from ingest.bus import KafkaBus
    from twin.cli import CommandError

    if args.processes < 1:
        raise CommandError(f"--processes must be 1 or more, not {args.processes}")
    bootstrap = _bootstrap(args, settings)
    topic = args.topic or settings.telemetry_topic
    engine = _store(settings)  # migrated here, once, before any consumer starts
    _ensure_topics(KafkaBus(bootstrap), settings, topic)
    if args.processes == 1:
        return _consume(args, settings, engine, args.metrics_port)
    engine.dispose()  # each child opens connections of its own
    from ingest.processes import run_children

    child = functools.partial(_consume_in_child, args, settings, logging.getLogger().level)
    return run_children(args.processes, child, "ingest")


def _consume_in_child(args: argparse.Namespace, settings: Settings, log_level: int, index: int) -> None:
    """One of `finetwin ingest --processes N`'s consumers (runs in a spawned child process)."""
    from twin.db import engine_from_settings

    logging.basicConfig(
        level=log_level, format="%(asctime)s %(levelname)s %(processName)s %(name)s: %(message)s"
    )
    logging.getLogger("kafka").setLevel(max(log_level, logging.WARNING))
    metrics_port = args.metrics_port + index if args.metrics_port else None
    try:
        status = _consume(args, settings, engine_from_settings(settings), metrics_port)
    except KeyboardInterrupt:  # a second Ctrl-C
        status = 130
    sys.exit(status)


def _consume(args: argparse.Namespace, settings: Settings, engine: Engine, metrics_port: int | None) -> int:
    """Run one ingest worker in this process until SIGTERM / Ctrl-C."""
    from ingest.bus import ConsumerTuning, KafkaBus

    bootstrap = _bootstrap(args, settings)
    topic = args.topic or settings.telemetry_topic
    from ingest.bus import UndecodableBatch
    from ingest.worker import settle_garbage_collector

    bus = KafkaBus(bootstrap, ConsumerTuning.from_settings(settings))
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr=settings.api_host)
    stop = threading.Event()
    worker = _worker(bus, engine, settings, topic, args.group, args.batch_size)
    log.info(
        "ingesting %s on %s into %s (group %s)",
        topic,
        bootstrap,
        engine.url.render_as_string(),
        args.group or settings.consumer_group,
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


# --- finetwin replay --------------------------------------------------------------------------------------


def run_replay(args: argparse.Namespace, settings: Settings) -> int:
    from ingest.bus import KafkaBus
    from ingest.replay import send_replay

    bootstrap = _bootstrap(args, settings)
    topic = args.topic or settings.telemetry_topic
    plan = _plan(args, settings, args.bench)
    ahead = _ahead_of_wall_s(plan, args.speed)
    if ahead > settings.max_clock_skew.total_seconds():
        log.warning(
            "the replay's timeline starts at %s and runs up to %.0f s ahead of the wall clock: an ingest "
            "bounded by FINETWIN_MAX_CLOCK_SKEW (%s) dead-letters what runs further ahead; raise it there, "
            "or pin --epoch in the past",
            plan.epoch.isoformat(), ahead, settings.max_clock_skew,
        )  # fmt: skip
    bus = KafkaBus(bootstrap)
    _ensure_topics(bus, settings, topic)
    producer = bus.producer()
    stop = threading.Event()
    try:
        with stop_on_signals(stop):
            sent = send_replay(plan, producer, topic, speed=args.speed, stop=stop, progress=_progress(args))
    finally:
        producer.close()
    print(f"replayed {sent} of {len(plan.events)} events ({plan.jobs} jobs) to {topic}", file=sys.stderr)
    return 0


def _ahead_of_wall_s(plan: ReplayPlan, speed: float) -> float:
    """How far the replay's last event is dated ahead of the wall clock when it is sent."""
    sent_after = plan.duration_s / speed if speed > 0 else 0.0
    last_sent = datetime.now(UTC) + timedelta(seconds=sent_after)
    return (plan.epoch + timedelta(seconds=plan.duration_s) - last_sent).total_seconds()


# --- finetwin up ------------------------------------------------------------------------------------------


def run_up(args: argparse.Namespace, settings: Settings) -> int:
    from ingest.replay import send_replay
    from twin.cli import CommandError

    if args.json and not args.exit_when_done:
        raise CommandError("--json needs --exit-when-done (the counts are printed once the replay is in)")
    if args.exit_when_done and args.no_replay:
        raise CommandError("--exit-when-done needs a replay; drop --no-replay")
    plan = None if args.no_replay else _plan(args, settings, args.bench)
    if plan is not None:
        # The replay's timeline starts now and runs ahead of the wall clock (by up to its whole span at
        # --speed 0): up's own worker takes the replay's clock as the cluster's. A separate `finetwin
        # ingest` keeps FINETWIN_MAX_CLOCK_SKEW for replays it did not start.
        ahead = timedelta(seconds=plan.duration_s) + timedelta(minutes=10)
        settings = settings.model_copy(update={"max_clock_skew": max(settings.max_clock_skew, ahead)})
    if args.exit_when_done:
        # A smoke run: no periodic refits or forecasts that would keep the process alive after the counts.
        settings = settings.model_copy(update={"scheduler_enabled": False})
    stop = threading.Event()
    with stop_on_signals(stop), contextlib.ExitStack() as parts:
        bus = _up_bus(args, settings, parts)
        engine = _store(settings)
        parts.callback(engine.dispose)
        topic = settings.telemetry_topic
        _ensure_topics(bus, settings, topic)
        worker = _worker(bus, engine, settings, topic, None, None)
        ingest_thread = threading.Thread(target=worker.run, args=(stop,), name="ingest")
        ingest_thread.start()
        parts.callback(ingest_thread.join)
        parts.callback(stop.set)  # runs first on the way out: the worker drains, then is joined
        url = _serve_api(args, settings, engine, parts, getattr(bus, "bootstrap", None))
        print(f"finetwin is up: API on {url} (docs at {url}/docs); Ctrl-C stops", file=sys.stderr)
        if plan is not None:
            producer = bus.producer()
            parts.callback(producer.close)
            sent = send_replay(plan, producer, topic, speed=args.speed, stop=stop, progress=_progress(args))
            log.info("replayed %d of %d events (%d jobs)", sent, len(plan.events), plan.jobs)
            if args.exit_when_done:
                if not _wait_until_stored(plan, worker, engine, stop):
                    return 130  # interrupted before the store had everything
                counts = replayed_job_counts(engine, _job_prefix(args))
                if args.json:
                    print(json.dumps(counts), flush=True)
                else:
                    print(f"replay stored: {counts}", file=sys.stderr)
                return 0
        stop.wait()
    return 0


def _up_bus(args: argparse.Namespace, settings: Settings, parts: contextlib.ExitStack) -> Bus:
    """The given Kafka, else an embedded Tansu broker, else (no Tansu for this platform) an in-process bus."""
    from ingest.broker import BrokerUnavailable, EmbeddedBroker, tansu_binary
    from ingest.bus import ConsumerTuning, InProcessBus, KafkaBus
    from twin.cli import CommandError

    tuning = ConsumerTuning.from_settings(settings)
    bootstrap = args.bootstrap or settings.kafka_bootstrap
    if bootstrap:
        return KafkaBus(bootstrap, tuning)
    if tansu_binary() is None:
        log.warning(
            "no Tansu broker binary for this platform: using an in-process bus, so only this process can "
            "publish telemetry (set FINETWIN_KAFKA_BOOTSTRAP to use a real Kafka)"
        )
        return InProcessBus(settings.telemetry_partitions)
    try:
        broker = EmbeddedBroker().start()
    except BrokerUnavailable as exc:
        raise CommandError(f"cannot start the embedded broker: {exc}") from exc
    parts.callback(broker.stop)
    log.info("embedded Kafka-protocol broker (Tansu, in memory) on %s", broker.bootstrap)
    return KafkaBus(broker.bootstrap, tuning)


def _serve_api(
    args: argparse.Namespace,
    settings: Settings,
    engine: Engine,
    parts: contextlib.ExitStack,
    bootstrap: str | None,
) -> str:
    """Serve the API in a thread; returns its URL once it accepts connections. `bootstrap` is the broker the
    API's outbox relay publishes approved actions to (None with the in-process bus: actions wait)."""
    import uvicorn

    from twin.cli import CommandError, build_api_app

    host = args.host or settings.api_host
    port = settings.api_port if args.port is None else args.port
    app = build_api_app(settings, engine, run_migrations=False, kafka_bootstrap=bootstrap)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="api", daemon=True)
    thread.start()

    def stop_api() -> None:
        server.should_exit = True
        thread.join(timeout=10)

    parts.callback(stop_api)
    # uvicorn offers no event for "listening"; its `started` flag is set once the socket is bound.
    while not server.started:
        if not thread.is_alive():
            raise CommandError(f"cannot serve the API on {host}:{port} (is the port taken?)")
        threading.Event().wait(0.02)
    bound = port or server.servers[0].sockets[0].getsockname()[1]
    return f"http://{host}:{bound}"


def _wait_until_stored(plan: ReplayPlan, worker: IngestWorker, engine: Engine, stop: threading.Event) -> bool:
    """Block until every event of the replay is in the store (False if `stop` came first). Woken by the
    worker after each batch; the store has the last word, as the worker may also count other messages."""
    ids = [str(event.event_id) for _, event in plan.events]

    def handled(stats: WorkerStats) -> int:
        return stats.applied + stats.duplicates + stats.dead_letters

    worker.wait_until(lambda s: handled(s) >= len(ids) or stop.is_set())
    while not stop.is_set():
        seen = handled(worker.stats)
        if stored_event_count(engine, ids) == len(ids):
            return True
        worker.wait_until(lambda s, seen=seen: handled(s) > seen or stop.is_set(), timeout_s=5)
    return False


def stored_event_count(engine: Engine, event_ids: list[str]) -> int:
    from sqlalchemy import func, select

    from twin.store import TelemetryEvent

    found = 0
    with engine.connect() as connection:
        for start in range(0, len(event_ids), 900):
            chunk = event_ids[start : start + 900]
            query = select(func.count()).select_from(TelemetryEvent).where(TelemetryEvent.event_id.in_(chunk))  # type: ignore[attr-defined]
            found += connection.execute(query).scalar_one()
    return found


def replayed_job_counts(engine: Engine, job_prefix: str) -> dict[str, int]:
    """Jobs in the store whose id starts with `job_prefix`, in all and by outcome."""
    from sqlalchemy import func, select

    from twin.store import Job

    counts = {"jobs": 0, "valid": 0, "rejected": 0, "runtime": 0}
    mine = func.substr(Job.job_id, 1, len(job_prefix)) == job_prefix
    with engine.connect() as connection:
        for outcome, count in connection.execute(
            select(Job.outcome, func.count()).where(mine).group_by(Job.outcome)
        ):
            counts["jobs"] += count
            if outcome in counts:
                counts[outcome] = count
    return counts


# --- shared parts -----------------------------------------------------------------------------------------


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event, deadline_s: float | None = None) -> Iterator[None]:
    """SIGTERM and the first Ctrl-C set `stop` (the loops drain and return); a second Ctrl-C interrupts.
    With `deadline_s`, the process exits (status 1) if it is still running that long after the signal."""

    def request_stop(signum: int, _frame: Any) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        log.info("%s: stopping", signal.Signals(signum).name)
        if deadline_s is not None and not stop.is_set():
            watchdog = threading.Timer(deadline_s, _exit_now, args=(deadline_s,))
            watchdog.daemon = True
            watchdog.start()
        stop.set()

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _exit_now(deadline_s: float) -> None:
    log.error("not stopped %.0f s after the signal (a broker or database gone?): exiting now", deadline_s)
    logging.shutdown()
    os._exit(1)


def _bootstrap(args: argparse.Namespace, settings: Settings) -> str:
    from twin.cli import CommandError

    bootstrap = args.bootstrap or settings.kafka_bootstrap
    if not bootstrap:
        raise CommandError(
            "no Kafka to talk to: pass --bootstrap HOST:PORT or set FINETWIN_KAFKA_BOOTSTRAP "
            "(`finetwin up` starts a broker of its own)"
        )
    return bootstrap


def _store(settings: Settings) -> Engine:
    from sqlalchemy.exc import OperationalError

    from twin.cli import CommandError
    from twin.db import engine_from_settings, migrate

    engine = engine_from_settings(settings)
    try:
        migrate(engine)
    except OperationalError as exc:
        url = engine.url.render_as_string()
        raise CommandError(f"cannot open the store at {url}: {exc.orig}") from exc
    return engine


def _ensure_topics(bus: Bus, settings: Settings, topic: str) -> None:
    from kafka.errors import KafkaError

    from twin.cli import CommandError

    try:
        bus.ensure_topic(topic, settings.telemetry_partitions)
        bus.ensure_topic(settings.dlq_topic, 1)
    except KafkaError as exc:
        raise CommandError(f"cannot reach Kafka to create topic {topic}: {exc}") from exc


def _worker(
    bus: Bus, engine: Engine, settings: Settings, topic: str, group: str | None, batch_size: int | None
) -> IngestWorker:
    from ingest.worker import IngestWorker
    from twin.cli import ingest_batch_hooks

    return IngestWorker(
        engine, bus.consumer(topic, group or settings.consumer_group), bus.producer(),
        dlq_topic=settings.dlq_topic, hooks=ingest_batch_hooks(settings),
        batch_size=batch_size or settings.ingest_batch_size, poll_timeout_ms=settings.ingest_poll_timeout_ms,
        max_clock_skew=settings.max_clock_skew,
    )  # fmt: skip


def _job_prefix(args: argparse.Namespace) -> str:
    from ingest.replay import default_job_prefix

    return args.job_prefix if args.job_prefix is not None else default_job_prefix(args.seed)


def _plan(args: argparse.Namespace, settings: Settings, bench: Path | None) -> ReplayPlan:
    from ingest.replay import plan_replay
    from twin.cli import CommandError, bundled_benchmark_path, load_benchmark_table

    path = bench or bundled_benchmark_path()
    if args.speed < 0:
        raise CommandError(f"--speed must be 0 or more, not {args.speed:g}")
    if args.mean_interarrival <= 0:
        raise CommandError(f"--mean-interarrival must be positive, not {args.mean_interarrival:g}")
    try:
        table = load_benchmark_table(path)
        return plan_replay(
            table, seed=args.seed, job_prefix=_job_prefix(args), mean_interarrival_s=args.mean_interarrival,
            cluster_id=settings.cluster_id, epoch=args.epoch or datetime.now(UTC),
            target_utilization=args.load,
        )  # fmt: skip
    except ValueError as exc:  # BenchmarkFormatError names the file, line and column
        raise CommandError(str(exc)) from exc


def _progress(args: argparse.Namespace) -> bool:
    return not args.quiet and not getattr(args, "json", False) and sys.stderr.isatty()
