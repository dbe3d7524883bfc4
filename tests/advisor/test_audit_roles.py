"""The deployment's two PostgreSQL roles (deploy/postgres/roles.sql): the schema's owner migrates, the
service connects as a role that owns nothing. Under it the app works, and the audit log can only grow.

Real PostgreSQL, real psql running the very file the compose stack runs at the database's first start.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from finetwin.cli import main
from finetwin.schema import migrate
from tests.advisor.conftest import advisor_settings
from tests.advisor.test_workflow import proposal, propose
from tests.conftest import (
    POSTGRES_ADMIN_URL,
    REPO,
    _postgres_reachable,
    api_app,
    api_headers,
    service_missing,
)
from twin.db import make_engine

ROLES_SQL = REPO / "deploy" / "postgres" / "roles.sql"


@dataclass(frozen=True)
class TwoRoles:
    owner: Engine
    service: Engine
    service_name: str


def _url(role: str, database: str) -> str:
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0]  # postgresql://postgres@host:port
    scheme, rest = base.split("://", 1)
    return f"{scheme}://{role}:secret@{rest.split('@', 1)[-1]}/{database}"


@pytest.fixture
def two_roles(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[TwoRoles]:
    """The two roles on a new database, its schema migrated by the owner (to the revision the test gives as
    the fixture's parameter, else the newest)."""
    if not _postgres_reachable():
        service_missing("PostgreSQL not reachable")
    psql = shutil.which("psql")
    if psql is None:
        service_missing("psql (Debian package postgresql-client) is needed to run deploy/postgres/roles.sql")
    import psycopg

    tag = uuid.uuid4().hex[:10]
    database, owner, service = f"finetwin_roles_{tag}", f"ft_owner_{tag}", f"ft_app_{tag}"
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    admin_url = f"{POSTGRES_ADMIN_URL.rsplit('/', 1)[0]}/{database}"
    env = {**os.environ, "FINETWIN_OWNER_PASSWORD": "secret", "FINETWIN_SERVICE_PASSWORD": "secret"}
    engines: list[Engine] = []
    try:
        command = [psql, admin_url, "-X", "-q", "-v", f"owner={owner}", "-v", f"service={service}"]
        done = subprocess.run(
            [*command, "-f", ROLES_SQL], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        owner_engine = make_engine(_url(owner, database))
        service_engine = make_engine(_url(service, database))
        engines += [owner_engine, service_engine]
        monkeypatch.setenv("FINETWIN_DATABASE_URL", _url(owner, database))
        revision = getattr(request, "param", None)
        if revision is None:
            assert main(["migrate"]) == 0  # as the deployment does it: `finetwin migrate`, as the owner
        else:
            migrate(owner_engine, revision)
        yield TwoRoles(owner_engine, service_engine, service)
    finally:
        for engine in engines:
            engine.dispose()
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            for role in (service, owner):  # their grants and default privileges went with the database
                admin.execute(f'DROP ROLE IF EXISTS "{role}"')


def _refused(engine: Engine, statement: str) -> str:
    with pytest.raises(DBAPIError) as caught, engine.begin() as connection:
        connection.execute(text(statement))
    return str(caught.value.orig)


def test_roles_sql_refuses_to_run_without_passwords(tmp_path: Path) -> None:
    psql = shutil.which("psql")
    if psql is None or not _postgres_reachable():
        service_missing("psql and PostgreSQL are needed")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FINETWIN_")}
    tag = uuid.uuid4().hex[:10]
    done = subprocess.run(
        [psql, POSTGRES_ADMIN_URL, "-X", "-q", "-v", f"owner=ft_never_{tag}", "-v", f"service=ft_never_{tag}",
         "-f", ROLES_SQL],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert "FINETWIN_OWNER_PASSWORD" in done.stderr


def test_the_service_role_cannot_empty_or_rewrite_the_audit_log(two_roles: TwoRoles) -> None:
    service = two_roles.service
    propose(service, proposal())  # the service writes recommendations and their audit entries
    for statement in (
        "UPDATE audit_log SET actor = 'mallory'",
        "DELETE FROM audit_log",
        "TRUNCATE audit_log",
    ):
        assert "permission denied" in _refused(service, statement)
    for statement in (
        "ALTER TABLE audit_log DISABLE TRIGGER ALL",
        "ALTER TABLE audit_log DISABLE TRIGGER audit_log_no_truncate",
        "DROP TRIGGER audit_log_no_update ON audit_log",
        "DROP TABLE audit_log",
    ):
        assert "must be owner" in _refused(service, statement)
    # Even the owner, which could only get past them by disabling them on purpose, meets the triggers.
    for statement in ("TRUNCATE audit_log", "DELETE FROM audit_log"):
        assert "append-only" in _refused(two_roles.owner, statement)
    with service.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM audit_log")).scalar_one() == 1


def test_the_app_works_as_the_service_role(two_roles: TwoRoles, tmp_path: Path) -> None:
    service = two_roles.service
    with service.connect() as connection:  # it owns nothing: not the schema, not a single table
        owned = connection.execute(
            text("SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tableowner = current_user")
        ).scalar_one()
        assert owned == 0
    (rec_id,) = propose(service, proposal())
    # `finetwin api` migrates before serving: on an up-to-date schema a read, which the service may do.
    migrate(service)
    app = api_app(advisor_settings(tmp_path), service)
    operator, approver = api_headers(service, "operator"), api_headers(service, "approver")
    with TestClient(app) as client:
        slos = {"slos": [{"name": "p95 wait", "metric": "wait_p95_s", "max": 3600}]}
        assert client.put("/v1/slos", json=slos, headers=operator).status_code == 200
        approved = client.post(
            f"/v1/recommendations/{rec_id}/approve", json={"comment": "go"}, headers=approver
        )
        assert approved.status_code == 200, approved.text
        assert approved.json()["state"] == "approved"
        audit = client.get("/v1/audit", headers=operator).json()
    subjects = [entry["subject"] for entry in audit["entries"]]
    assert f"recommendation:{rec_id}" in subjects and "slos:default" in subjects


@pytest.mark.parametrize("two_roles", ["0013"], indirect=True)
def test_a_service_that_may_not_migrate_a_schema_behind_says_who_must(
    two_roles: TwoRoles, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A newer finetwin started as the service before `finetwin migrate` ran as the owner: it was a
    ProgrammingError traceback."""
    service_url = two_roles.service.url.render_as_string(hide_password=False)
    monkeypatch.setenv("FINETWIN_DATABASE_URL", service_url)
    assert main(["keys", "list"]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert (
        "permission denied for schema public: its schema needs migrating, and this role may not; run "
        "`finetwin migrate` as the schema's owner"
    ) in error, error
    assert "secret" not in error and "Traceback" not in error
    with two_roles.owner.connect() as connection:  # nothing changed
        assert connection.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == "0013"
