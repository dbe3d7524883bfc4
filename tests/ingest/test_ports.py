"""`ingest.broker.port_open`, which fixtures and benches wait on before they talk to a server they started:
it says open only when something listens, even when the probe meets itself; and `free_port`, which picks
the ports those servers are started on."""

from __future__ import annotations

import socket

import pytest

from ingest import broker
from ingest.broker import ephemeral_range_start, free_port, port_open, reaches_a_listener


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


def test_free_ports_lie_below_the_range_outgoing_connections_take_their_source_ports_from() -> None:
    """A port there cannot be taken by a connection's source port between the pick and the bind."""
    first = free_port(3)
    assert first + 3 <= ephemeral_range_start()
    for port in range(first, first + 3):  # each of them free: a listener binds it
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.bind(("127.0.0.1", port))


def test_a_block_with_one_port_taken_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        free = free_port(2)
        picks = iter([taken - 1, free])  # the first block's second port is held

        class Scripted:
            def randrange(self, start: int, stop: int) -> int:
                return next(picks)

        monkeypatch.setattr(broker.random, "Random", Scripted)
        monkeypatch.setattr(broker, "_PICK_FROM", 1)
        monkeypatch.setattr(broker, "ephemeral_range_start", lambda: 65_536)
        assert free_port(2) == free


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_a_port_held_on_either_family_is_not_free_and_another_is(host: str) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        server = socket.socket(family, socket.SOCK_STREAM)
        server.bind((host, 0))
    except OSError:
        pytest.skip(f"no {host} on this machine")
    with server:
        server.listen()
        held = server.getsockname()[1]
        assert not broker.bindable(held, host)
    assert broker.bindable(free_port(), host)


def test_a_host_that_is_not_this_machines_is_left_to_the_server_to_say() -> None:
    assert broker.bindable(free_port(), "192.0.2.1")  # TEST-NET-1: not an address of this machine
