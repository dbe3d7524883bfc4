"""Reading a request body ahead of the app and handing it on: the request guard (size limit) and the advice
fast path (cached answers) both look at the body before FastAPI does, and the app must still receive it;
and whether the app reads a body as JSON at all (`read_as_json`), which whoever answers ahead of it must
respect too."""

from __future__ import annotations

import email.message
from functools import lru_cache

from starlette.types import Message, Receive


@lru_cache(maxsize=64)
def read_as_json(content_type: str | None) -> bool:
    """Whether FastAPI reads a body sent with this Content-Type as JSON: `application/json` or
    `application/*+json`, with any parameters, in any case; not without a Content-Type (FastAPI's strict
    content type, on by default). The same parsing as FastAPI's (`email.message`), so that an answer given
    ahead of the app (`advisor.fastpath`) refuses what the app refuses. Cached: a client sends the same few
    values again and again."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


async def read_body(receive: Receive, limit: int) -> tuple[list[Message], int]:
    """The request's messages until the body ends, the client leaves, or more than `limit` bytes came; and
    the body bytes read."""
    messages: list[Message] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, size
        size += len(message.get("body", b""))
        if not message.get("more_body", False) or size > limit:
            return messages, size


def replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that hands the app the messages already read, then the client's (its disconnect)."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
