"""Checks every request passes before anything else reads it: an ASGI middleware, outermost.

- A body larger than `FINETWIN_MAX_BODY_BYTES` is a 413 before it is parsed: by its Content-Length at once,
  or, when it is sent without one (chunked), as soon as more than the limit has arrived. The body is read
  here (at most the limit) and handed on, so nothing behind (the advice fast path, FastAPI) reads more.
- A NUL character in the path, the query or a JSON body is a 422: PostgreSQL cannot store one in a text
  column (psycopg raises, which was a 500), and no finetwin identifier or text has a use for it.
- A body that is not UTF-8 is a 400 that names its first bad byte.
- A `/v1` request from an address that failed too many key checks lately, with a key not verified before,
  is a 429 here, before routing (`advisor.auth.FailureLimiter`): a flood of guessed keys costs each request
  as little as it can.

Answers have the shape of every other error (`advisor.errors.ErrorOut`).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any
from urllib.parse import unquote_to_bytes

from starlette.types import ASGIApp, Receive, Scope, Send

from advisor.asgi_body import read_body, replay
from advisor.auth import API_KEY_HEADER, V1_PREFIX, too_many_failures

# In JSON a NUL inside a string is the escape \u0000 (the raw byte is not valid JSON at all); it is one when
# an even number of backslashes (escaped backslashes) comes before it.
_JSON_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
_KEY_HEADER = API_KEY_HEADER.lower().encode("latin-1")


class RequestGuard:
    def __init__(self, app: ASGIApp, max_body_bytes: int, state: Any = None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.state = state  # the API's runtime (advisor.parts.ApiRuntime): its key cache and failure limiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        where = _nul_in_target(scope)
        if where is not None:
            await _error(send, 422, f"the {where} contains a NUL character", where, "nul_character")
            return
        wait_s = self._failed_too_often(scope)
        if wait_s is not None:
            address = scope["client"][0] if scope.get("client") else "unknown"
            retry = str(math.ceil(wait_s))
            await _error(send, 429, too_many_failures(address, wait_s), "header", "too_many_failures", retry)
            return
        length = _content_length(scope)
        if length is not None and length > self.max_body_bytes:
            await _too_large(send, self.max_body_bytes)
            return
        if length == 0 or (length is None and not _has_header(scope, b"transfer-encoding")):
            await self.app(scope, receive, send)  # no body to check
            return
        messages, size = await read_body(receive, self.max_body_bytes)
        if size > self.max_body_bytes:
            await _too_large(send, self.max_body_bytes)
            return
        body = b"".join(m.get("body", b"") for m in messages)
        if b"\x00" in body or _JSON_NUL.search(body):
            await _error(send, 422, "the request body contains a NUL character", "body", "nul_character")
            return
        not_utf8 = _not_utf8(body)
        if not_utf8 is not None:
            await _error(send, 400, not_utf8, "body", "not_utf8")
            return
        await self.app(scope, replay(messages, receive), send)

    def _failed_too_often(self, scope: Scope) -> float | None:
        """Seconds the client must wait, when its address is over its failed-key budget and the key is not
        one verified before; None otherwise (the app checks the key as always)."""
        limiter = getattr(self.state, "auth_failures", None)
        cache = getattr(self.state, "key_cache", None)
        if limiter is None or cache is None or not scope["path"].startswith(V1_PREFIX):
            return None
        key = next((v for k, v in scope["headers"] if k == _KEY_HEADER), None)
        if not key:
            return None  # no key: a 401 that costs nothing
        address = scope["client"][0] if scope.get("client") else "unknown"
        wait_s = limiter.retry_after(address)
        if wait_s is None or cache.verified_before(key.decode("latin-1")):
            return None
        return wait_s


def _not_utf8(body: bytes) -> str | None:
    """What is wrong with a body that is not UTF-8, None when it is. Every body this API reads is JSON, which
    is UTF-8 (RFC 8259): a Latin-1 byte was a 400 that said only "There was an error parsing the body", and
    a UTF-16 body a 422 "JSON decode error" at `body.0`."""
    if body.isascii():
        return None
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (
            f"the request body is not UTF-8: byte 0x{body[exc.start]:02x} at offset {exc.start} "
            "(JSON must be sent as UTF-8)"
        )
    return None


def _nul_in_target(scope: Scope) -> str | None:
    if "\x00" in scope.get("path", ""):
        return "path"
    if b"\x00" in unquote_to_bytes(scope.get("query_string", b"")):
        return "query"
    return None


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def _has_header(scope: Scope, wanted: bytes) -> bool:
    return any(name == wanted for name, _ in scope["headers"])


async def _too_large(send: Send, limit: int) -> None:
    detail = f"the request body is larger than {limit} bytes (FINETWIN_MAX_BODY_BYTES)"
    await _error(send, 413, detail, "body", "body_too_large")


async def _error(
    send: Send, status: int, detail: str, where: str, kind: str, retry_after: str | None = None
) -> None:
    body = json.dumps({"detail": detail, "errors": [{"loc": [where], "msg": detail, "type": kind}]}).encode(
        "utf-8"
    )
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after is not None:
        headers.append((b"retry-after", retry_after.encode("ascii")))
    if status == 413:
        headers.append((b"connection", b"close"))  # the rest of the body is not read
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
