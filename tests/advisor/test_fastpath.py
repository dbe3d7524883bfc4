"""The fast path for repeated advice (advisor.fastpath): it answers only what the app answered before,
for the same bytes, models and a verified key; everything else reaches the app with its body intact."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from advisor.answer_cache import AnswerCache
from advisor.auth import Principal, Role, authorize
from advisor.fastpath import RepeatedAdviceFastPath
from finetwin.settings import Settings
from tests.advisor.fakes import FakeInUse, FakeModels
from tests.conftest import api_app

BODY = b'{"model_name": "llama3-8b", "gpu_model": "A100-SXM"}'
ANSWER = b'{"answer": 1}'


class Keys:
    """KeyCache.cached: (found, principal)."""

    def __init__(self, known: dict[str, Principal | None]) -> None:
        self.known = known

    def cached(self, key: str) -> tuple[bool, Principal | None]:
        return (key in self.known, self.known.get(key))


class Inner:
    """The app behind the middleware: records what reached it, including the body it could read."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"from the app"})


def _state(version: str | None = "v1") -> SimpleNamespace:
    cache = AnswerCache(16)
    cache.put(("v1", BODY), ANSWER)
    viewer = Principal(key_id="k", name="viewer", role=Role.VIEWER)
    return SimpleNamespace(  # what the middleware reads of the API's runtime (advisor.parts.ApiRuntime)
        answer_cache=cache,
        key_cache=Keys({"good": viewer, "bad": None}),
        models_in_use=SimpleNamespace(version_in_use=lambda: version),
    )


def _call(
    state: SimpleNamespace,
    body: bytes = BODY,
    key: str | None = "good",
    path: str = "/v1/advise",
    chunks: int = 1,
    authorization: str | None = None,
    content_type: str | None = "application/json",
) -> tuple[int, bytes, Inner]:
    inner = Inner()
    middleware = RepeatedAdviceFastPath(inner, state)
    headers = [(b"content-length", str(len(body)).encode())]
    if content_type is not None:
        headers.append((b"content-type", content_type.encode("latin-1")))
    if key is not None:
        headers.append((b"x-api-key", key.encode()))
    if authorization is not None:
        headers.append((b"authorization", authorization.encode()))
    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    step = max(1, len(body) // chunks)
    parts = [body[i : i + step] for i in range(0, len(body), step)] or [b""]
    messages = [
        {"type": "http.request", "body": part, "more_body": i < len(parts) - 1}
        for i, part in enumerate(parts)
    ]
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0)

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(middleware(scope, receive, send))
    status = sent[0]["status"]
    return status, b"".join(m.get("body", b"") for m in sent[1:]), inner


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"key": None, "authorization": "Bearer good"},
        {"key": None, "authorization": "bearer  good"},
        {"content_type": "Application/JSON; charset=utf-8"},  # what FastAPI reads as JSON too
        {"content_type": "application/merge-patch+json"},
    ],
)
def test_a_repeated_body_with_a_verified_key_is_answered_from_the_cache(kwargs: dict) -> None:
    status, content, inner = _call(_state(), chunks=3, **kwargs)
    assert (status, content, inner.bodies) == (200, ANSWER, [])


@pytest.mark.parametrize(
    ("case", "kwargs", "version"),
    [
        ("another body", {"body": BODY.replace(b"8b", b"70b")}, "v1"),
        ("the same request written differently", {"body": BODY.replace(b", ", b",")}, "v1"),
        ("a key the cache never verified", {"key": "unknown"}, "v1"),
        ("a key the cache knows is invalid", {"key": "bad"}, "v1"),
        ("no key", {"key": None}, "v1"),
        ("a key under another scheme", {"key": None, "authorization": "Basic good"}, "v1"),
        ("a bearer token the cache knows is invalid", {"key": None, "authorization": "Bearer bad"}, "v1"),
        ("another model version in use", {}, "v2"),
        ("no model in use", {}, None),
        ("another path", {"path": "/v1/predict"}, "v1"),
        # What the app does not read as JSON, and refuses (422): the same bytes sent before as JSON must not
        # make it a 200 here.
        ("a form's content type", {"content_type": "application/x-www-form-urlencoded"}, "v1"),
        ("text/plain", {"content_type": "text/plain"}, "v1"),
        ("no content type", {"content_type": None}, "v1"),
        ("a content type that does not parse", {"content_type": "json"}, "v1"),
    ],
)
def test_everything_else_reaches_the_app_with_its_body(case: str, kwargs: dict, version: str | None) -> None:
    body = kwargs.get("body", BODY)
    status, content, inner = _call(_state(version), chunks=2, **kwargs)
    assert (status, content) == (299, b"from the app"), case
    assert inner.bodies == [body], case  # nothing lost to the middleware's read


