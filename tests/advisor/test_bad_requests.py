"""Bad requests get a 4xx that says what is wrong, never a 500 (issue 10), on SQLite and PostgreSQL.

Each case below was a 500, a silent coercion, a write on a GET or an unbounded computation before.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event

from advisor.routers.plan import MAX_PLAN_JOB_RUNS, size_problems
from tests.advisor.conftest import advisor_settings
from tests.advisor.fakes import FakeInUse, FakeModels
from tests.advisor.seed import seed_overloaded_cluster
from tests.advisor.test_workflow import proposal, propose
from tests.conftest import api_app, api_headers, tcp_listening, wait_for
from twin.capacity import SweepSize

A100 = "NVIDIA-A100-SXM4-80GB"
CONFIG = {
    "model_name": "llama3-8b", "method": "lora", "gpu_model": A100, "number_gpus": 4, "number_nodes": 1,
    "batch_size": 8, "tokens_per_sample": 1024,
}  # fmt: skip


def _app(engine: Engine, tmp_path: Path, **settings: object) -> TestClient:
    app = api_app(advisor_settings(tmp_path, **settings), engine, FakeInUse(None))
    return TestClient(app)


@pytest.fixture
def api(engine: Engine, tmp_path: Path) -> Iterator[TestClient]:
    with _app(engine, tmp_path) as client:
        yield client


def _refused(response, status: int, *words: str) -> dict:  # type: ignore[no-untyped-def]
    assert response.status_code == status, response.text
    body = response.json()
    assert isinstance(body["detail"], str) and all(w in body["detail"] for w in words), body
    return body


# --- NUL characters (PostgreSQL cannot store them: psycopg raised, a 500) ------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/v1/jobs/a%00b",
        "/v1/jobs?gpu_model=a%00b",
        "/v1/audit?subject=a%00b",
        "/v1/recommendations/a%00b",
        "/v1/models/live-error?model_version=a%00b",
    ],
)
def test_a_nul_in_the_path_or_query_is_422(api: TestClient, engine: Engine, path: str) -> None:
    body = _refused(api.get(path, headers=api_headers(engine, "viewer")), 422, "NUL")
    assert body["errors"][0]["loc"] == ["path" if "?" not in path else "query"]


def test_a_nul_in_a_comment_or_an_slo_name_is_422(api: TestClient, engine: Engine) -> None:
    (rec_id,) = propose(engine, proposal())
    approver = api_headers(engine, "approver")
    for verb in ("approve", "reject"):
        response = api.post(
            f"/v1/recommendations/{rec_id}/{verb}", json={"comment": "ok\x00"}, headers=approver
        )
        _refused(response, 422, "NUL")
    slos = {"slos": [{"name": "wait\x00", "metric": "wait_p95_s", "max": 60}]}
    _refused(api.put("/v1/slos", json=slos, headers=approver), 422, "NUL")
    # A backslash followed by "u0000" is text, not a NUL: it is stored as it came.
    text = "not a NUL: \\u0000"
    rejected = api.post(f"/v1/recommendations/{rec_id}/reject", json={"comment": text}, headers=approver)
    assert rejected.status_code == 200 and rejected.json()["comment"] == text


def test_a_lone_surrogate_is_a_422_that_says_so(api: TestClient, engine: Engine) -> None:
    """JSON's `\\ud800` escape is a lone UTF-16 surrogate: refused as one, not as a NUL it does not hold."""
    body = json.dumps(CONFIG | {"model_name": "MODEL"}).replace("MODEL", "llama\\ud800").encode()
    headers = api_headers(engine, "viewer") | {"Content-Type": "application/json"}
    refused = _refused(api.post("/v1/advise", content=body, headers=headers), 422, "surrogate (U+D800)")
    assert "NUL" not in refused["detail"]


# --- bodies and strings bounded --------------------------------------------------------------------------


