"""`finetwin up`: the whole system in one process on embedded defaults — a broker (unless one is given),
the ingest worker, the API and dashboard, and a replay of the bundled benchmark as telemetry."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from finetwin import output
from finetwin.commands import add_command, up_replay
from finetwin.commands.options import BUNDLED, bench_option, refuse_options
from finetwin.commands.ports import listener_url, reserve_port
from finetwin.commands.telemetry import (
    EXIT_UNDECODABLE,
    Epoch,
    JobPrefix,
    Load,
    MeanInterarrival,
    Quiet,
    Seed,
    check_replay_options,
    job_prefix_of,
    replay_planner,
)
from finetwin.errors import CommandError
from finetwin.settings import Settings
from finetwin.signals import stop_on_signals

if TYPE_CHECKING:
    from ingest.bus import Bus
    from ingest.replay_passes import ReplayStart
    from ingest.worker import IngestWorker

log = logging.getLogger(__name__)

LOCK_FILE = "up.lock"
# The options that shape the replay: with --no-replay there is none for them to shape.
REPLAY_OPTIONS = ("bench", "speed", "seed", "job_prefix", "mean_interarrival", "epoch", "load", "passes")

UP_DEFAULT_SPEED = 600.0  # ten simulated minutes per second, so the dashboard moves
# The replayed cluster is sized for this utilization: busy enough that the default SLO on the p95 wait
# (30 min) is missed some of the time (on the bundled sample: in 44 % of the hours, 2 days of 3), so that
# steering has something to recommend; `finetwin replay` keeps the quiet default (jobs start in minutes).
UP_DEFAULT_LOAD = 0.5


def register(app: typer.Typer) -> None:
    add_command(
        app, up, "up", help="broker + ingest + API + benchmark replay in one process, on embedded defaults"
    )


def up(
    ctx: typer.Context,
    bootstrap: Annotated[
        str | None,
        typer.Option(help="use this Kafka instead of starting a broker (FINETWIN_KAFKA_BOOTSTRAP)"),
    ] = None,
    host: Annotated[
        str | None, typer.Option(help="API address (default FINETWIN_API_HOST or 127.0.0.1)")
    ] = None,
    # Bounded as `finetwin api`'s: beyond, bind() raised an OverflowError traceback.
    port: Annotated[
        int | None,
        typer.Option(min=0, max=65_535, help="API port (default FINETWIN_API_PORT or 8080; 0: any free one)"),
    ] = None,
    bench: Annotated[
        Path | None,
        typer.Option(
            "--replay",
            metavar="FILE",
            callback=bench_option,
            help=f"benchmark CSV to replay, or {BUNDLED!r} (the default)",
        ),
    ] = None,
    no_replay: Annotated[bool, typer.Option("--no-replay", help="do not replay anything")] = False,
    speed: Annotated[
        float, typer.Option(help="simulated seconds per wall-clock second, 0 = as fast as possible")
    ] = UP_DEFAULT_SPEED,
    seed: Seed = 0,
    job_prefix: JobPrefix = None,
    mean_interarrival: MeanInterarrival = 60.0,
    epoch: Epoch = None,
    load: Load = UP_DEFAULT_LOAD,
    passes: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="times to replay the file, each pass as new jobs after the last (default: until stopped; "
            "1 at --speed 0 or with --exit-when-done); 0 = until stopped",
        ),
    ] = None,
    quiet: Quiet = False,
    exit_when_done: Annotated[
        bool,
        typer.Option(
            "--exit-when-done", help="exit once the replay is sent and every event of it is in the store"
        ),
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help='with --exit-when-done: print {"jobs", "valid", "rejected", "runtime"} of the replayed jobs '
            "found in the store",
        ),
    ] = False,
) -> int:
    settings: Settings = ctx.obj
    if as_json and not exit_when_done:
        raise CommandError("--json needs --exit-when-done (the counts are printed once the replay is in)")
    if exit_when_done and no_replay:
        raise CommandError("--exit-when-done needs a replay; drop --no-replay")
    if no_replay:  # else each was taken and ignored
        refuse_options(
            ctx, REPLAY_OPTIONS, "to the replay, not with --no-replay",
            "drop --no-replay, or leave {options} out",
        )  # fmt: skip
    if exit_when_done and passes not in (None, 1):
        raise CommandError("--exit-when-done replays the file once; drop --passes")
    if not no_replay:
        check_replay_options(
            speed=speed, seed=seed, job_prefix=job_prefix, mean_interarrival=mean_interarrival, load=load,
            epoch=epoch,
        )  # fmt: skip
    # The port and the data directory first, before the heavy imports and the replay's benchmark: a taken
    # port, or another `up` on the same directory, is said within a second, before a broker and a warm-up.
    asked = port is not None or "api_port" in settings.model_fields_set
    listener = reserve_port(
        host or settings.api_host, settings.api_port if port is None else port, asked=asked
    )
    try:
        with data_dir_lock(settings.data_dir):
            return _up(
                settings, listener, bootstrap=bootstrap, bench=None if no_replay else bench,
                replay=not no_replay, speed=speed, seed=seed, job_prefix=job_prefix,
                mean_interarrival=mean_interarrival, epoch=epoch, load=load, passes=passes, quiet=quiet,
                exit_when_done=exit_when_done, as_json=as_json,
            )  # fmt: skip
    finally:
        listener.close()


def _up(
    settings: Settings,
    listener: socket.socket,
    *,
    bootstrap: str | None,
    bench: Path | None,
    replay: bool,
    speed: float,
    seed: int,
    job_prefix: str | None,
    mean_interarrival: float,
    epoch: datetime | None,
    load: float,
    passes: int | None,
    quiet: bool,
    exit_when_done: bool,
    as_json: bool,
) -> int:
    from advisor.keys import ensure_first_key
    from finetwin.commands.up_report import start_first_report
    from finetwin.wiring import (
        api_app,
        api_parts,
        bundled_benchmark_path,
        ensure_topics,
        ingest_worker,
        migrated_engine,
    )
    from ingest.replay import send_replay

    # Read before anything starts: a bad file is said before a broker and a store are set up for it.
    plan_for = (
        replay_planner(
            settings, bench, speed=speed, seed=seed, mean_interarrival=mean_interarrival, load=load
        )
        if replay
        else None
    )
    if exit_when_done:
        # A smoke run: no periodic refits or forecasts that would keep the process alive after the counts.
        settings = settings.model_copy(update={"scheduler_enabled": False})
    if passes is None:  # as fast as possible, pass after pass would fill the store as fast as it writes
        passes = 1 if speed == 0 else 0
    stop = threading.Event()
    with stop_on_signals(stop), contextlib.ExitStack() as parts:
        engine = migrated_engine(settings)
        parts.callback(engine.dispose)
        prefix = job_prefix_of(job_prefix, seed)
        start = None
        if plan_for is not None:
            start = up_replay.replay_start(plan_for, prefix, epoch, engine, settings)
            settings = up_replay.settings_for_replay(settings, start.plan)
        bus = _bus(bootstrap, settings, parts)
        first_key = ensure_first_key(engine)  # printed once, in the banner; a store with keys gets none
        topic = settings.telemetry_topic
        ensure_topics(bus, settings, topic)
        # The API's parts first: ingest's drift hook calls the API's refit scheduler (one process).
        api = api_parts(settings, engine, kafka_bootstrap=getattr(bus, "bootstrap", None))
        on_drift = api.refits.on_drift if api.refits is not None else None
        worker = ingest_worker(bus, engine, settings, topic, on_drift=on_drift)
        failed: list[BaseException] = []
        ingest_thread = threading.Thread(target=_ingest, args=(worker, stop, failed), name="ingest")
        ingest_thread.start()
        parts.callback(ingest_thread.join)
        parts.callback(stop.set)  # runs first on the way out: the worker drains, then is joined
        url = _serve_api(api_app(api), listener, parts)
        output.say(banner(url, first_key, settings), stderr=True)
        if start is not None:
            report = start_first_report(settings, bench or bundled_benchmark_path())
            if report is not None:
                parts.callback(report.join)  # at most a few seconds: a report is never left half-written
            producer = parts.enter_context(contextlib.closing(bus.producer()))

            def send(start: ReplayStart) -> None:
                plan = start.plan
                with output.progress(len(plan.events), "replay", "events", quiet=quiet or as_json) as tick:
                    sent = send_replay(plan, producer, topic, speed=speed, stop=stop, progress=tick)
                log.info("replayed %d of %d events (jobs %s*)", sent, len(plan.events), start.prefix)

            if exit_when_done:
                send(start)
                if not up_replay.wait_until_stored(start.plan, worker, engine, stop):
                    return EXIT_UNDECODABLE if failed else 130  # stopped before the store had everything
                counts = up_replay.replayed_job_counts(engine, start.job_ids)
                if as_json:
                    print(json.dumps(counts), flush=True)
                else:
                    output.say(f"replay stored: {counts}", stderr=True)
                return 0

            def next_pass(previous: ReplayStart) -> ReplayStart | None:
                following = up_replay.next_pass(plan_for, prefix, previous, engine, settings)
                # up's own worker takes each pass's timeline, further ahead of the wall clock each time.
                if following is not None:
                    worker.max_clock_skew = max(worker.max_clock_skew, up_replay.ahead_of_now(following.plan))
                return following

            up_replay.send_passes(start, send, next_pass, passes, stop)
        stop.wait()
    return EXIT_UNDECODABLE if failed else 0


def _ingest(worker: IngestWorker, stop: threading.Event, failed: list[BaseException]) -> None:
    """The ingest worker's thread: a batch it cannot decode (logged by the worker, with where) stops the whole
    of `up`, which then exits with `finetwin ingest`'s status for it, rather than serve without ingest."""
    from ingest.bus import UndecodableBatch

    try:
        worker.run(stop)
    except UndecodableBatch as exc:
        failed.append(exc)
        stop.set()


