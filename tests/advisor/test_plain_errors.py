"""A 422 says what to change in plain words, not pydantic's, on SQLite and PostgreSQL (advisor.plain_errors).

Each case below answered in pydantic's words before: "Input should be a valid dictionary or object to extract
fields from" (a body that is null, a list, or sent without a Content-Type), "JSON decode error" at `body.17`,
`body.interval.constrained-str` and `body.interval.float` (a union's internal branch names), "at least 1 item
after validation" (of a string too), and "did you mean 'fast_kernels'?" for `dataset_tokens` on /v1/predict.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

A100 = "NVIDIA-A100-SXM4-80GB"
CONFIG = {
    "model_name": "llama3-8b", "method": "lora", "gpu_model": A100, "number_gpus": 4, "number_nodes": 1,
    "batch_size": 8, "tokens_per_sample": 1024,
}  # fmt: skip
JSON = {"Content-Type": "application/json"}
PYDANTIC_WORDS = ("dictionary", "decode error", "constrained-str", "after validation", "Input should be")


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    """One store: every message here is said while the request is validated, before a store is read (on both
    stores these cases took 30 s of the suite)."""
    return sqlite_url


def refused(client: TestClient, keys: dict, path: str, **request: Any) -> dict:
    headers = keys["operator"] | request.pop("headers", {})
    response = client.post(path, headers=headers, **request)
    assert response.status_code == 422, response.text
    body = response.json()
    assert not any(word in response.text for word in PYDANTIC_WORDS), body
    assert all(set(e) == {"loc", "msg", "type"} for e in body["errors"]), body  # the shape is kept
    return body


@pytest.mark.parametrize(
    ("content", "what"),
    [(b"null", "null"), (b'[{"batch_size": 8}]', "a list"), (b'"llama3-8b"', "the string 'llama3-8b'")],
)
def test_a_body_that_is_not_an_object_says_so(
    client: TestClient, keys: dict, content: bytes, what: str
) -> None:
    body = refused(client, keys, "/v1/advise", content=content, headers=JSON)
    assert (
        body["detail"] == f'body: should be a JSON object of the fields ({{"name": value, ...}}), not {what}'
    )
    assert body["errors"][0]["loc"] == ["body"]


@pytest.mark.parametrize("path", ["/v1/advise", "/v1/predict"])
def test_a_body_sent_without_a_content_type_says_which_to_send(
    client: TestClient, keys: dict, path: str
) -> None:
    """FastAPI reads a body without a Content-Type as bytes (strict content type), and the detail did not
    say why an object that was one was "not a valid dictionary"."""
    body = refused(client, keys, path, content=json.dumps(CONFIG).encode())
    assert body["detail"] == (
        "the body must be JSON, sent with Content-Type: application/json; this request has none "
        "(add -H 'Content-Type: application/json')"
    )


def test_an_empty_body_asks_for_an_object(client: TestClient, keys: dict) -> None:
    body = refused(client, keys, "/v1/advise", content=b"", headers=JSON)
    assert (
        body["detail"] == "body: empty: send a JSON object of the fields, with Content-Type: application/json"
    )


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b'{"batch_size": 8,', "Expecting property name enclosed in double quotes at line 1, column 18 "
         "(character 17); the body ends there: was it cut short?"),
        (b'{\n  "batch_size": 8\n  "method": "lora"}',
         "Expecting ',' delimiter at line 3, column 3 (character 22)"),
    ],
)  # fmt: skip
def test_json_that_does_not_parse_says_where_by_line_and_column(
    client: TestClient, keys: dict, content: bytes, expected: str
) -> None:
    body = refused(client, keys, "/v1/advise", content=content, headers=JSON)
    assert body["detail"] == f"body: not valid JSON: {expected}"
    assert body["errors"] == [{"loc": ["body"], "msg": f"not valid JSON: {expected}", "type": "json_invalid"}]


@pytest.mark.parametrize("path", ["/v1/whatif", "/v1/plan"])
@pytest.mark.parametrize(
    ("interval", "msg", "kind"),
    [
        ("", "is empty", "string_too_short"),
        ("x" * 33, "String should have at most 32 characters", "string_too_long"),
        (True, "should be a valid string or a valid number, not true", "union_type"),
        ([1], "should be a valid string or a valid number, not a list", "union_type"),
    ],
)
def test_a_bad_duration_is_one_error_at_its_field(
    client: TestClient, keys: dict, path: str, interval: object, msg: str, kind: str
) -> None:
    """A duration is a string or a number of seconds: pydantic reported one error per branch, named by
    its internal names (`body.interval.constrained-str`, `body.interval.float`)."""
    body = refused(client, keys, path, json={"vary": [f"{A100}=1..2"], "interval": interval})
    errors = [e for e in body["errors"] if e["loc"][:2] == ["body", "interval"]]
    assert errors == [{"loc": ["body", "interval"], "msg": msg, "type": kind}], body


@pytest.mark.parametrize(
    ("path", "sent", "expected"),
    [
        ("/v1/advise", CONFIG | {"model_name": ""}, "body.model_name: is empty"),
        ("/v1/predict", {"configs": []}, "body.configs: is empty: give at least 1 item"),
        ("/v1/plan", {"vary": []}, "body.vary: is empty: give at least 1 item"),
    ],
)
def test_an_empty_string_or_list_is_said_to_be_empty(
    client: TestClient, keys: dict, path: str, sent: dict, expected: str
) -> None:
    assert refused(client, keys, path, json=sent)["detail"] == expected


@pytest.mark.parametrize(
    "body", [{"configs": [CONFIG | {"dataset_tokens": 1e9}]}, CONFIG | {"dataset_tokens": 1e9}]
)
def test_dataset_tokens_on_predict_says_where_it_belongs(client: TestClient, keys: dict, body: dict) -> None:
    """Its closest key by spelling was `fast_kernels`, which it has nothing to do with."""
    detail = refused(client, keys, "/v1/predict", json=body)["detail"]
    assert detail == (
        "body.configs.0.dataset_tokens: not a field of a configuration: dataset_tokens is a job's work (the "
        "tokens it processes), which POST /v1/advise takes beside a configuration; leave it out here"
    )
    # Where it is a field, it is taken (a 409 here: no models are in use).
    assert (
        client.post("/v1/advise", json=CONFIG | {"dataset_tokens": 1e9}, headers=keys["viewer"]).status_code
        == 409
    )


@pytest.mark.parametrize(("query", "name", "value"), [("/v1/jobs?limit=1.5", "limit", "1.5")])
def test_a_number_that_does_not_parse_says_what_it_should_be(
    client: TestClient, keys: dict, query: str, name: str, value: str
) -> None:
    response = client.get(query, headers=keys["viewer"])
    assert response.status_code == 422
    assert response.json()["detail"] == f"query.{name}: should be a whole number, not {value!r}"