def test_a_body_over_the_limit_is_413_before_it_is_parsed(engine: Engine, tmp_path: Path) -> None:
    viewer = api_headers(engine, "viewer")
    with _app(engine, tmp_path, max_body_bytes=4096) as client:
        big = b"[" * 5000  # not even JSON: a 413 says it was never parsed
        _refused(client.post("/v1/advise", content=big, headers=viewer), 413, "4096 bytes")

        def chunks() -> Iterator[bytes]:  # no Content-Length: refused once the limit has arrived
            for _ in range(10):
                yield b" " * 1000

        _refused(client.post("/v1/advise", content=chunks(), headers=viewer), 413, "FINETWIN_MAX_BODY_BYTES")
        small = client.post("/v1/advise", json=CONFIG, headers=viewer)
        assert small.status_code == 409  # within the limit it goes on (no model is in use here)


def test_strings_have_maximum_lengths(api: TestClient, engine: Engine) -> None:
    operator = api_headers(engine, "operator")
    long_name = {"slos": [{"name": "x" * 2_000_000, "metric": "wait_p95_s", "max": 60}]}
    _refused(api.put("/v1/slos", json=long_name, headers=operator), 413)  # over the body limit first
    for slo in (
        {"name": "x" * 201, "metric": "wait_p95_s", "max": 60},
        {"name": "u", "metric": "utilization", "min": 0.5, "gpu_model": "x" * 101},
    ):
        _refused(api.put("/v1/slos", json={"slos": [slo]}, headers=operator), 422, "at most")
    _refused(api.post("/v1/whatif", json={"horizon": "1" * 40 + "h"}, headers=operator), 422, "at most 32")
    _refused(api.get("/v1/jobs/" + "j" * 201, headers=operator), 422, "at most 200")


# --- types and required fields ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change", [{"fast_kernels": 0}, {"number_gpus": True}, {"number_gpus": "4"}, {"time_limit_s": "60"}]
)
def test_numbers_and_flags_are_not_coerced(api: TestClient, engine: Engine, change: dict) -> None:
    viewer = api_headers(engine, "viewer")
    (field,) = change
    for path in ("/v1/advise", "/v1/predict"):
        body = _refused(api.post(path, json=CONFIG | change, headers=viewer), 422, field)
        assert body["errors"][0]["loc"][-1] == field


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/whatif", {"runs": "4"}, "runs"),
        ("/v1/whatif", {"runs": True}, "runs"),
        ("/v1/whatif", {"horizon": True}, "horizon"),
        ("/v1/whatif", {"changes": {"right_size_batches": 1}}, "right_size_batches"),
        ("/v1/whatif", {"changes": {"nodes": [{"gpu_model": A100, "add": "2"}]}}, "add"),
        ("/v1/plan", {"vary": [{"gpu_model": A100, "min": 1, "max": True}]}, "max"),
        ("/v1/plan", {"vary": [f"{A100}=1..2"], "runs": 2.0}, "runs"),
    ],
)
def test_scenario_numbers_and_flags_are_not_coerced(
    api: TestClient, engine: Engine, path: str, body: dict, field: str
) -> None:
    body = _refused(api.post(path, json=body, headers=api_headers(engine, "operator")), 422, field)
    assert field in body["errors"][0]["loc"]


def test_the_document_describes_every_error_answer(api: TestClient, engine: Engine) -> None:
    """A 422's `detail` was a string where the document said a list; the 400 was not in it at all."""
    document = api.get("/openapi.json").json()
    advise = document["paths"]["/v1/advise"]["post"]["responses"]
    for status in ("400", "401", "403", "413", "422", "429"):
        schema = advise[status]["content"]["application/json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/ErrorOut"}, status
    assert document["components"]["schemas"]["ErrorOut"]["properties"]["detail"]["type"] == "string"
    viewer = api_headers(engine, "viewer")
    json_headers = viewer | {"Content-Type": "application/json"}
    unreadable = api.post("/v1/advise", content=b'{"model_name": "\xff"}', headers=json_headers)
    _refused(unreadable, 400, "not UTF-8: byte 0xff at offset 16")