def _bus(bootstrap: str | None, settings: Settings, parts: contextlib.ExitStack) -> Bus:
    """The given Kafka, else an embedded Tansu broker, else (no Tansu for this platform) an in-process bus."""
    from ingest.broker import BrokerUnavailable, EmbeddedBroker, tansu_binary
    from ingest.bus import ConsumerTuning, InProcessBus, KafkaBus

    tuning = ConsumerTuning.from_settings(settings)
    bootstrap = bootstrap or settings.kafka_bootstrap
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


@contextlib.contextmanager
def data_dir_lock(data_dir: Path) -> Iterator[None]:
    """One `up` per data directory: a second one would replay, ingest, steer and relay approved actions
    into the same store beside the first. An advisory lock (flock) on `up.lock` there, released by the
    kernel however the process ends; it holds this process's id, for the message. Without flock (Windows):
    no lock."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        handle = (data_dir / LOCK_FILE).open("a+")  # not inherited: the broker child never holds it
    except OSError as exc:  # a directory this user cannot write: the parts that need it say so themselves
        log.warning("no lock on the data directory %s: %s", data_dir, exc.strerror or exc)
        yield
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise CommandError(
                f"another finetwin up (pid {holder}) is running with the data directory "
                f"{data_dir.resolve()}; stop it first, or give this one a directory of its own with "
                "FINETWIN_DATA_DIR"
            ) from None
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield


def banner(url: str, first_key: str | None, settings: Settings) -> str:
    """The one block an operator reads after a start: where to go, the key (first start only), where the
    data lives, how to stop."""
    lines = [
        "finetwin is up",
        f"  dashboard     {url}/",
        f"  API docs      {url}/docs (ReDoc at {url}/redoc)",
    ]
    if first_key is not None:
        lines += [
            f"  approver key  {first_key}",
            "                shown this once: keep it; the dashboard asks for it "
            "(more: `finetwin keys create`)",
        ]
    lines += [
        f"  data          {settings.data_dir.resolve()}",
        f"  store         {settings.store_description()}",
        "  stop          Ctrl-C (stops every part; the store keeps what was ingested)",
    ]
    return "\n".join(lines)


def _serve_api(app: object, listener: socket.socket, parts: contextlib.ExitStack) -> str:
    """Serve the API in a thread on the reserved socket; returns its URL once it accepts connections."""
    import uvicorn

    host, port = listener.getsockname()[:2]
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")  # type: ignore[arg-type]
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, name="api", daemon=True)
    thread.start()

    def stop_api() -> None:
        server.should_exit = True
        thread.join(timeout=10)

    parts.callback(stop_api)
    # uvicorn offers no event for "listening"; its `started` flag is set once it serves the socket.
    while not server.started:
        if not thread.is_alive():
            raise CommandError(f"cannot serve the API on {host}:{port}")
        threading.Event().wait(0.02)
    return listener_url(listener)
