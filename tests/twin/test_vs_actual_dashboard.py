"""The dashboard's forecast-against-what-happened charts, drawn in headless Chromium against a real API
process: a stored forecast's band with the store's actuals over it, and the forecast's age on the
telemetry's clock."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from finetwin.schema import migrate
from ingest.broker import free_port
from tests.conftest import api_headers, tcp_listening, wait_for
from tests.twin.test_clock import add_events
from tests.twin.test_skill import T0, document, store_history
from twin.db import make_engine
from twin.forecast_store import save_forecast
from twin.skill import score_due

pytestmark = [pytest.mark.browser, pytest.mark.integration]
FINETWIN = str(Path(sys.executable).with_name("finetwin"))
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


def test_forecast_against_actuals_is_drawn_with_its_age(chromium_path: Path, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = make_engine(url)
    migrate(engine)
    store_history(engine)
    now = T0 + timedelta(minutes=90)
    add_events(engine, [T0, now])  # the telemetry's clock stands at T0 + 90 min
    # Made before any model was calibrated, as a fresh `up`'s first forecasts are: the panel says so.
    wait_slo = {"name": "p95 wait ≤ 30 min", "metric": "wait_p95_s", "max": 1800.0, "probability_met": 0.5,
                "value": {"mean": 1500.0, "p10": 600.0, "p90": 2400.0},
                "attainment": {"mean": 0.4, "p10": 0.0, "p90": 1.0}}  # fmt: skip
    doc = document() | {"runs": 4, "models": "fallback", "slos": [wait_slo]}
    held = {"mean": [0.9, 0.5], "p10": [0.0, 0.0], "p90": [1.0, 1.0]}  # the share of runs it held in
    doc["series"]["slo_attainment"] = {wait_slo["name"]: held}  # type: ignore[index]
    save_forecast(engine, doc, cluster_id="default")
    score_due(engine, "default", now)
    key = api_headers(engine, "viewer")["X-API-Key"]
    engine.dispose()
    port = free_port()
    env = {**os.environ, "FINETWIN_DATABASE_URL": url, "FINETWIN_SCHEDULER_ENABLED": "false",
           "FINETWIN_DATA_DIR": str(tmp_path / "data"), "FINETWIN_FORECAST_RUNS": "2"}  # fmt: skip
    with (tmp_path / "api.log").open("wb") as log:
        api = subprocess.Popen([FINETWIN, "api", "--port", str(port)], env=env, stdout=log, stderr=log)
    try:
        wait_for(lambda: tcp_listening(port) or api.poll() is not None, 60, "the API to listen")
        assert api.poll() is None, (tmp_path / "api.log").read_text()
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(chromium_path), headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1600})
                page.goto(f"http://127.0.0.1:{port}/")
                page.fill("#key-input", key)
                page.click("#key-form button[type=submit]")
                names = ["vs-utilization", "vs-queue_length", "vs-running_jobs", "vs-jobs_completed",
                         "vs-jobs_failed", "vs-energy_kwh"]  # fmt: skip
                # A predicate as a function: a string would be eval'd in the page, which its CSP forbids.
                page.wait_for_function(
                    "(names) => names.every(n => window.finetwinCharts[n])", arg=names, timeout=60_000
                )
                drawn = page.evaluate(
                    """(names) => Object.fromEntries(names.map((name) => {
                        const chart = window.finetwinCharts[name];
                        const c = chart.canvas;
                        const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                        let red = 0;  // the actual's dots: rgb(207, 34, 46)
                        for (let i = 0; i < px.length; i += 4)
                            if (px[i] > 180 && px[i + 1] < 80 && px[i + 2] < 90 && px[i + 3] > 200) red++;
                        return [name, {actual: chart.data.datasets[3].data, mean: chart.data.datasets[2].data,
                                       red}];
                    }))""",
                    names,
                )
                # What happened in the one interval that has passed (hand-computed in test_skill), in
                # percent for utilization; the interval still ahead has no actual yet.
                assert drawn["vs-utilization"]["actual"] == [25.0, None]
                assert drawn["vs-utilization"]["mean"] == [50.0, 50.0]
                assert drawn["vs-queue_length"]["actual"] == [0.75, None]
                assert drawn["vs-running_jobs"]["actual"] == [0.5, None]
                for name in names:
                    assert drawn[name]["red"] > 10, (name, drawn[name])  # the dot is on the canvas
                # The standing forecast's header is another panel's, filled by its own request: the charts
                # above may be drawn before it answers (its header then read empty). Every panel has
                # answered, and the status line speaks, once the page marks the end of the load.
                page.wait_for_function("() => document.body.dataset.loaded !== undefined", timeout=60_000)
                # The standing forecast's header says which clock its age is on, as this panel does: a
                # replay at 600x makes seconds of wall time an hour of telemetry.
                forecast_meta = page.text_content("#forecast-meta") or ""
                assert re.search(
                    r"made 90 min ago on the telemetry's clock, \d+ s ago on the wall clock$", forecast_meta
                ), forecast_meta
                meta = page.text_content("#vs-meta") or ""
                assert "90 min old on the telemetry's clock" in meta and "1 of 2 intervals" in meta
                assert "made before any model was calibrated (rough fallback numbers, no runtime" in meta
                # Forecast 50 %, actual 25 %: an error of 100 % of the actual (tests.twin.test_skill).
                skill_line = page.text_content("#vs-skill") or ""
                # Persistence forecast the hour before, 29/60: missed by 0.233 where the twin missed by 0.25.
                expected = (
                    "utilization 0 % inside p10-p90, error 100 % of actual, 7 % more error than persistence"
                )
                assert f"{expected} (n 1)" in skill_line, skill_line
                # Said to hold with a chance of 0.9 in the first hour, it held: Brier 0.1², and persistence
                # (held the hour before too) made no error, so nothing is said against it.
                assert page.text_content("#slo-skill") == (
                    "The forecasts' SLOs against what happened: p95 wait ≤ 30 min: forecast to hold in 90 % "
                    "of 1 intervals, held in 100 %, Brier 0.01 (always 100 %, known in hindsight: 0.00)"
                )
                # The forecast's SLO beside its first hour (tests.twin.test_skill): A waited 30 min, B 15 so
                # far: held.
                assert page.text_content("#vs-slos") == (
                    "This forecast's SLO attainment: p95 wait ≤ 30 min: forecast 40 % (0-100 %), so far "
                    "100 % of 1 intervals"
                )
                # The SLOs in force (the defaults), judged on the record's last day, hours ending at T0 + 90
                # min (tests.twin.test_skill.store_history). The telemetry began at T0: the hours before
                # the one that holds it have no data ("old" held all 8 GPUs in one of them). Waits: "before"
                # 10 min (hour -0:30), A 30 and B 15 min (+0:30), each within 30 min. Ends: "before" and A,
                # none failed. Utilization: 48 % ("before", 29 min of 8 GPUs) and 62.5 % (A's 4 GPUs, B's 2
                # for half the hour), neither 70 %.
                slo_line = page.text_content("#slo-actual") or ""
                assert slo_line == (
                    "SLOs as they happened, the last 24 h of telemetry: p95 wait ≤ 30 min: met in 2 of 2 "
                    "intervals (100 %); runtime failures ≤ 10 %: met in 2 of 2 intervals (100 %); "
                    "utilization ≥ 70 %: met in 0 of 2 intervals (0 %)"
                ), slo_line
                status = page.locator("#status")
                assert "error" not in (status.get_attribute("class") or ""), status.text_content()
                page.locator("#vs-actual").screenshot(path=str(tmp_path / "vs-actual.png"))
            finally:
                browser.close()
    finally:
        api.terminate()
        api.wait(timeout=20)
