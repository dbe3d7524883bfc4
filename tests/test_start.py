"""The operator's first minutes, through the installed console script: `finetwin up` checks its port
before anything else and ends its start with one banner; libraries keep quiet unless -v; the data
directory is one per user (FINETWIN_DATA_DIR moves it) and `--version`/`info` say where it is; the shell
completes commands."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ingest.broker import free_port
from tests.conftest import wait_for

FINETWIN = str(Path(sys.executable).with_name("finetwin"))


def environment(data: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "FINETWIN_DATA_DIR": str(data), **extra}
    for name in (
        "FINETWIN_DATABASE_URL",
        "FINETWIN_KAFKA_BOOTSTRAP",
        "FINETWIN_MODELS_DIR",
        "FINETWIN_API_PORT",
    ):
        env.pop(name, None)
    return env


def run(args: list[str], env: dict[str, str], **options: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FINETWIN, *args], env=env, capture_output=True, text=True, timeout=120, **options)  # type: ignore[call-overload]


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_up_on_a_taken_port_fails_before_starting_anything_and_names_a_free_one(
    tmp_path: Path, taken_port: int
) -> None:
    done = run(["up", "--no-replay", "--port", str(taken_port)], environment(tmp_path / "data"))
    assert done.returncode == 2, done.stderr
    assert f"cannot serve the API on 127.0.0.1:{taken_port}" in done.stderr
    suggested = int(done.stderr.split("--port ")[-1].split()[0])
    assert suggested != taken_port
    assert "broker" not in done.stderr.lower()  # nothing was started: no broker, no store
    assert not (tmp_path / "data").exists()


def test_api_on_a_taken_port_fails_before_the_store_is_touched_and_names_a_free_one(
    tmp_path: Path, taken_port: int
) -> None:
    """uvicorn said it as a log line, with its own exit status 3, after the store was migrated and the
    schedulers had started."""
    done = run(["api", "--port", str(taken_port)], environment(tmp_path / "data"))
    assert done.returncode == 2, done.stderr
    assert f"finetwin api: error: cannot serve the API on 127.0.0.1:{taken_port}" in done.stderr
    assert int(done.stderr.split("--port ")[-1].split()[0]) != taken_port
    assert not (tmp_path / "data").exists()  # no store was made or migrated


def test_the_port_is_checked_before_the_replay_is_read_or_the_parts_imported(
    tmp_path: Path, taken_port: int
) -> None:
    """The port comes before the benchmark replay (seconds of pandas on the bundled sample) and the
    imports of the broker, store and API: a replay file that does not exist is not even opened, and the
    interpreter's own import log shows none of them loaded."""
    env = environment(tmp_path / "data", PYTHONPROFILEIMPORTTIME="1")
    missing = tmp_path / "no-such-bench.csv"
    done = run(["up", "--port", str(taken_port), "--replay", str(missing)], env)
    assert done.returncode == 2, done.stderr
    assert f"cannot serve the API on 127.0.0.1:{taken_port}" in done.stderr
    assert str(missing) not in done.stderr  # the replay was never read
    imported = {
        line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time")
    }
    assert "typer" in imported  # the import log is there to read
    for heavy in ("pandas", "ingest.replay", "advisor.keys", "finetwin.wiring", "uvicorn", "kafka"):
        assert heavy not in imported, heavy


def test_a_second_up_on_the_same_data_directory_is_refused_before_it_starts_anything(tmp_path: Path) -> None:
    """Two `up`s on one data directory would both ingest, steer and relay approved actions into one store.
    The second is refused while the first holds the directory (here: this process, through the same lock),
    and once the first is gone the directory is free again."""
    from finetwin.commands.up import data_dir_lock

    data = tmp_path / "data"
    env = environment(data, PYTHONPROFILEIMPORTTIME="1")
    with data_dir_lock(data):
        done = run(["up", "--port", "0"], env)
    assert done.returncode == 2, done.stderr
    assert f"another finetwin up (pid {os.getpid()}) is running with the data directory {data}" in done.stderr
    imported = {
        line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time")
    }
    for heavy in ("pandas", "finetwin.wiring", "kafka"):  # refused before the broker, store and replay
        assert heavy not in imported, heavy
    with data_dir_lock(data):  # released: a later up takes it
        pass


