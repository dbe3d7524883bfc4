"""HEAD answered as GET without its body (RFC 9110, 9.3.2: every general-purpose server supports GET and
HEAD). FastAPI's routes take only the methods they declare, so `curl -I /healthz` and a load balancer's
HEAD health check were answered 405."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HeadAsGet:
    """ASGI middleware: a HEAD request goes to the app as GET, and only the answer's status and headers (its
    Content-Length among them, as GET would send) go back."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] != "http.response.body":
                await send(message)
            elif not message.get("more_body", False):  # the body's parts are dropped; its end is sent
                await send({"type": "http.response.body", "body": b"", "more_body": False})

        await self.app({**scope, "method": "GET"}, receive, headers_only)