@pytest.mark.parametrize(
    "body",
    [
        b'{"model_name": "l\xe9ra"}',  # Latin-1: FastAPI's "There was an error parsing the body"
        b"\xff\xfe{}",  # a UTF-16 byte order mark: a 422 "JSON decode error" at body.0
    ],
)
def test_a_body_that_is_not_utf8_is_a_400_naming_its_first_bad_byte(
    api: TestClient, engine: Engine, body: bytes
) -> None:
    headers = api_headers(engine, "viewer") | {"Content-Type": "application/json"}
    first = body.decode("utf-8", errors="replace").index("\ufffd")
    refused = _refused(api.post("/v1/advise", content=body, headers=headers), 400, "not UTF-8")
    assert refused["errors"][0]["type"] == "not_utf8" and f"0x{body[first]:02x}" in refused["detail"]


@pytest.mark.parametrize(
    "content_type", ["application/x-www-form-urlencoded", "application/yaml", "text/plain"]
)
def test_a_json_body_sent_as_another_type_says_which_type_to_send(
    api: TestClient, engine: Engine, content_type: str
) -> None:
    """curl -d sends a form's type: the detail said only "Input should be a valid dictionary or object to
    extract fields from", of a body that was one."""
    headers = api_headers(engine, "viewer") | {"Content-Type": content_type}
    refused = _refused(api.post("/v1/advise", content=json.dumps(CONFIG), headers=headers), 422)
    assert f"Content-Type: application/json; this request's is '{content_type}'" in refused["detail"]
    sent_as_json = headers | {"Content-Type": "application/json; charset=utf-8"}
    # Read as JSON, and valid: the 409 of an API with no models in use.
    assert api.post("/v1/advise", content=json.dumps(CONFIG), headers=sent_as_json).status_code == 409


def test_a_detail_cut_short_says_how_many_more_errors_there_are(api: TestClient, engine: Engine) -> None:
    refused = _refused(api.post("/v1/advise", json={}, headers=api_headers(engine, "viewer")), 422)
    assert len(refused["errors"]) == 6, refused
    assert refused["detail"].count("Field required") == 5 and refused["detail"].endswith(
        "; and 1 more (in errors)"
    )


def test_a_blank_model_name_is_422(api: TestClient, engine: Engine) -> None:
    viewer = api_headers(engine, "viewer")
    for path in ("/v1/predict", "/v1/advise"):
        _refused(
            api.post(path, json=CONFIG | {"model_name": " "}, headers=viewer), 422, "model name is empty"
        )


def test_a_misnamed_key_is_said_first_and_no_consequence_is_said_at_all(
    api: TestClient, engine: Engine
) -> None:
    """`{"rows": [...]}` for `configs` is read as one configuration: seven fields missing, and the unknown
    `rows` was the eighth error, past the five the detail names; pydantic's "The default factory uses
    validated data, but at least one validation error occurred" (number_nodes) took a place among them."""
    response = api.post("/v1/predict", json={"rows": [CONFIG]}, headers=api_headers(engine, "viewer"))
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert detail.startswith("body.configs.0.rows: Extra inputs are not permitted"), detail
    assert "default factory" not in json.dumps(response.json()), response.json()
    assert {e["type"] for e in response.json()["errors"]} == {"extra_forbidden", "missing"}


def test_an_empty_slo_set_must_be_explicit(api: TestClient, engine: Engine) -> None:
    operator = api_headers(engine, "operator")
    before = api.get("/v1/slos", headers=operator).json()
    _refused(api.put("/v1/slos", json={}, headers=operator), 422, "slos")
    assert api.get("/v1/slos", headers=operator).json() == before  # nothing was declared
    cleared = api.put("/v1/slos", json={"slos": []}, headers=operator)
    assert cleared.status_code == 200 and cleared.json()["slos"] == [] and cleared.json()["source"] == "api"


# --- parameters and keys the API does not take ----------------------------------------------------------


def test_a_query_parameter_a_route_does_not_take_is_422_with_the_one_meant(
    api: TestClient, engine: Engine
) -> None:
    """`?status=running` (the parameter is `state`) was ignored: every job came back, read as running."""
    viewer = api_headers(engine, "viewer")
    assert api.get("/v1/jobs?state=running&limit=5", headers=viewer).status_code == 200
    body = _refused(api.get("/v1/jobs?status=running", headers=viewer), 422)
    assert body["detail"] == (
        "query.status: unknown parameter (did you mean 'state'?); it takes state, gpu_model, attention, "
        "limit, offset"
    )
    assert body["errors"][0]["loc"] == ["query", "status"] and body["errors"][0]["type"] == "extra_forbidden"
    # A parameter of a route's dependencies is one it takes; a route that takes none says so.
    assert api.get("/v1/forecast/skill?since=24h", headers=viewer).status_code == 200
    _refused(api.get("/v1/cluster?cluster=a", headers=viewer), 422, "it takes no query parameters")
    # The key is checked first: a caller without one learns nothing of the route's parameters.
    assert api.get("/v1/jobs?status=running").status_code == 401


