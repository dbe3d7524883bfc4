"""The API while its store does not answer: every request gets a 503 that says so, with Retry-After, never
a 500 with a traceback, and never a 401 that tells a caller with a good key that the key is wrong; once the
database takes connections again, the same requests are answered. On a real PostgreSQL, whose database is
made to refuse connections (ALLOW_CONNECTIONS false, its sessions ended), as it does while it restarts."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient

from advisor.retention_job import prune_tick
from advisor.routers.forecast import standing_tick
from advisor.store_errors import STORE_UNAVAILABLE, public_reason
from finetwin.schema import migrate
from tests.advisor.conftest import advisor_settings
from tests.conftest import api_app, api_headers
from twin.db import make_engine


@contextmanager
def refusing_connections(admin_url: str, database: str) -> Iterator[None]:
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        )
        try:
            yield
        finally:
            admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')


def test_a_store_that_does_not_answer_is_a_503_and_the_api_recovers_with_it(
    postgres_url: str, postgres_admin_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = make_engine(postgres_url)
    migrate(engine)
    seen_before, never_seen = api_headers(engine, "operator"), api_headers(engine, "viewer", name="other")
    with TestClient(api_app(advisor_settings(tmp_path), engine)) as client:
        assert client.get("/v1/cluster", headers=seen_before).status_code == 200  # its key now cached
        with refusing_connections(postgres_admin_url, postgres_url.rsplit("/", 1)[1]):
            answers = {
                "health": client.get("/healthz"),
                "metrics": client.get("/metrics", headers=seen_before),
                "a read with a key checked before": client.get("/v1/cluster", headers=seen_before),
                "a key not checked yet": client.get("/v1/cluster", headers=never_seen),
                "a write": client.put("/v1/slos", json={"slos": []}, headers=seen_before),
            }
            for what, answer in answers.items():
                assert answer.status_code == 503, (what, answer.status_code, answer.text)
                assert answer.json()["detail"] == STORE_UNAVAILABLE, what
                assert answer.headers["Retry-After"] == "5", what
                assert "127.0.0.1" not in answer.text and "5432" not in answer.text, answer.text
            # The background work of those moments: one warning each, no traceback.
            caplog.clear()
            with caplog.at_level(logging.WARNING):
                standing_tick(client.app.state.runtime)  # type: ignore[attr-defined]
                prune_tick(client.app.state.runtime)  # type: ignore[attr-defined]
            said = [
                (r.levelname, r.getMessage(), r.exc_info)
                for r in caplog.records
                if r.name.startswith(("advisor", "finetwin"))
            ]
            assert [level for level, _, _ in said] == ["WARNING", "WARNING"], said
            assert all("the store does not answer" in message and not trace for _, message, trace in said), (
                said
            )
        assert client.get("/healthz").status_code == 200
        assert client.get("/v1/cluster", headers=never_seen).status_code == 200
    engine.dispose()


def test_what_the_api_shows_of_a_failure_names_no_database_host() -> None:
    """A plan's error and steering's reason are shown to every caller: a store that does not answer is said
    in the 503's words, not in the driver's (which name the database's host and port)."""
    from sqlalchemy.exc import OperationalError

    refused = OperationalError(
        "SELECT 1", {}, Exception('connection to server at "10.0.0.7", port 5432 failed')
    )
    assert public_reason(refused) == STORE_UNAVAILABLE
    assert public_reason(ValueError("no scenario fits")) == "ValueError: no scenario fits"
