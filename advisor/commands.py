"""`finetwin api`: serve the HTTP API and dashboard."""

from __future__ import annotations

import argparse

from twin.settings import Settings


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    api = subparsers.add_parser("api", help="serve the HTTP API and dashboard")
    api.add_argument("--host", default=None, help="address to bind (default FINETWIN_API_HOST or 127.0.0.1)")
    api.add_argument("--port", type=int, default=None, help="port (default FINETWIN_API_PORT or 8080)")
    api.set_defaults(handler=run_api)


def run_api(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from advisor.app import create_app

    app = create_app(settings)
    uvicorn.run(
        app, host=args.host or settings.api_host, port=args.port or settings.api_port, log_level="info"
    )
    return 0
