"""Many rows in one statement: how ingest writes a batch, on PostgreSQL and on SQLite.

PostgreSQL: the rows are COPYed in binary into a temporary staging table shaped like the target (one per
target and purpose, private to the connection, emptied at commit), then one INSERT ... SELECT (with the
caller's ON CONFLICT and RETURNING) or UPDATE ... FROM moves them into place. psycopg formats a binary COPY
row in C, so the client's work is one call per row; the statements' text never changes with the batch size.
Measured on bench/ingest.py's events against the alternatives:
- `unnest()` of one binary array per column: psycopg dumps arrays element by element in Python, ~1 µs per
  cell (a 33-column job row cost 30 µs);
- one JSON document (`json_populate_recordset`): cheapest for the client, but PostgreSQL parses every row
  as JSON and the raw event's payload twice, which doubled the server's CPU per event.

Staging columns are lenient (integers as numeric, strings as unbounded text) so that a value the target
refuses is refused by the INSERT itself, with the target's error (say, NumericValueOutOfRange for a GPU
count beyond `integer`): ingest dead-letters such an event with that reason.

SQLite: an executemany, which SQLAlchemy batches into multi-row VALUES statements.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from sqlalchemy import (
    JSON,
    Boolean,
    Connection,
    CursorResult,
    DateTime,
    Float,
    Integer,
    String,
    Table,
    TypeDecorator,
    Uuid,
    bindparam,
    column,
    exists,
    select,
    table,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError

Row = Sequence[Any]  # a row's values, in the order of the `names` that come with it
Finish = Callable[[Any], Any]  # adds ON CONFLICT / RETURNING to an INSERT


def insert_rows(
    connection: Connection,
    target: Table,
    names: Sequence[str],
    rows: Sequence[Row],
    finish: Finish,
    kind: str,
) -> CursorResult[Any]:
    """INSERT `rows` (values of the columns `names`) into `target` in one statement, made by `finish` from
    the plain INSERT; `kind` names what `finish` adds (PostgreSQL statements are compiled once per target,
    columns and kind)."""
    names = tuple(names)
    if connection.dialect.name == "sqlite":
        return connection.execute(
            finish(sqlite.insert(target)), [dict(zip(names, row, strict=True)) for row in rows]
        )
    _require_postgresql(connection)
    stage = _stage(connection, target, names, rows, kind)

    def build() -> Any:
        return finish(postgresql.insert(target).from_select(names, select(*[stage.c[n] for n in names])))

    return connection.exec_driver_sql(_compiled(connection, ("insert", target.name, names, kind), build))


def insert_new_rows(
    connection: Connection, target: Table, names: Sequence[str], rows: Sequence[Row], key: str
) -> list[Any]:
    """INSERT the rows whose `key` (a unique column) is not in `target` yet, skipping the others; returns
    the keys of the rows it skipped. Usually there are none, so next to nothing travels back (RETURNING the
    inserted keys sent every id back, and loading 5,000 UUIDs a batch was ~10 % of writing the events)."""
    names = tuple(names)
    at = names.index(key)
    if connection.dialect.name == "sqlite":
        insert = sqlite.insert(target).on_conflict_do_nothing(index_elements=[key]).returning(target.c[key])
        result = connection.execute(insert, [dict(zip(names, row, strict=True)) for row in rows])
        inserted = set(result.scalars().all())
        return [row[at] for row in rows if row[at] not in inserted]
    _require_postgresql(connection)
    stage = _stage(connection, target, names, rows, "new")

    def build() -> Any:
        # WITH inserted AS (INSERT ... ON CONFLICT DO NOTHING RETURNING key)
        # SELECT key FROM stage WHERE NOT EXISTS (SELECT FROM inserted WHERE inserted.key = stage.key)
        query = select(*[stage.c[n] for n in names])
        inserted = (
            postgresql.insert(target).from_select(names, query)
            .on_conflict_do_nothing(index_elements=[key]).returning(target.c[key]).cte("inserted")
        )  # fmt: skip
        return select(stage.c[key]).where(~exists().where(inserted.c[key] == stage.c[key]))

    sql = _compiled(connection, ("insert-new", target.name, names, key), build)
    return list(connection.exec_driver_sql(sql).scalars().all())


def update_rows(
    connection: Connection, target: Table, key: str, names: Sequence[str], rows: Sequence[Row], kind: str
) -> None:
    """UPDATE the columns `names` of each row of `target` whose `key` column matches the row's; each row is
    the key's value followed by the values of `names`."""
    names = tuple(names)
    columns = (key, *names)
    if connection.dialect.name == "sqlite":
        stmt = update(target).where(target.c[key] == bindparam(f"b_{key}"))
        stmt = stmt.values({name: bindparam(f"b_{name}") for name in names})
        connection.execute(
            stmt, [{f"b_{n}": value for n, value in zip(columns, row, strict=True)} for row in rows]
        )
        return
    _require_postgresql(connection)
    stage = _stage(connection, target, columns, rows, kind)

    def build() -> Any:
        values = {name: stage.c[name] for name in names}
        return update(target).values(values).where(target.c[key] == stage.c[key])

    connection.exec_driver_sql(_compiled(connection, ("update", target.name, columns, kind), build))


