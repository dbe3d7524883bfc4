"""`ingest.broker.port_open`, which fixtures and benches wait on before they talk to a server they started:
it says open only when something listens, even when the probe meets itself."""

from __future__ import annotations

import socket

from ingest.broker import free_port, port_open, reaches_a_listener


def test_a_connection_that_meets_itself_reaches_no_listener() -> None:
    """TCP simultaneous open: a socket whose source port is the port it dials connects to itself."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        own = probe.getsockname()
        assert not reaches_a_listener(probe, own)
        assert probe.getpeername() == own  # it did connect: to itself, which the check tells apart


def test_a_listener_is_reached_and_a_closed_port_is_not() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert port_open(port)
    assert not port_open(free_port())