def test_the_default_port_when_taken_is_replaced_by_a_free_one(
    taken_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    from finetwin.commands.ports import reserve_port

    listener = reserve_port("127.0.0.1", taken_port, asked=False)
    try:
        chosen = listener.getsockname()[1]
        assert chosen != taken_port
        assert (
            f"port {taken_port} on 127.0.0.1 is taken: serving on port {chosen} instead"
            in capsys.readouterr().err
        )
    finally:
        listener.close()


def start_up(tmp_path: Path, name: str) -> tuple[subprocess.Popen[bytes], Path, int]:
    port = free_port()
    log = tmp_path / f"{name}.log"
    with log.open("w") as handle:
        process = subprocess.Popen(
            [FINETWIN, "up", "--no-replay", "--port", str(port)],
            env=environment(tmp_path / "data", FINETWIN_SCHEDULER_ENABLED="false"),
            stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    return process, log, port


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def banner_of(process: subprocess.Popen[bytes], log: Path) -> str:
    def shown() -> str | None:
        if process.poll() is not None:
            pytest.fail(f"finetwin up exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        text = log.read_text()
        return text if "  stop " in text else None

    return wait_for(shown, 90, "the start-up banner")


def test_up_ends_its_start_with_one_banner_and_no_library_chatter(tmp_path: Path) -> None:
    process, log, port = start_up(tmp_path, "first")
    try:
        text = banner_of(process, log)
        url = f"http://127.0.0.1:{port}"
        assert f"dashboard     {url}/" in text and f"API docs      {url}/docs" in text
        assert f"data          {(tmp_path / 'data').resolve()}" in text
        assert str((tmp_path / "data" / "finetwin.db").resolve()) in text
        assert "Ctrl-C" in text
        key = text.split("approver key  ")[1].split()[0]
        response = httpx.get(url + "/v1/slos", headers={"X-API-Key": key}, timeout=30)
        assert response.status_code == 200, response.text  # the key in the banner works
        for chatter in ("apscheduler", "alembic", "Running upgrade", "kafka.conn", "Added job"):
            assert chatter not in text, chatter
        assert len(text.splitlines()) <= 15, text
    finally:
        stop(process)
    again, log, _ = start_up(tmp_path, "second")
    try:
        text = banner_of(again, log)
        assert "approver key" not in text  # shown on the first start only
    finally:
        stop(again)


def test_version_prints_the_version_data_directory_and_store(tmp_path: Path) -> None:
    from finetwin.info import finetwin_version

    data = tmp_path / "elsewhere"
    done = run(["--version"], environment(data), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"finetwin {finetwin_version()}" in done.stdout and finetwin_version() != "unknown"
    assert str(data.resolve()) in done.stdout
    assert f"{(data / 'finetwin.db').resolve()} (not created yet)" in done.stdout


def test_the_data_directory_is_per_user_not_per_folder(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**environment(tmp_path / "unused"), "HOME": str(home), "XDG_DATA_HOME": str(home / ".local/share")}
    env.pop("FINETWIN_DATA_DIR")
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    from_a = run(["info"], env, cwd=first)
    from_b = run(["info"], env, cwd=second)
    assert from_a.returncode == from_b.returncode == 0, from_a.stderr
    expected = str(home / ".local" / "share" / "finetwin")
    assert expected in from_a.stdout and expected in from_b.stdout
    assert "model versions  0" in from_a.stdout


def test_models_list_says_where_it_looked(tmp_path: Path) -> None:
    done = run(["models", "list"], environment(tmp_path / "data"))
    assert done.returncode == 0
    assert f"no model versions in {tmp_path / 'data' / 'models'}" in done.stdout.replace("\n", "")


def test_libraries_log_only_with_verbose() -> None:
    import logging

    from finetwin.logs import configure_logging

    try:
        configure_logging(0)
        assert not logging.getLogger("apscheduler.scheduler").isEnabledFor(logging.INFO)
        assert not logging.getLogger("alembic.runtime.migration").isEnabledFor(logging.INFO)
        assert logging.getLogger("ingest.worker").isEnabledFor(logging.INFO)
        configure_logging(1)
        assert logging.getLogger("apscheduler.scheduler").isEnabledFor(logging.INFO)
    finally:
        configure_logging(0)


def test_an_expected_broker_warning_is_explained_once(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from finetwin.logs import ExplainExpected

    explain = ExplainExpected()
    records = [
        logging.LogRecord(
            "kafka.producer",
            logging.WARNING,
            __file__,
            1,
            "Task ran for 0.6s. It is blocking the event loop",
            (),
            None,
        )
        for _ in range(3)
    ]
    passed = [r for r in records if explain.filter(r)]
    assert len(passed) == 1 and "expected:" in passed[0].getMessage()
    skipped = 'Execution of job "standing_tick" skipped: maximum number of running instances reached (1)'
    scheduler = [
        logging.LogRecord("apscheduler.scheduler", logging.WARNING, __file__, 1, skipped, (), None)
        for _ in range(4)
    ]
    assert sum(explain.filter(r) for r in scheduler) == 1
    other = logging.LogRecord("kafka.conn", logging.WARNING, __file__, 1, "connection refused", (), None)
    assert explain.filter(other) and explain.filter(other)  # anything else passes, every time


def test_bash_completes_commands(tmp_path: Path) -> None:
    env = environment(
        tmp_path / "data", _FINETWIN_COMPLETE="complete_bash", COMP_WORDS="finetwin mod", COMP_CWORD="1"
    )
    done = run([], env)
    assert "models" in done.stdout.split(), done.stdout + done.stderr
    # As a user runs it, from bash: typer finds the shell among the command's parents (shellingham), and
    # under pytest alone there may be none to find. `; exit` keeps bash from exec'ing the command in its
    # place, so bash is its parent whatever started pytest (from a plain `sh`, the test failed).
    script = subprocess.run(
        ["bash", "-c", f"{FINETWIN} --show-completion; exit $?"],
        env=environment(tmp_path / "data"), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert script.returncode == 0 and "_FINETWIN_COMPLETE" in script.stdout, script.stderr


@pytest.mark.parametrize("command", [["api"], ["up", "--no-replay"]])
def test_a_bad_slo_file_is_said_before_the_api_serves(tmp_path: Path, command: list[str]) -> None:
    """The app found it as it started: uvicorn said "Application startup failed" with a traceback, and
    `finetwin up` then blamed its port ("cannot serve the API on ...")."""
    slo_file = tmp_path / "slo.yaml"
    slo_file.write_text("slos: [unclosed\n")
    env = environment(tmp_path / "data", FINETWIN_SLO_FILE=str(slo_file))
    done = run([*command, "--port", str(free_port())], env)
    assert done.returncode == 2, done.stderr
    said = (
        f"finetwin {command[0]}: error: the SLO file (FINETWIN_SLO_FILE): {slo_file}: not valid YAML: line 2"
    )
    assert said in done.stderr
    assert "Traceback" not in done.stderr and "cannot serve" not in done.stderr
