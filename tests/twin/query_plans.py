"""What SQLite plans for the statements a piece of code executes: for tests that hold a read to its index."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, event


def sqlite_plans(engine: Engine, run: Callable[[], object]) -> dict[str, str]:
    """Each statement `run()` executes on the SQLite `engine`, with SQLite's plan for it (EXPLAIN QUERY PLAN
    with the same parameters), its steps joined by ' / '."""
    executed: list[tuple[str, Any]] = []

    def remember(conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001
        executed.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", remember)
    try:
        run()
    finally:
        event.remove(engine, "before_cursor_execute", remember)
    with engine.connect() as connection:
        plans = {}
        for statement, parameters in executed:
            steps = connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters)
            plans[statement] = " / ".join(str(row[-1]) for row in steps)
        return plans