def _routed_app(settings: Settings, engine: Engine) -> tuple[FastAPI, list[str]]:
    """The app (with fake models in use), recording every request that reaches FastAPI's dependencies."""
    app = api_app(settings, engine, FakeInUse(FakeModels()))
    routed: list[str] = []

    async def counting(request: Request) -> Principal | None:
        routed.append(request.url.path)
        return await authorize(request, request.headers.get("X-API-Key"))

    app.dependency_overrides[authorize] = counting
    return app, routed


@pytest.fixture
def routed_client(engine: Engine, settings: Settings) -> Iterator[tuple[TestClient, list[str]]]:
    app, routed = _routed_app(settings, engine)
    with TestClient(app) as test_client:
        yield test_client, routed


def test_over_http_only_the_repeat_skips_the_app(
    routed_client: tuple[TestClient, list[str]], keys: dict
) -> None:
    test_client, routed = routed_client
    body = {
        "model_name": "llama3-8b", "method": "lora", "gpu_model": "A100-SXM", "number_gpus": 4,
        "batch_size": 8, "tokens_per_sample": 2048,
    }  # fmt: skip
    raw = json.dumps(body).encode()
    viewer = {**keys["viewer"], "Content-Type": "application/json"}
    first = test_client.post("/v1/advise", content=raw, headers=viewer)
    assert first.status_code == 200, first.text
    again = test_client.post("/v1/advise", content=raw, headers=viewer)
    assert again.content == first.content and routed == ["/v1/advise"]  # the repeat never reached FastAPI
    assert test_client.post("/v1/advise", content=raw).status_code == 401  # no key: still refused
    wrong = test_client.post("/v1/advise", content=raw, headers={**viewer, "X-API-Key": "ft_x_y"})
    assert wrong.status_code == 401
    reformatted = test_client.post("/v1/advise", content=json.dumps(body, indent=1).encode(), headers=viewer)
    assert reformatted.content == first.content and routed.count("/v1/advise") == 4


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain", None])
def test_bytes_answered_as_json_are_still_refused_when_sent_as_another_type(
    routed_client: tuple[TestClient, list[str]], keys: dict, content_type: str | None
) -> None:
    """`curl -d` (a form's type) got a 422 naming the type to send, then a 200 once anyone had sent the same
    bytes as JSON: the fast path answered from the cache without looking at the Content-Type."""
    test_client, _routed = routed_client
    body = {
        "model_name": "llama3-8b", "method": "lora", "gpu_model": "A100-SXM", "number_gpus": 4,
        "batch_size": 16, "tokens_per_sample": 4444,
    }  # fmt: skip
    raw = json.dumps(body).encode()
    sent_as = {**keys["viewer"], "Content-Type": content_type} if content_type else keys["viewer"]
    before = test_client.post("/v1/advise", content=raw, headers=sent_as)
    assert before.status_code == 422 and "Content-Type: application/json" in before.json()["detail"]
    as_json = test_client.post(
        "/v1/advise", content=raw, headers={**keys["viewer"], "Content-Type": "application/json"}
    )
    assert as_json.status_code == 200, as_json.text
    after = test_client.post("/v1/advise", content=raw, headers=sent_as)
    assert (after.status_code, after.json()) == (before.status_code, before.json())


def test_the_fast_path_can_be_turned_off(engine: Engine, settings: Settings, keys: dict) -> None:
    app, routed = _routed_app(settings.model_copy(update={"advice_fast_path": False}), engine)
    with TestClient(app) as test_client:
        body = {
            "model_name": "llama3-8b", "method": "lora", "gpu_model": "A100-SXM", "number_gpus": 4,
            "batch_size": 8, "tokens_per_sample": 2048,
        }  # fmt: skip
        answers = [test_client.post("/v1/advise", json=body, headers=keys["viewer"]) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 200] and answers[0].content == answers[1].content
    assert routed == ["/v1/advise", "/v1/advise"]  # both through FastAPI (the second from its cache)


def test_the_answer_cache_is_bounded_least_recently_used_first_out() -> None:
    cache = AnswerCache(2)
    cache.put(("v1", "a"), b"A")
    cache.put(("v1", "b"), b"B")
    assert cache.get(("v1", "a")) == b"A"  # used again: "b" is now the oldest
    cache.put(("v1", "c"), b"C")
    assert [cache.get(("v1", k)) for k in "abc"] == [b"A", None, b"C"]
    disabled = AnswerCache(0)
    disabled.put(("v1", "a"), b"A")
    assert disabled.get(("v1", "a")) is None
