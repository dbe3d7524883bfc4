"""The store's schema comes from the migrations, on both backends, concurrent start-ups don't race, and a
store that cannot be used is said as such."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import inspect, text

from finetwin.schema import migrate
from twin.db import make_engine


def test_migrations_create_every_table_and_are_idempotent(database_url: str) -> None:
    engine = make_engine(database_url)
    migrate(engine)
    migrate(engine)  # a second start-up finds the schema current
    tables = set(inspect(engine).get_table_names())
    assert {"telemetry_events", "jobs", "observed_runs", "nodes", "alembic_version"} <= tables
    with engine.connect() as connection:
        heads = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    assert len(heads) == 1
    engine.dispose()


def test_concurrent_migrations_do_not_race(database_url: str) -> None:
    """Without PostgreSQL's advisory lock, DuplicateTable; without SQLite's lock file, "table jobs already
    exists" for all but one of the processes starting together on a new store (and, in threads, Alembic's
    module-level context mixed up between them)."""
    engines = [make_engine(database_url) for _ in range(4)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(migrate, engines))
    assert "jobs" in inspect(engines[0]).get_table_names()
    for engine in engines:
        engine.dispose()


def test_the_migrations_build_the_tables_the_code_declares(database_url: str) -> None:
    """Every table, column, index and constraint of the SQLModel classes, as the migrations left them: a
    change to one without the other is found here, not in a deployment."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from finetwin.schema import finetwin_metadata

    engine = make_engine(database_url)
    migrate(engine)
    with engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), finetwin_metadata())
    assert differences == []
    engine.dispose()


# A store finetwin cannot use: every command that opens it says why, names the store and says what to do,
# with status 2 and no traceback (each was a traceback but a refused connection).
STORE_COMMANDS = (["migrate"], ["keys", "list"], ["forecast"])


def _said_by_each_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], url: str
) -> list[str]:
    from finetwin.cli import main

    monkeypatch.setenv("FINETWIN_DATABASE_URL", url)
    said = []
    for command in STORE_COMMANDS:
        assert main(command) == 2, command
        error = capsys.readouterr().err
        assert "Traceback" not in error and "sqlalche.me" not in error, error
        said.append(" ".join(error.split()))
    return said


def test_a_store_file_that_is_not_a_database_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "finetwin.db"
    store.write_text("not a database\n" * 100)
    for error in _said_by_each_command(monkeypatch, capsys, f"sqlite:///{store}"):
        assert f"{store}: file is not a database: point FINETWIN_DATABASE_URL or FINETWIN_DATA_DIR" in error
    assert store.read_text() == "not a database\n" * 100  # nothing written over it


def test_a_store_migrated_by_a_newer_finetwin_is_said(
    database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = make_engine(database_url)
    migrate(engine)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = 'f00d0001'"))
    engine.dispose()
    for error in _said_by_each_command(monkeypatch, capsys, database_url):
        assert (
            "its schema is at revision f00d0001, which this finetwin does not know (it knows up to " in error
        )
        assert "a newer finetwin migrated it" in error


def test_a_store_of_another_application_is_said(
    database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = make_engine(database_url)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE jobs (ticket INTEGER)"))
        connection.execute(text("CREATE TABLE invoices (id INTEGER)"))
    for error in _said_by_each_command(monkeypatch, capsys, database_url):
        assert "it holds tables finetwin did not make (jobs) and no record of finetwin's migrations" in error
    assert sorted(inspect(engine).get_table_names()) == ["invoices", "jobs"]  # nothing written
    engine.dispose()


def test_a_store_shared_with_other_tables_of_other_names_is_migrated(database_url: str) -> None:
    engine = make_engine(database_url)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE invoices (id INTEGER)"))
    migrate(engine)
    assert {"invoices", "jobs", "alembic_version"} <= set(inspect(engine).get_table_names())
    engine.dispose()


@pytest.mark.parametrize("name", ["d?mode=ro", "100%25 done", "a%b"])
def test_a_data_directory_named_with_url_characters_holds_its_own_store(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The store's URL was the path as it is: "?" began SQLAlchemy's query ("d?mode=ro" made a file "d"
    beside the directory, shared by every "d?..."), and "%25" was decoded to "%" (another directory)."""
    from finetwin.cli import main

    data = tmp_path / name
    monkeypatch.setenv("FINETWIN_DATA_DIR", str(data))
    monkeypatch.delenv("FINETWIN_DATABASE_URL", raising=False)
    assert main(["keys", "create", "--role", "viewer", "--name", "here"]) == 0
    capsys.readouterr()
    assert (data / "finetwin.db").is_file()
    assert sorted(path.name for path in tmp_path.iterdir()) == [name]  # nothing beside it
    assert main(["keys", "list", "--json"]) == 0
    assert [key["name"] for key in json.loads(capsys.readouterr().out)] == ["here"]