def test_every_v1_read_refuses_an_unknown_parameter_and_pages_outside_v1_do_not(
    api: TestClient, engine: Engine
) -> None:
    viewer = api_headers(engine, "viewer")
    reads = [
        path for path, operations in api.get("/openapi.json").json()["paths"].items()
        if "get" in operations and path.startswith("/v1/") and "{" not in path
    ]  # fmt: skip
    assert len(reads) >= 10, reads
    for path in reads:
        _refused(api.get(f"{path}?zz_unknown=1", headers=viewer), 422, "query.zz_unknown: unknown parameter")
    # What a browser adds to a page's or a file's address (a cache buster) is not the API's to refuse.
    for path in ("/?v=2", "/static/app.js?v=2", "/healthz?probe=1"):
        assert api.get(path).status_code == 200, path


def _without(config: dict, key: str) -> dict:
    return {k: v for k, v in config.items() if k != key}


@pytest.mark.parametrize(
    ("path", "body", "expected"),
    [
        ("/v1/advise", _without(CONFIG, "tokens_per_sample") | {"seq_len": 1024},
         "body.seq_len: Extra inputs are not permitted (did you mean 'tokens_per_sample'?)"),
        # By spelling alone `model` is nearest to `gpu_model`; people mean the LLM.
        ("/v1/predict", {"configs": [_without(CONFIG, "model_name") | {"model": "x"}]},
         "body.configs.0.model: Extra inputs are not permitted (did you mean 'model_name'?)"),
        ("/v1/whatif", {"changes": {"nodez": []}},
         "body.changes.nodez: Extra inputs are not permitted (did you mean 'nodes'?)"),
        # No key of its section is near: the keys it takes.
        ("/v1/whatif", {"changes": {"nodes": [{"gpu_model": "L40S", "count": 1}]}},
         "body.changes.nodes.0.count: Extra inputs are not permitted; it takes gpu_model, add, remove, "
         "gpus_per_node"),
    ],
)  # fmt: skip
def test_an_unknown_key_of_a_body_names_the_key_of_its_section_it_stands_for(
    api: TestClient, engine: Engine, path: str, body: dict, expected: str
) -> None:
    response = api.post(path, json=body, headers=api_headers(engine, "viewer"))
    assert _refused(response, 422)["detail"].startswith(expected), response.json()


# --- what-ifs bounded ------------------------------------------------------------------------------------


def test_a_whatif_too_big_is_refused_before_it_runs(engine: Engine, tmp_path: Path) -> None:
    seed_overloaded_cluster(engine)
    viewer = api_headers(engine, "viewer")
    with _app(engine, tmp_path) as client:
        huge = {
            "runs": 64,
            "changes": {"nodes": [{"gpu_model": A100, "add": 10_000, "gpus_per_node": 64}] * 100},
        }
        body = _refused(client.post("/v1/whatif", json=huge, headers=viewer), 422, "too big")
        assert "1000001 nodes" in body["detail"] and "64000008 GPUs" in body["detail"]
        steps = {"horizon": "30d", "interval": "1m", "runs": 1}
        _refused(client.post("/v1/whatif", json=steps, headers=viewer), 422, "43200 intervals")
        small = client.post("/v1/whatif", json={"horizon": "2h", "runs": 2}, headers=viewer)
        assert small.status_code == 200


@pytest.mark.parametrize("horizon", [1e308, 1e300, "4000d"])
def test_a_horizon_longer_than_the_twin_simulates_is_a_422_naming_it(
    api: TestClient, engine: Engine, horizon: object
) -> None:
    """1e308 s overflowed counting the expected arrivals (a 500); 1e300 s was refused with a job count of
    300 digits."""
    seed_overloaded_cluster(engine)
    body = _refused(
        api.post("/v1/whatif", json={"horizon": horizon, "runs": 1}, headers=api_headers(engine, "viewer")),
        422,
        "ten years",
    )
    assert body["errors"][0]["loc"][-1] == "horizon"


