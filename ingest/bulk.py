"""Many rows in one statement: how ingest writes a batch, on PostgreSQL and on SQLite.

PostgreSQL: rows travel by binary COPY, which psycopg formats in C: the client's work is one call per row,
and no statement's text grows with the batch. New rows (`insert_new_rows`) are COPYed straight into their
table when none of them is there yet, the usual case; otherwise, and for updates and upserts, they are
COPYed into a temporary staging table shaped like the target (one per target and purpose, private to the
connection, emptied at commit), and one INSERT ... SELECT ... ON CONFLICT or UPDATE ... FROM moves them into
place. Measured against the alternatives (bench/ingest.py, tmp profiles):
- `unnest()` of one binary array per column: psycopg dumps arrays element by element in Python, ~1 µs per
  cell (a 33-column job row cost 30 µs);
- one JSON document (`json_populate_recordset`): cheapest for the client, but PostgreSQL parses every row
  as JSON and the raw event's payload twice, which doubled the server's CPU per event;
- staging every batch: ~40 % more of the server's CPU for the raw events than COPYing them straight in.

Staging columns are lenient (integers as numeric, strings as unbounded text) so that a value the target
refuses is refused by the INSERT itself, with the target's error (say, NumericValueOutOfRange for a GPU
count beyond `integer`): ingest dead-letters such an event with that reason. A straight COPY gets the same
error for what the server checks; integers it would not see (psycopg's binary COPY wraps one too big for
its column without a word) make the rows take the staged path.

SQLite: an executemany, which SQLAlchemy batches into multi-row VALUES statements.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Connection,
    CursorResult,
    DateTime,
    Float,
    Integer,
    SmallInteger,
    String,
    Table,
    Text,
    TypeDecorator,
    Uuid,
    any_,
    bindparam,
    column,
    exists,
    select,
    table,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError

from twin.db import in_chunks

Row = Sequence[Any]  # a row's values, in the order of the `names` that come with it
Finish = Callable[[Any], Any]  # adds ON CONFLICT / RETURNING to an INSERT


def select_locked(connection: Connection, columns: Sequence[Any], key: Any, keys: list[str]) -> Iterator[Any]:
    """The rows of `columns` whose `key` column is one of `keys`, each locked until the transaction ends, in
    `key` order: two transactions that lock some of the same rows take them in one order, so neither waits
    on the other in a circle. PostgreSQL: FOR UPDATE, the keys as one array parameter, not one parameter per
    key; SQLite holds the whole database's write lock already, and takes the keys in chunks it accepts."""
    if connection.dialect.name == "postgresql":
        conditions = [key == any_(bindparam("keys", keys, type_=postgresql.ARRAY(Text())))]
    else:
        conditions = [key.in_(chunk) for chunk in in_chunks(keys)]
    for condition in conditions:
        yield from connection.execute(select(*columns).where(condition).order_by(key).with_for_update())


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
    the keys of the rows it skipped.

    Usually none is there yet, so on PostgreSQL the rows are first COPYed straight into `target`, in a
    savepoint: less of the server's work than staging them and INSERTing from the stage. If one
    was there already (a redelivery, or another worker's insert during a rebalance), or PostgreSQL refuses a
    value, the savepoint is rolled back and the staged INSERT ... ON CONFLICT DO NOTHING decides, row by row.
    Either way only the skipped keys travel back: usually none (RETURNING the inserted keys sent every id
    back, and loading 5,000 UUIDs a batch was ~10 % of the client's work on the events)."""
    names = tuple(names)
    at = names.index(key)
    if connection.dialect.name == "sqlite":
        insert = sqlite.insert(target).on_conflict_do_nothing(index_elements=[key]).returning(target.c[key])
        result = connection.execute(insert, [dict(zip(names, row, strict=True)) for row in rows])
        inserted = set(result.scalars().all())
        return [row[at] for row in rows if row[at] not in inserted]
    _require_postgresql(connection)
    exact = _column_types(connection, target, exact=True)
    if _integers_fit(exact, names, rows):
        try:
            with connection.begin_nested():
                _copy(connection, target.name, names, exact, rows)
            return []
        except (IntegrityError, DataError):
            pass  # rolled back to the savepoint: nothing of this COPY is left
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
    types = _column_types(connection, target, exact=False)
    definition = ", ".join(f'"{n}" {t}' for n, t in types.items())
    # The DELETE empties it should one transaction stage twice; each commit empties it anyway.
    setup = (
        f'CREATE TEMP TABLE IF NOT EXISTS "{name}" ({definition}) ON COMMIT DELETE ROWS; DELETE FROM "{name}"'
    )
    _copy(connection, name, names, types, rows, setup)
    if name not in _STAGES:
        _STAGES[name] = table(name, *[column(n) for n in types])
    return _STAGES[name]


_STAGES: dict[str, Any] = {}


def _copy(
    connection: Connection, into: str, names: tuple[str, ...], types: dict[str, str], rows: Sequence[Row],
    setup: str | None = None,
) -> None:  # fmt: skip
    """Binary COPY of the rows (values of the columns `names`) into the table `into`, after `setup`."""
    columns = ", ".join(f'"{n}"' for n in names)
    driver = connection.connection.driver_connection
    try:
        with driver.cursor() as cursor:  # type: ignore[union-attr]
            if setup:
                cursor.execute(setup)
            with cursor.copy(f'COPY "{into}" ({columns}) FROM STDIN (FORMAT BINARY)') as copy:
                copy.set_types([types[n] for n in names])
                for row in rows:
                    copy.write_row(row)
    except psycopg.Error as exc:  # as SQLAlchemy raises it for the statements it runs
        raise DBAPIError.instance(
            f"COPY {into}", None, exc, psycopg.Error, dialect=connection.dialect
        ) from exc


_INTEGER_LIMITS = {"int2": 2**15, "int4": 2**31, "int8": 2**63}


def _integers_fit(types: dict[str, str], names: tuple[str, ...], rows: Sequence[Row]) -> bool:
    """Whether every integer fits its column's type: psycopg's binary COPY silently wraps one that does not
    (2**31 went in as -2**31), where the staged path lets PostgreSQL refuse it."""
    limits = [
        (at, _INTEGER_LIMITS[types[name]]) for at, name in enumerate(names) if types[name] in _INTEGER_LIMITS
    ]
    return all(-limit <= row[at] < limit for row in rows for at, limit in limits if row[at] is not None)


_COLUMN_TYPES: dict[tuple[str, bool], dict[str, str]] = {}


def _column_types(connection: Connection, target: Table, *, exact: bool) -> dict[str, str]:
    """Each column's type, by name: its own (`exact`), or as a staging table holds it."""
    if (target.name, exact) not in _COLUMN_TYPES:
        types = {c.name: _column_type(c, connection, exact) for c in target.columns}
        _COLUMN_TYPES[target.name, exact] = types
    return _COLUMN_TYPES[target.name, exact]


def _column_type(col: Any, connection: Connection, exact: bool) -> str:
    kind = col.type.dialect_impl(connection.dialect)  # a type's PostgreSQL variant, if it has one
    if isinstance(kind, TypeDecorator):  # say, sqlmodel's AutoString
        kind = kind.load_dialect_impl(connection.dialect)
    if isinstance(kind, Uuid):
        return "uuid"
    if isinstance(kind, Boolean):
        return "bool"
    if isinstance(kind, Integer):
        if not exact:
            return "numeric"
        return (
            "int8" if isinstance(kind, BigInteger) else "int2" if isinstance(kind, SmallInteger) else "int4"
        )
    if isinstance(kind, Float):
        return "float8"
    if isinstance(kind, DateTime):
        return "timestamptz" if kind.timezone else "timestamp"
    if isinstance(kind, JSON):
        return "json"
    if isinstance(kind, String):
        return "text"
    raise TypeError(f"no COPY type for column {col.name} ({kind})")
