"""A first start of `finetwin up`: the refit that makes the first model and the ingest worker (which
records every version that predicts) can both record v0001. The refit lost that race with a traceback;
now the row is there once, with what the fit knows (promoted)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event, insert, select

from calibrate.live_error import version_record
from calibrate.records import ModelVersionRecord
from calibrate.refit import record_version
from finetwin.schema import migrate
from twin.db import make_engine

METADATA = {"version": "v0001", "data": {"fingerprint": "f", "n_rows": 3}, "reason": "first model"}


def test_a_version_recorded_meanwhile_by_ingest_is_no_error(sqlite_url: str) -> None:
    engine, ingest = make_engine(sqlite_url), make_engine(sqlite_url)
    migrate(engine)
    raced: list[bool] = []

    @event.listens_for(engine, "before_cursor_execute")
    def ingest_gets_there_first(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("INSERT INTO model_versions") and not raced:
            raced.append(True)  # between the refit's check and its insert, as on a first start
            with ingest.begin() as other:
                other.execute(insert(ModelVersionRecord.__table__), [version_record(METADATA)])  # type: ignore[attr-defined]

    record_version(engine, METADATA, promoted=True)
    assert raced == [True]
    with engine.connect() as connection:
        rows = connection.execute(select(ModelVersionRecord.version, ModelVersionRecord.promoted)).all()  # type: ignore[call-overload]
    assert [tuple(r) for r in rows] == [("v0001", True)]
    engine.dispose()
    ingest.dispose()