def test_an_interval_longer_than_the_horizon_is_a_422(api: TestClient, engine: Engine) -> None:
    """It was answered with the interval echoed as asked and a series of one interval of the horizon."""
    seed_overloaded_cluster(engine)
    viewer = api_headers(engine, "viewer")
    _refused(
        api.post("/v1/whatif", json={"horizon": "2h", "interval": "3h", "runs": 1}, headers=viewer),
        422,
        "longer than the horizon",
    )
    assert (
        api.post(
            "/v1/whatif", json={"horizon": "2h", "interval": "2h", "runs": 1}, headers=viewer
        ).status_code
        == 200
    )


def test_a_plan_too_big_is_refused_before_it_is_queued(engine: Engine, tmp_path: Path) -> None:
    """Each was queued and ran: a horizon of 1e308 s held both cores and grew by GBs a minute."""
    seed_overloaded_cluster(engine, jobs=400)
    operator = api_headers(engine, "operator")
    with _app(engine, tmp_path) as client:
        for plan, words in [
            ({"vary": [f"{A100}=1..1"], "horizon": 1e308}, ["ten years"]),
            ({"vary": [f"{A100}=1..1"], "horizon": "2h", "interval": "1d"}, ["longer than the horizon"]),
            ({"vary": ["L40S=100000"]}, ["too big", "a scenario of 100001 nodes", "800008 GPUs"]),
            (
                {"vary": [f"{A100}=1..200"], "runs": 64, "horizon": "2h"},
                ["too big", "simulated jobs: 200 scenarios x 64 runs"],
            ),
            ({"vary": [f"{A100}=1..1"], "horizon": "30d", "interval": "1m"}, ["too big", "43200 intervals"]),
        ]:
            _refused(client.post("/v1/plan", json=plan, headers=operator), 422, *words)
        assert client.get("/v1/plan", headers=operator).json() == []
        fits = {"vary": [f"{A100}=1..200"], "runs": 62, "horizon": "2h"}  # 200 x 62 x 400 jobs: 4,960,000
        assert client.post("/v1/plan", json=fits, headers=operator).status_code == 202


def test_a_plan_whose_tasks_are_each_longer_than_a_whatif_is_too_big() -> None:
    """A task is what the API waits for when it is asked to stop: one of 8 runs of 100,000 jobs each would
    hold it for about a minute."""
    size = SweepSize(scenarios=1, nodes=1, gpus=8, jobs_per_run=100_000, runs=8, task_runs=8, intervals=24)
    assert size.job_runs <= MAX_PLAN_JOB_RUNS
    (problem,) = size_problems(size)
    assert problem.startswith("800,000 simulated jobs in a task: 8 runs x 100,000 jobs"), problem
    assert size_problems(replace(size, task_runs=2)) == []


