"""`finetwin up`: the whole system in one process on embedded defaults — a broker (unless one is given),
the ingest worker, the API and dashboard, and a replay of the bundled benchmark as telemetry."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from finetwin import output
from finetwin.commands import add_command
from finetwin.commands.telemetry import (
    EXIT_UNDECODABLE,
    Epoch,
    JobPrefix,
    Load,
    MeanInterarrival,
    Quiet,
    Seed,
    job_prefix_of,
    replay_planner,
)
from finetwin.errors import CommandError
from finetwin.settings import Settings
from finetwin.signals import stop_on_signals

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from ingest.bus import Bus
    from ingest.replay import ReplayPlan
    from ingest.replay_passes import ReplayStart
    from ingest.worker import IngestWorker, WorkerStats

log = logging.getLogger(__name__)

LOCK_FILE = "up.lock"
# The shortest wall time a replay pass takes before the next one starts.
MIN_PASS_WALL_S = 5.0

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
    port: Annotated[int | None, typer.Option(help="API port (default FINETWIN_API_PORT or 8080)")] = None,
    bench: Annotated[
        Path | None,
        typer.Option(
            "--replay", metavar="FILE", help="benchmark CSV to replay (default: the bundled sample)"
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
    if exit_when_done and passes not in (None, 1):
        raise CommandError("--exit-when-done replays the file once; drop --passes")
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
    from finetwin.wiring import api_app, api_parts, ensure_topics, ingest_worker, migrated_engine
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
        start = None
        if plan_for is not None:
            start = _replay_start(plan_for, job_prefix_of(job_prefix, seed), epoch, engine, settings)
            settings = _settings_for_replay(settings, start.plan)
        bus = _bus(bootstrap, settings, parts)
        first_key = ensure_first_key(engine)  # for the banner (the API then finds a key and prints none)
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
            producer = parts.enter_context(contextlib.closing(bus.producer()))

            def send(start: ReplayStart) -> None:
                plan = start.plan
                with output.progress(len(plan.events), "replay", "events", quiet=quiet or as_json) as tick:
                    sent = send_replay(plan, producer, topic, speed=speed, stop=stop, progress=tick)
                log.info("replayed %d of %d events (jobs %s*)", sent, len(plan.events), start.prefix)

            if exit_when_done:
                send(start)
                if not _wait_until_stored(start.plan, worker, engine, stop):
                    return EXIT_UNDECODABLE if failed else 130  # stopped before the store had everything
                counts = replayed_job_counts(engine, start.job_ids)
                if as_json:
                    print(json.dumps(counts), flush=True)
                else:
                    output.say(f"replay stored: {counts}", stderr=True)
                return 0
            prefix = job_prefix_of(job_prefix, seed)

            def next_pass(previous: ReplayStart) -> ReplayStart | None:
                following = _next_pass(plan_for, prefix, previous, engine, settings)
                # up's own worker takes each pass's timeline, further ahead of the wall clock each time.
                if following is not None:
                    worker.max_clock_skew = max(worker.max_clock_skew, _ahead_of_now(following.plan))
                return following

            send_passes(start, send, next_pass, passes, stop)
        stop.wait()
    return EXIT_UNDECODABLE if failed else 0


def _replay_start(
    plan_for: Callable[[str, datetime], ReplayPlan], prefix: str, epoch: datetime | None, engine: Engine,
    settings: Settings,
) -> ReplayStart:  # fmt: skip
    """The replay to send: the pinned --epoch's as asked, else where the store's record of it leaves off
    (`ingest.replay_passes`), said in the log when that is not a fresh start."""
    from ingest.replay_passes import NoPassLeft, ReplayStart, choose_start, job_ids_of

    if epoch is not None:
        plan = plan_for(prefix, epoch)
        return ReplayStart(plan, prefix, job_ids_of(plan), 0, 0)
    try:
        start = choose_start(plan_for, prefix, engine, settings.cluster_id, datetime.now(UTC))
    except NoPassLeft as exc:
        raise CommandError(str(exc)) from None
    if start.resumed:
        log.info(
            "resuming the replay where it stopped: %d of its events are in the store, %d to send (jobs %s*)",
            start.stored_before, len(start.plan.events), start.prefix,
        )  # fmt: skip
    elif start.pass_number > 0:
        log.info(
            "the store holds this replay already: replaying the file again as new jobs %s*, from %s",
            start.prefix, start.plan.epoch.isoformat(timespec="seconds"),
        )  # fmt: skip
    return start


def send_passes(
    start: ReplayStart,
    send: Callable[[ReplayStart], None],
    next_pass: Callable[[ReplayStart], ReplayStart | None],
    passes: int,
    stop: threading.Event,
) -> int:
    """Send `start`, then pass after pass (`passes` in all; 0: until stopped or `next_pass` has none), each
    taking at least MIN_PASS_WALL_S of wall time. Returns how many passes were sent."""
    sent = 0
    while True:
        began = time.monotonic()
        send(start)
        sent += 1
        if sent == passes or not start.job_ids:  # a file without rows: nothing to go on with
            return sent
        # A file of a few short jobs would otherwise start pass after pass as fast as it can plan them.
        if stop.wait(max(0.0, MIN_PASS_WALL_S - (time.monotonic() - began))):
            return sent
        following = next_pass(start)
        if following is None:
            return sent
        start = following


def _next_pass(
    plan_for: Callable[[str, datetime], ReplayPlan], prefix: str, previous: ReplayStart, engine: Engine,
    settings: Settings,
) -> ReplayStart | None:  # fmt: skip
    """The pass after `previous`, from its end on (the store may not hold all of it yet); None where the
    timeline would run past the telemetry contract's bound, or no pass is left."""
    from ingest.replay_passes import NoPassLeft, choose_start
    from twin.limits import within_time_window

    end = previous.plan.epoch + timedelta(seconds=previous.plan.duration_s)
    try:
        start = choose_start(
            plan_for, prefix, engine, settings.cluster_id, datetime.now(UTC),
            first_pass=previous.pass_number + 1, not_before=end,
        )  # fmt: skip
    except NoPassLeft as exc:
        log.warning("the replay stops: %s", exc)
        return None
    last = start.plan.epoch + timedelta(seconds=start.plan.duration_s)
    if not within_time_window(last):
        log.warning(
            "the replay stops: a next pass would run to %s, beyond the telemetry contract's bound on event "
            "times; the API and the twin go on serving", last.isoformat(timespec="seconds"),
        )  # fmt: skip
        return None
    log.info(
        "replay pass %d: the file again as new jobs %s*, from %s",
        start.pass_number, start.prefix, start.plan.epoch.isoformat(timespec="seconds"),
    )  # fmt: skip
    return start


