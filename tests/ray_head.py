"""A real Ray head on loopback, started as a subprocess and stopped by its process group.

Never `ray stop`: it kills every Ray process on the machine, other developers' and CI's included.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ingest.broker import free_port, port_open

# What `ray start` prints once the head node (GCS and raylet) is up.
RUNTIME_STARTED = b"Ray runtime started"


class RayHeadUnavailable(RuntimeError):
    pass


class RayHead:
    def __init__(self, cpus: int = 2) -> None:
        self.cpus = cpus
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        # Short path: Ray's Unix sockets live under it and a socket path may not exceed 107 bytes.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
        self.process: subprocess.Popen[bytes] | None = None
        self.log = self.temp_dir / "head.log"

    def start(self, timeout_s: float = 60.0) -> RayHead:
        ray_cli = Path(sys.executable).with_name("ray")
        if not ray_cli.exists():
            raise RayHeadUnavailable(f"no ray command next to {sys.executable} (install finetwin[ray])")
        command = [
            str(ray_cli), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
            "--port", str(self.port), "--num-cpus", str(self.cpus), "--include-dashboard=false",
            "--disable-usage-stats", "--temp-dir", str(self.temp_dir),
            # Every other port on loopback too, chosen free, so parallel sessions do not collide.
            "--node-manager-port", str(free_port()), "--object-manager-port", str(free_port()),
            "--dashboard-port", str(free_port()), "--dashboard-agent-listen-port", str(free_port()),
            "--min-worker-port", "0", "--max-worker-port", "0",
            # A small object store: the tests' shared inputs are kilobytes, and the machine is shared.
            "--object-store-memory", str(200 * 2**20),
        ]  # fmt: skip
        env = os.environ | {"RAY_USAGE_STATS_ENABLED": "0"}
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        # Up when the head says so, not when its GCS port opens (~1.5 s earlier): a driver connecting in
        # between waits for the node's raylet with a timeout of its own, which a loaded machine outlasted
        # ("No node info found matching attributes" in a CI run).
        while not (port_open(self.port, "127.0.0.1") and RUNTIME_STARTED in self.log.read_bytes()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-2000:]
                self.stop()
                raise RayHeadUnavailable(f"the Ray head did not start on {self.address}:\n{tail}")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        """SIGTERM to the head's process group (the head, GCS, raylet, workers), SIGKILL if it lingers."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=3)  # `ray start --block` lingers on SIGTERM
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=5)
            self.process = None
        shutil.rmtree(self.temp_dir, ignore_errors=True)
