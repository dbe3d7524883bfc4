"""`finetwin api` (serve the HTTP API and dashboard) and `finetwin relay` (publish approved actions from
the outbox to Kafka)."""

from __future__ import annotations

import logging
import threading
from typing import Annotated

import typer

from finetwin.commands import add_command
from finetwin.commands.options import Bootstrap
from finetwin.commands.ports import listener_url, reserve_port
from finetwin.errors import CommandError
from finetwin.settings import Settings
from finetwin.signals import stop_on_signals

log = logging.getLogger("finetwin.relay")
api_log = logging.getLogger("finetwin.api")


def register(app: typer.Typer) -> None:
    add_command(app, api, "api", help="serve the HTTP API and dashboard")
    add_command(app, relay, "relay", help="publish approved actions from the outbox to Kafka")


def api(
    ctx: typer.Context,
    host: Annotated[
        str | None, typer.Option(help="address to bind (default FINETWIN_API_HOST or 127.0.0.1)")
    ] = None,
    # Bounded: uvicorn said it was "running on http://127.0.0.1:70000".
    port: Annotated[
        int | None, typer.Option(min=1, max=65_535, help="port (default FINETWIN_API_PORT or 8080)")
    ] = None,
    access_log: Annotated[
        bool,
        typer.Option(
            "--access-log",
            help="log every request (off by default: it costs ~15% of the requests per second)",
        ),
    ] = False,
    forwarded_allow_ips: Annotated[
        str | None,
        typer.Option(
            help="behind a reverse proxy: its addresses (comma-separated, or *), whose X-Forwarded-For is "
            "believed, so each client has its own failed-key budget (default FINETWIN_FORWARDED_ALLOW_IPS, "
            "else 127.0.0.1)"
        ),
    ] = None,
) -> int:
    settings: Settings = ctx.obj
    host, port = host or settings.api_host, port or settings.api_port
    # The port first: taken, it is said before the store is migrated and the schedulers start (uvicorn
    # said it only after them, as a log line, with its own exit status 3). A server's port is never
    # replaced by another one, as `finetwin up`'s default is: its clients know the one it was given.
    listener = reserve_port(host, port, asked=True)
    try:
        import uvicorn

        from finetwin.wiring import api_app, api_parts, migrated_engine

        app = api_app(api_parts(settings, migrated_engine(settings)))
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="info",
            access_log=access_log,
            proxy_headers=True,
            # None: uvicorn's own default (its FORWARDED_ALLOW_IPS variable, else 127.0.0.1).
            forwarded_allow_ips=forwarded_allow_ips or settings.forwarded_allow_ips,
        )
        # uvicorn names the address only where it opens the socket itself.
        api_log.info("serving the API and dashboard on %s (Ctrl-C stops it)", listener_url(listener))
        uvicorn.Server(config).run(sockets=[listener])
    finally:
        listener.close()
    return 0


def relay(
    ctx: typer.Context,
    bootstrap: Bootstrap = None,
    once: Annotated[bool, typer.Option("--once", help="one round, then exit")] = False,
) -> int:
    from advisor.outbox import RelayThread, relay_round
    from finetwin.wiring import kafka_bootstrap, migrated_engine, outbox_relay

    settings: Settings = ctx.obj
    brokers = kafka_bootstrap(bootstrap, settings)  # the Kafka that carries finetwin.actions
    engine = migrated_engine(settings)
    outbox = outbox_relay(engine, brokers)
    if once:
        try:
            sent = relay_round(outbox)
        finally:
            outbox.close()
        if sent is None:
            raise CommandError("another relay holds the outbox lock")
        if sent:
            log.info("published %d action(s)", sent)
        return 0
    # The same loop as the API's relay (woken now, then every poll interval; a failed round is logged and
    # retried), in a thread while this one waits for SIGTERM / Ctrl-C.
    stop = threading.Event()
    thread = RelayThread(outbox, poll_s=settings.relay_poll_seconds).start()
    thread.wake()
    with stop_on_signals(stop):
        stop.wait()
    thread.stop()
    return 0
