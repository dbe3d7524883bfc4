"""`finetwin up --speed 600` in a fresh directory: within minutes the twin forecasts from the telemetry's
clock (arrivals, known jobs) and has scored its own forecasts against what then happened."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from finetwin.schema import migrate
from ingest.broker import free_port
from tests.conftest import api_headers, wait_for
from twin.db import make_engine

FINETWIN = str(Path(sys.executable).with_name("finetwin"))
# The bound: a replay at --speed 600 is forecast and scored within four minutes.
WITHIN_S = 240.0


def test_up_at_speed_600_forecasts_on_the_telemetry_clock_and_scores_itself(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    engine = make_engine(f"sqlite:///{data / 'finetwin.db'}")
    migrate(engine)
    headers = api_headers(engine, "viewer")  # a key of our own: up then prints none
    engine.dispose()
    env = {**os.environ, "FINETWIN_DATA_DIR": str(data), "FINETWIN_MODELS_DIR": str(tmp_path / "models")}
    for name in ("FINETWIN_DATABASE_URL", "FINETWIN_KAFKA_BOOTSTRAP", "FINETWIN_SCHEDULER_ENABLED"):
        env.pop(name, None)
    port = free_port()
    log_path = tmp_path / "up.log"
    with log_path.open("w") as log:
        up = subprocess.Popen(
            [FINETWIN, "up", "--speed", "600", "--port", str(port), "--quiet"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"

    def get(path: str) -> Any:
        if up.poll() is not None:
            pytest.fail(f"finetwin up exited ({up.returncode}):\n{log_path.read_text()[-3000:]}")
        try:
            response = httpx.get(base + path, headers=headers, timeout=30)
        except httpx.HTTPError:
            return None  # not listening yet
        return response.json() if response.status_code == 200 else None

    def scored() -> Any:
        skill = get("/v1/forecast/skill")
        figures = (skill or {}).get("figures", {})
        if all(figures.get(name, {}).get("n", 0) > 0 for name in ("utilization", "queue_length")):
            return skill
        return None

    try:
        skill = wait_for(scored, WITHIN_S, "a scored standing forecast (utilization and queue length)")
        assert skill["scored"] >= 1 and skill["clock"]["source"] == "telemetry"
        forecast = get("/v1/forecast")
        assert forecast is not None, log_path.read_text()[-3000:]
        assert forecast["clock"]["source"] == "telemetry"  # the replay's clock runs 600x the wall's
        assert forecast["arrivals_per_day"] > 0
        assert forecast["known_jobs"]["total"] > 0
        assert 0 < forecast["summary"]["utilization"]["mean"] <= 1
        view = get("/v1/forecast/vs-actual")
        assert view is not None and view["intervals_passed"] >= 1
        assert any(v is not None for v in view["figures"]["utilization"]["actual"])
        # The loop closes: steering has run on the replayed load, and either recommends something that
        # says which SLO it helps and by how much, or says why it recommends nothing.
        steering = wait_for(
            lambda: (s := get("/v1/recommendations/steering")) and s.get("ran") and s,
            WITHIN_S, "a steering run",
        )  # fmt: skip
        pending = get("/v1/recommendations?state=pending")["recommendations"]
        if steering["recommended"]:
            assert pending and all(r["effect"]["helps"]["attainment_change"] > 0 for r in pending)
            assert all(r["effect"]["helps"]["slo"] for r in pending)
        else:
            assert "candidates evaluated" in steering["why_none"], steering
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
