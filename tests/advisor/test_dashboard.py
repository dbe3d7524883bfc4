"""The dashboard in headless Chromium against a real API process (uvicorn), PostgreSQL and Tansu: the
charts draw, an approver approves a recommendation from the page, its state changes, and the action is
on the Kafka topic. `FINETWIN_UPDATE_DOCS=1` refreshes the screenshot in docs/dashboard.png."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine

from advisor import workflow
from calibrate.records import LiveError
from finetwin.schema import migrate
from ingest.broker import free_port
from tests.advisor.conftest import FINETWIN
from tests.advisor.kafka_util import read_topic
from tests.advisor.seed import seed_overloaded_cluster
from tests.conftest import api_headers, tcp_listening, unique, wait_for
from twin.db import make_engine, session_scope
from twin.store import utcnow

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run",
]  # fmt: skip


def seed(engine: Engine) -> str:
    seed_overloaded_cluster(engine)
    now = utcnow()
    with session_scope(engine) as session:
        for i in range(40):  # the live error of 40 finished jobs, the model drifting slowly
            session.add(
                LiveError(
                    job_id=f"done-{i}", model_version="v0001", ended_at=now - timedelta(minutes=40 - i),
                    predicted_outcome="valid", actual_outcome="valid", outcome_error=0, p_valid=0.9,
                    failure_brier=0.01, measured_tokens_per_second=1000.0,
                    predicted_tokens_per_second=1100.0 + 5 * i, ape=0.1 + 0.005 * i, in_band=True,
                )
            )  # fmt: skip
        proposal = workflow.Proposal(
            kind="add_nodes", target="nodes:NVIDIA-A100-SXM4-80GB", title="add 1 A100-SXM node",
            action={"gpu_model": "NVIDIA-A100-SXM4-80GB", "add_nodes": 1},
            effect={"mean": 0.2, "p10": 0.1, "p90": 0.3, "ci95": [0.15, 0.25], "runs": 8},
            cost=192.0, score=0.001,
        )  # fmt: skip
        (rec,) = workflow.propose(
            session, [proposal], cluster_id="default", actor="system", source="test", ttl=timedelta(hours=1)
        )
        return rec.id


@pytest.fixture
def api_server(postgres_url: str, kafka_bootstrap: str, tmp_path: Path) -> Iterator[dict[str, object]]:
    engine = make_engine(postgres_url)
    migrate(engine)
    rec_id = seed(engine)
    keys = {role: api_headers(engine, role)["X-API-Key"] for role in ("viewer", "approver")}
    topic = unique("actions")
    port = free_port()
    env = {
        **os.environ,
        "FINETWIN_DATABASE_URL": postgres_url, "FINETWIN_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "FINETWIN_ACTIONS_TOPIC": topic, "FINETWIN_SCHEDULER_ENABLED": "false", "FINETWIN_FORECAST_RUNS": "8",
        "FINETWIN_FORECAST_HORIZON_HOURS": "12", "FINETWIN_DATA_DIR": str(tmp_path / "data"),
        "FINETWIN_RELAY_POLL_SECONDS": "1",
    }  # fmt: skip
    log = (tmp_path / "api.log").open("wb")
    process = subprocess.Popen(
        [*FINETWIN, "api", "--port", str(port)], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        wait_for(lambda: tcp_listening(port) or process.poll() is not None, 60, "the API to listen")
        assert process.poll() is None, (tmp_path / "api.log").read_text()
        yield {"url": f"http://127.0.0.1:{port}", "rec_id": rec_id, "keys": keys, "topic": topic}
    finally:
        process.terminate()
        process.wait(timeout=20)
        log.close()
        engine.dispose()


def start_a_capacity_plan(api_server: dict) -> int:
    """A small sweep through the API (the approver key outranks operator); returns its scenario count."""
    import httpx

    headers = {"X-API-Key": api_server["keys"]["approver"]}
    body = {"vary": ["NVIDIA-A100-SXM4-80GB=1..3"], "runs": 2, "horizon": "12h"}
    started = httpx.post(api_server["url"] + "/v1/plan", json=body, headers=headers, timeout=30)
    assert started.status_code == 202, started.text
    url = f"{api_server['url']}/v1/plan/{started.json()['id']}"

    def finished() -> dict | None:
        plan = httpx.get(url, headers=headers, timeout=30).json()
        return plan if plan["status"] in ("done", "failed") else None

    plan = wait_for(finished, 90, "the capacity plan")
    assert plan["status"] == "done", plan
    return len(plan["result"]["scenarios"])


def published(api_server: dict, rec_id: str) -> bool:
    """Whether the API says the approved recommendation's action was sent (its outbox row marked)."""
    import httpx

    headers = {"X-API-Key": api_server["keys"]["viewer"]}
    url = f"{api_server['url']}/v1/recommendations/{rec_id}"
    return httpx.get(url, headers=headers, timeout=30).json()["published"] is True


