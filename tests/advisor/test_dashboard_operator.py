"""The dashboard explains itself to an operator, in headless Chromium against a real `finetwin api`: the
forecast's headline numbers (utilization per GPU type among them), times in the telemetry's clock with
its zone, SLO bars that tell "no data" from 0 %, the newest capacity plan's failure, and a "Run steering
now" button that asks for an operator key when the key in use is a viewer's. `FINETWIN_UPDATE_DOCS=1`
refreshes docs/dashboard-operator.png."""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from advisor.records import CapacityPlanRecord
from finetwin.schema import migrate
from tests.advisor.seed import seed_overloaded_cluster
from tests.advisor.test_dashboard import CHROMIUM_ARGS
from tests.conftest import api_headers, finetwin_api
from twin.db import make_engine, session_scope
from twin.store import utcnow

pytestmark = [pytest.mark.browser, pytest.mark.integration]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def api_server(tmp_path: Path, calibrated_models_dir: Path) -> Iterator[dict[str, object]]:
    data = tmp_path / "data"
    data.mkdir()
    engine = make_engine(f"sqlite:///{data / 'finetwin.db'}")
    migrate(engine)
    seed_overloaded_cluster(engine)
    with session_scope(engine) as session:  # a sweep whose API process died two hours ago
        heard = utcnow() - timedelta(hours=2)
        session.add(
            CapacityPlanRecord(
                id=str(uuid.uuid4()),
                cluster_id="default",
                created_at=heard,
                updated_at=heard,
                status="running",
                done=3,
                total=10,
                owner="host-b:4242:0badf00d",
            )  # fmt: skip
        )
    keys = {role: api_headers(engine, role)["X-API-Key"] for role in ("viewer", "operator")}
    engine.dispose()
    models = Path(shutil.copytree(calibrated_models_dir, tmp_path / "models"))
    env = {
        **os.environ, "FINETWIN_DATA_DIR": str(data), "FINETWIN_MODELS_DIR": str(models),
        "FINETWIN_SCHEDULER_ENABLED": "false", "FINETWIN_FORECAST_RUNS": "4",
        "FINETWIN_FORECAST_HORIZON_HOURS": "6",
        "FINETWIN_STEERING_REPLICATIONS": "2", "FINETWIN_STEERING_HORIZON_HOURS": "6",
    }  # fmt: skip
    env.pop("FINETWIN_DATABASE_URL", None)
    with finetwin_api(env, tmp_path / "api.log") as url:
        yield {"url": url, "keys": keys}


def test_the_dashboard_explains_itself_to_an_operator(
    api_server: dict, chromium_path: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    keys = api_server["keys"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium_path), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(api_server["url"] + "/")
            # Before a key the page knows nothing of the store: it does not say there is no plan or report.
            page.locator("#status", has_text="enter an API key").wait_for(timeout=30_000)
            assert not page.locator("#plan-empty").is_visible()
            assert not page.locator("#report-none").is_visible()
            page.fill("#key-input", keys["viewer"])
            page.click("#key-form button[type=submit]")
            # Headline numbers of the forecast, utilization per GPU type among them.
            per_type = page.locator(
                "#forecast-summary span[data-figure='NVIDIA-A100-SXM4-80GB utilization'] b"
            )
            per_type.wait_for(timeout=90_000)
            assert per_type.inner_text().endswith(" %")
            assert (
                page.locator("#forecast-summary span[data-figure='utilization'] b")
                .inner_text()
                .endswith(" %")
            )
            # The forecast's age, on the telemetry's clock and on the wall's; the scheduling it assumes (the
            # default's), which shapes its queue.
            meta = page.locator("#forecast-meta")
            assert re.search(
                r"made .+ ago on the telemetry's clock, .+ ago on the wall clock$", meta.inner_text()
            )
            assert ", FIFO scheduling, " in meta.inner_text(), meta.inner_text()
            # An empty recommendation list is explained: steering has not run yet, and when it will.
            note = page.locator("#steering-note", has_text="steering has not run yet")
            note.wait_for(timeout=30_000)
            # No capacity plan yet: the panel says how to start one, without an empty chart and table.
            page.wait_for_function("() => document.body.dataset.loaded !== undefined", timeout=60_000)
            assert page.locator("#plan-empty").is_visible()
            assert page.locator("#report-none").is_visible()  # none written in this data directory
            # The newest plan's failure is said: here a sweep whose API process died mid-way.
            assert (
                page.locator("#plan-meta")
                .inner_text()
                .startswith("latest sweep failed: lost: the API process that ran it (host-b:4242:0badf00d)")
            )
            assert not page.locator("#chart-plan").is_visible()
            assert not page.locator("#plan-scenarios").is_visible()
            # No job has finished yet: the live error chart says why it is empty.
            assert "no finished job scored" in page.text_content("#error-caption")
            assert page.locator("#recs tbody tr").count() == 0
            # Times in the telemetry's clock (UTC), the zone said.
            submitted = page.locator("#jobs tbody tr td:nth-child(6)").first.inner_text()
            assert "UTC" in submitted, submitted
            # SLO bars: a bar only where there is a value; an SLO without one is labelled "no data".
            page.wait_for_function("() => window.finetwinCharts.slo", timeout=30_000)
            bars = page.evaluate(
                "() => { const c = window.finetwinCharts.slo;"
                " return c.data.labels.map((l, i) => [l, c.data.datasets[0].data[i]]); }"
            )
            assert bars
            for label, value in bars:
                assert (value is None) == label.endswith("(no data)"), (label, value)

            # Run steering now: the viewer's key may not, so the page asks for an operator's.
            page.click("#steering-run")
            page.locator("dialog#ask").wait_for(timeout=15_000)
            assert page.inner_text("#ask-title") == "Operator API key to run steering now"
            page.fill("#ask-key", keys["operator"])
            page.click("#ask-form button[type=submit]")
            result = page.locator("#steering-run-result", has_text="steering evaluated")
            result.wait_for(timeout=120_000)
            page.locator("#steering-note", has_text="Last steering run").wait_for(timeout=15_000)
            # Each recommendation says which SLO it helps and by how much; none is explained by the note.
            effects = page.locator("#recs tbody tr td:nth-child(2)").all_inner_texts()
            if effects:
                for effect in effects:
                    assert re.match(r'helps ".+": [+-]\d+(\.\d)? pts of its intervals met', effect), effect
            else:
                assert "candidates evaluated" in page.locator("#steering-note").inner_text()
            shots = REPO / "docs" if os.environ.get("FINETWIN_UPDATE_DOCS") == "1" else tmp_path
            page.screenshot(path=str(shots / "dashboard-operator.png"), full_page=True)
        finally:
            browser.close()