class _Records(logging.Handler):
    """Sets `seen` when a record containing `text` is logged."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.seen, self.messages = text, threading.Event(), []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if self.text in message:
            self.messages.append(message)
            self.seen.set()


def test_a_whatif_stops_when_its_client_disconnects(engine: Engine, tmp_path: Path) -> None:
    """A real uvicorn server: the client sends a long what-if and hangs up; the ensembles stop."""
    import uvicorn

    from ingest.broker import free_port

    seed_overloaded_cluster(engine, jobs=400, nodes=4)
    viewer = api_headers(engine, "viewer")
    app = api_app(advisor_settings(tmp_path, forecast_workers=1), engine, FakeInUse(FakeModels()))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    records = _Records("what-if stopped")
    logger = logging.getLogger("finetwin.forecast")
    logger.addHandler(records)
    logger.setLevel(logging.INFO)
    thread.start()
    try:
        wait_for(lambda: tcp_listening(port), 30, "uvicorn to listen")
        body = json.dumps({"runs": 64, "horizon": None}).encode()  # 2 x 64 runs of 400 queued jobs
        request = (
            f"POST /v1/whatif HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"X-API-Key: {viewer['X-API-Key']}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        with socket.create_connection(("127.0.0.1", port)) as connection:
            connection.sendall(request)
        assert records.seen.wait(60), "the what-if did not stop when its client left"
        finished, total = (int(w) for w in records.messages[0].split() if w.isdigit())
        assert total == 128 and finished < total
    finally:
        logger.removeHandler(records)
        server.should_exit = True
        thread.join(timeout=30)


# --- unknown keys ----------------------------------------------------------------------------------------


def _key_lookups(engine: Engine) -> list[str]:
    """Every statement that reads the keys table, as it runs."""
    seen: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _count(conn, cursor, statement, *args):  # type: ignore[no-untyped-def]
        if "api_keys" in statement:
            seen.append(statement)

    return seen


def test_unknown_keys_are_remembered_and_limited_per_address(engine: Engine, tmp_path: Path) -> None:
    viewer = api_headers(engine, "viewer")
    lookups = _key_lookups(engine)
    # Verified keys are not cached here (TTL 0): each request of the viewer is looked up again.
    limits = {"auth_max_failures": 5, "auth_failure_window_seconds": 600, "auth_cache_seconds": 0}
    with _app(engine, tmp_path, **limits) as client:
        assert client.get("/v1/jobs", headers=viewer).status_code == 200
        same = {"X-API-Key": "ft_0123456789ab_not-a-key"}
        for _ in range(3):
            _refused(client.get("/v1/jobs", headers=same), 401, "invalid")
        assert len(lookups) == 2  # the valid key once, the same unknown key once
        for i in range(2):
            _refused(client.get("/v1/jobs", headers={"X-API-Key": f"ft_{i:012d}_guess"}), 401)
        assert len(lookups) == 4
        for i in range(20):  # five failures from this address: the next unknown keys cost nothing
            response = client.get("/v1/jobs", headers={"X-API-Key": f"ft_{i + 100:012d}_guess"})
            _refused(response, 429, "too many failed key checks")
            assert int(response.headers["Retry-After"]) > 0
        assert len(lookups) == 4
        # A key verified before keeps working from that address (someone else behind the same NAT) ...
        assert client.get("/v1/jobs", headers=viewer).status_code == 200
        assert len(lookups) == 5
        # ... but a valid key never seen from there waits like any other guess.
        _refused(client.get("/v1/jobs", headers=api_headers(engine, "viewer")), 429)


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("/v1/slos", "GET, HEAD, PUT"),  # a route per method: Starlette's Allow named the first only
        ("/v1/plan", "GET, HEAD, POST"),
        # POST /v1/recommendations/run, after GET /v1/recommendations/{id}: Allow said GET alone
        ("/v1/recommendations/run", "GET, HEAD, POST"),
        ("/v1/forecast", "GET, HEAD"),
        ("/v1/advise", "POST"),  # a HEAD, answered as a GET, is refused too
    ],
)
def test_a_method_a_path_does_not_take_is_405_naming_every_method_it_does(
    api: TestClient, path: str, allowed: str
) -> None:
    for method in ("DELETE", "PATCH", *(("HEAD",) if "HEAD" not in allowed else ())):
        response = api.request(method, path)
        assert response.status_code == 405, (method, response.text)
        assert response.headers["allow"] == allowed, method
        if method == "HEAD":
            assert response.content == b""
        else:
            assert response.json() == {"detail": "Method Not Allowed"}


def test_head_is_answered_as_get_without_the_body(api: TestClient, engine: Engine) -> None:
    """HEAD was a 405 on every route (FastAPI's routes take only the methods they declare): a load balancer's
    HEAD health check failed."""
    for path, headers in (("/healthz", {}), ("/v1/jobs", api_headers(engine, "viewer")), ("/", {})):
        got, head = api.get(path, headers=headers), api.head(path, headers=headers)
        assert got.status_code == head.status_code == 200, (path, head.status_code)
        assert got.content and head.content == b"", path
        assert head.headers["content-type"] == got.headers["content-type"], path
        assert head.headers["content-length"] == str(len(got.content)), path
    assert api.head("/v1/jobs").status_code == 401  # a HEAD needs the key a GET does
