"""Repeated advice answered before FastAPI: an ASGI middleware in front of the app.

A `POST /v1/advise` whose exact body was answered before under the model version in use, sent with a key
the key cache verified within its TTL, is answered here from `advisor.answer_cache`, skipping routing,
validation and dependency solving (which cost most of a cached answer's time). Anything else, including
every first request, every key the cache does not hold, every invalid key and every body the app would not
read as JSON (its Content-Type), goes to the app unchanged, with the body it sent, so the app's checks and
messages apply as they always do.
"""

from __future__ import annotations

from fastapi.security.utils import get_authorization_scheme_param
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from advisor.answer_cache import MAX_RAW_KEY_BYTES, version_in_use
from advisor.asgi_body import read_as_json, read_body, replay
from advisor.auth import API_KEY_HEADER, Role
from advisor.parts import ApiRuntime

ADVISE_PATH = "/v1/advise"
_KEY_HEADER = API_KEY_HEADER.lower().encode("latin-1")


class RepeatedAdviceFastPath:
    def __init__(self, app: ASGIApp, runtime: ApiRuntime) -> None:
        self.app = app
        self.runtime = runtime  # the API's answer cache, key cache and models in use

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != ADVISE_PATH:
            await self.app(scope, receive, send)
            return
        answer, body = await self._cached_answer(scope, receive)
        if answer is not None:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(answer)).encode("ascii")),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": answer})
            return
        await self.app(scope, replay(body, receive) if body is not None else receive, send)

    async def _cached_answer(
        self, scope: Scope, receive: Receive
    ) -> tuple[bytes | None, list[Message] | None]:
        """(the cached answer or None, the request messages read so far or None when none were read)."""
        runtime = self.runtime
        cache, key_cache, models = runtime.answer_cache, runtime.key_cache, runtime.models_in_use
        key = _header(scope, _KEY_HEADER) or _bearer_token(_header(scope, b"authorization"))
        length = _header(scope, b"content-length")
        if not key or not length or not length.isdigit() or int(length) > MAX_RAW_KEY_BYTES:
            return None, None
        if not read_as_json(_text(_header(scope, b"content-type"))):
            # The app refuses a body it does not read as JSON (422, naming the type to send): the same bytes
            # answered before as JSON must not make it 200 here.
            return None, None
        found, principal = key_cache.cached(key.decode("latin-1"))
        if not found or principal is None or not principal.role.allows(Role.VIEWER):
            return None, None  # unknown, expired or invalid: the app checks it and says why
        messages, _ = await read_body(receive, int(length))
        if messages[-1]["type"] != "http.request" or messages[-1].get("more_body", False):
            return None, messages  # disconnected or longer than announced: the app deals with it
        version = version_in_use(models)
        if version is None:
            return None, messages
        body = b"".join(m.get("body", b"") for m in messages)
        return cache.get((version, body)), messages


def _header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of a header, as Starlette's `Headers.get` reads it (names arrive lower-cased)."""
    for header, value in scope["headers"]:
        if header == name:
            return value
    return None


def _text(value: bytes | None) -> str | None:
    """A header's value as Starlette decodes it (latin-1)."""
    return value.decode("latin-1") if value is not None else None


def _bearer_token(authorization: bytes | None) -> bytes | None:
    """The token of `Authorization: Bearer <token>`, read by the function FastAPI's HTTPBearer reads it with
    (headers arrive as latin-1 bytes, as Starlette decodes them)."""
    if authorization is None:
        return None
    scheme, token = get_authorization_scheme_param(authorization.decode("latin-1"))
    return token.encode("latin-1") if scheme.lower() == "bearer" and token else None