def _require_postgresql(connection: Connection) -> None:
    if connection.dialect.name != "postgresql":
        raise NotImplementedError(f"ingest supports PostgreSQL and SQLite, not {connection.dialect.name}")


_STATEMENTS: dict[tuple[str, str, tuple[str, ...], str], str] = {}


def _compiled(
    connection: Connection, key: tuple[str, str, tuple[str, ...], str], build: Callable[[], Any]
) -> str:
    if key not in _STATEMENTS:
        _STATEMENTS[key] = str(build().compile(dialect=connection.dialect))
    return _STATEMENTS[key]


# --- PostgreSQL staging tables ----------------------------------------------------------------------------


def _stage(
    connection: Connection, target: Table, names: tuple[str, ...], rows: Sequence[Row], kind: str
) -> Any:
    """COPY the rows into this connection's staging table for `target` and `kind`; returns that table."""
    name = f"ingest_stage_{target.name}_{kind.replace('-', '_')}"
    types = _stage_types(connection, target)
    columns = ", ".join(f'"{n}"' for n in names)
    definition = ", ".join(f'"{n}" {t}' for n, t in types.items())
    # The DELETE empties it should one transaction stage twice; each commit empties it anyway.
    setup = (
        f'CREATE TEMP TABLE IF NOT EXISTS "{name}" ({definition}) ON COMMIT DELETE ROWS; DELETE FROM "{name}"'
    )
    driver = connection.connection.driver_connection
    try:
        with driver.cursor() as cursor:  # type: ignore[union-attr]
            cursor.execute(setup)
            with cursor.copy(f'COPY "{name}" ({columns}) FROM STDIN (FORMAT BINARY)') as copy:
                copy.set_types([types[n] for n in names])
                for row in rows:
                    copy.write_row(row)
    except psycopg.Error as exc:  # what the connection raises when SQLAlchemy runs the statements
        raise DBAPIError.instance(
            f"COPY {name}", None, exc, psycopg.Error, dialect=connection.dialect
        ) from exc  # fmt: skip
    return table(name, *[column(n) for n in types])


_STAGE_TYPES: dict[str, dict[str, str]] = {}


def _stage_types(connection: Connection, target: Table) -> dict[str, str]:
    """Each column's type in the staging table, by name."""
    if target.name not in _STAGE_TYPES:
        _STAGE_TYPES[target.name] = {c.name: _stage_type(c, connection) for c in target.columns}
    return _STAGE_TYPES[target.name]


def _stage_type(col: Any, connection: Connection) -> str:
    kind = col.type.dialect_impl(connection.dialect)  # a type's PostgreSQL variant, if it has one
    if isinstance(kind, TypeDecorator):  # say, sqlmodel's AutoString
        kind = kind.load_dialect_impl(connection.dialect)
    if isinstance(kind, Uuid):
        return "uuid"
    if isinstance(kind, Boolean):
        return "bool"
    if isinstance(kind, Integer):
        return "numeric"
    if isinstance(kind, Float):
        return "float8"
    if isinstance(kind, DateTime):
        return "timestamptz"
    if isinstance(kind, JSON):
        return "json"
    if isinstance(kind, String):
        return "text"
    raise TypeError(f"no staging type for column {col.name} ({kind})")
