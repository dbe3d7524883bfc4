"""The API's port, taken before anything else starts (`finetwin up`, `finetwin api`): a port another
program holds is said within a second, before a store is migrated or a broker started, and the socket is
handed to uvicorn, so that nothing can take the port in between."""

from __future__ import annotations

import socket

from finetwin import output
from finetwin.errors import CommandError


def reserve_port(host: str, port: int, *, asked: bool) -> socket.socket:
    """A listening socket on host:port, handed to uvicorn later. A port that was asked for (--port or
    FINETWIN_API_PORT) and is taken is an error naming a free one; the default port, when taken, is
    replaced by a free one (the banner says which)."""
    try:
        return _listen(host, port)
    except OSError as exc:
        taken = exc
    spare = _listen(host, 0)
    free = spare.getsockname()[1]
    if asked:
        spare.close()
        raise CommandError(
            f"cannot serve the API on {host}:{port}: {taken.strerror or taken} (another finetwin, or "
            f"another program, has it); choose another port with --port, e.g. --port {free}"
        )
    output.say(
        f"port {port} on {host} is taken: serving on port {free} instead (--port chooses)", stderr=True
    )
    return spare


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is no conflict
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def listener_url(listener: socket.socket) -> str:
    """The http URL of a listening socket (an IPv6 address in brackets)."""
    host, port = listener.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