def _ahead_of_now(plan: ReplayPlan) -> timedelta:
    """How far ahead of the wall clock the plan's last event is dated, and ten minutes' room."""
    end = plan.epoch + timedelta(seconds=plan.duration_s)
    return max(end - datetime.now(UTC), timedelta(0)) + timedelta(minutes=10)


def _settings_for_replay(settings: Settings, plan: ReplayPlan) -> Settings:
    # The replay's timeline runs ahead of the wall clock (by up to its whole span at --speed 0, and more when
    # it starts after an earlier replay's end): up's own worker takes the replay's clock as the cluster's. A
    # separate `finetwin ingest` keeps FINETWIN_MAX_CLOCK_SKEW for replays it did not start.
    ahead = _ahead_of_now(plan)
    settings = settings.model_copy(update={"max_clock_skew": max(settings.max_clock_skew, ahead)})
    if "forecast_policy" not in settings.model_fields_set:
        # The replayed cluster schedules greedily (a job starts wherever its GPUs free up first, small ones
        # passing big ones): the twin's closest policy is backfill. Measured by bench/fidelity.py's live
        # scoring: queue-length bias +0.33 under fifo, +0.03 under backfill.
        settings = settings.model_copy(update={"forecast_policy": "backfill"})
    return settings


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


def reserve_port(host: str, port: int, *, asked: bool) -> socket.socket:
    """A listening socket on host:port, handed to uvicorn later. A port that was asked for (--port or
    FINETWIN_API_PORT) and is taken is an error naming a free one; the default port, when taken, is
    replaced by a free one (the banner says which)."""
    try:
        return _listen(host, port)
    except OSError as exc:
        taken = exc
    spare = _listen(host, 0)
    free = spare.getsockname()[1]
    if asked:
        spare.close()
        raise CommandError(
            f"cannot serve the API on {host}:{port}: {taken.strerror or taken} (another finetwin up, or "
            f"another program, has it); choose another port with --port, e.g. --port {free}"
        )
    output.say(
        f"port {port} on {host} is taken: serving on port {free} instead (--port chooses)", stderr=True
    )
    return spare


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is no conflict
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


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
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def _wait_until_stored(plan: ReplayPlan, worker: IngestWorker, engine: Engine, stop: threading.Event) -> bool:
    """Block until every event of the replay is in the store (False if `stop` came first). Woken by the
    worker after each batch; the store has the last word, as the worker may also count other messages."""
    from ingest.replay_passes import stored_event_times

    ids = [str(event.event_id) for _, event in plan.events]

    def handled(stats: WorkerStats) -> int:
        return stats.applied + stats.duplicates + stats.dead_letters

    worker.wait_until(lambda s: handled(s) >= len(ids) or stop.is_set())
    while not stop.is_set():
        seen = handled(worker.stats)
        if len(stored_event_times(engine, ids)) == len(ids):
            return True
        worker.wait_until(lambda s, seen=seen: handled(s) > seen or stop.is_set(), timeout_s=5)
    return False


def replayed_job_counts(engine: Engine, job_ids: list[str]) -> dict[str, int]:
    """These jobs as the store holds them, in all and by outcome."""
    from sqlalchemy import func, select

    from twin.store import Job

    counts = {"jobs": 0, "valid": 0, "rejected": 0, "runtime": 0}
    with engine.connect() as connection:
        for first in range(0, len(job_ids), 900):  # under SQLite's old limit of 999 variables
            chunk = job_ids[first : first + 900]
            query = select(Job.outcome, func.count()).where(Job.job_id.in_(chunk)).group_by(Job.outcome)  # type: ignore[attr-defined]
            for outcome, count in connection.execute(query):
                counts["jobs"] += count
                if outcome in counts:
                    counts[outcome] += count
    return counts
