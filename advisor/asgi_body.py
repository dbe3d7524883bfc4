"""Reading a request body ahead of the app and handing it on: the request guard (size limit) and the advice
fast path (cached answers) both look at the body before FastAPI does, and the app must still receive it."""

from __future__ import annotations

from starlette.types import Message, Receive


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