def test_dashboard_approve_end_to_end(
    api_server: dict, chromium_path: Path, kafka_bootstrap: str, tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    rec_id, keys = api_server["rec_id"], api_server["keys"]
    plan_rows = start_a_capacity_plan(api_server)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium_path), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            # The page runs under its Content-Security-Policy: whatever it would do against it shows here.
            refused: list[str] = []
            page.on(
                "console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None
            )
            # The page's own files (not the API, whose refusals are part of the test) all load: a missing
            # one is an error in the console.
            missing: list[str] = []
            page.on(
                "response",
                lambda r: missing.append(r.url) if r.status >= 400 and "/v1/" not in r.url else None,
            )
            landing = page.goto(api_server["url"] + "/")
            assert landing is not None and "script-src 'self'" in landing.headers["content-security-policy"]
            page.fill("#key-input", keys["viewer"])
            page.click("#key-form button[type=submit]")
            # Predicates as functions: a string would be eval'd in the page, which its CSP forbids.
            page.wait_for_function(
                "() => ['queue', 'utilization', 'slo', 'error'].every(n => window.finetwinCharts[n])",
                timeout=90_000,
            )
            drawn = page.evaluate(
                """() => Object.fromEntries(Object.entries(window.finetwinCharts).map(([name, chart]) => {
                    const c = chart.canvas;
                    const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
                    let inked = 0;
                    for (let i = 3; i < px.length; i += 4) if (px[i] > 0) inked++;
                    return [name, {points: chart.data.datasets[0].data.length, inked}];
                }))"""
            )
            for name, chart in drawn.items():
                assert chart["points"] > 0 and chart["inked"] > 500, (name, chart)
            assert "no finished job" not in page.text_content("#error-caption")
            # The cluster's tables come from their own requests (the nodes, then the jobs): the charts may be
            # drawn before them.
            jobs_listed = "() => document.querySelectorAll('#jobs tbody tr').length > 0"
            page.wait_for_function(jobs_listed, timeout=30_000)
            assert page.locator("#nodes tbody tr").count() == 1
            assert page.locator("#jobs tbody tr").count() == 12
            # The status line speaks once every panel has answered (the charts and tables above may be drawn
            # before the slowest of them): the page marks the end of each load with the key.
            page.wait_for_function("() => document.body.dataset.loaded !== undefined", timeout=60_000)
            status = page.locator("#status")
            assert "error" not in (status.get_attribute("class") or ""), status.text_content()
            # The capacity plan: every scenario in the table, the frontier drawn against the cost.
            page.wait_for_function("() => window.finetwinCharts.plan", timeout=30_000)
            assert page.locator("#plan-scenarios tbody tr").count() == plan_rows
            frontier = page.locator("#plan-scenarios tbody tr[data-frontier=true]").count()
            assert 1 <= frontier <= plan_rows
            assert page.evaluate("() => window.finetwinCharts.plan.data.datasets[0].data.length") == frontier

            page.click(f"button[data-action=approve][data-recommendation='{rec_id}']")
            page.locator("dialog#ask").wait_for(timeout=15_000)
            page.fill("#ask-key", keys["approver"])
            page.fill("#ask-comment", "approved in the browser test")
            page.click("#ask-form button[type=submit]")
            state = page.locator(f"td[data-recommendation='{rec_id}']")
            state.filter(has_text="approved").wait_for(timeout=15_000)
            page.locator("#audit-log tbody tr", has_text="approved in the browser test").wait_for(
                timeout=15_000
            )

            messages = wait_for(
                lambda: [m for m in read_topic(kafka_bootstrap, api_server["topic"]) if m.key == rec_id],
                30, "the approved action on the actions topic",
            )  # fmt: skip
            assert len(messages) == 1 and messages[0].value["action"]["add_nodes"] == 1
            assert messages[0].value["comment"] == "approved in the browser test"
            # The relay marks its row sent after the broker's ack, a moment after the message is on the topic:
            # a reload before then read "approved", and only the page's 15 s polling could show "sent" in
            # time. The page is reloaded once the API says the action was sent.
            wait_for(lambda: published(api_server, rec_id), 30, "the relay to mark the action sent")
            page.evaluate("() => loadAll()")
            state.filter(has_text="sent").wait_for(timeout=15_000)
            # docs/dashboard.png is refreshed on request only, so a test run leaves the work tree clean.
            shots = REPO / "docs" if os.environ.get("FINETWIN_UPDATE_DOCS") == "1" else tmp_path
            page.screenshot(path=str(shots / "dashboard.png"), full_page=True)
            assert (shots / "dashboard.png").stat().st_size > 10_000
            assert refused == []
            assert missing == []
        finally:
            browser.close()
