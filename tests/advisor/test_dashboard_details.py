"""The dashboard's smaller promises, in headless Chromium against a real `finetwin api` on SQLite: a refused
key stops the polling (so the failed-key limiter does not lock out the next key) and marks what is shown as
stale; the jobs table says what it leaves out and leaves out the newest arrivals; recommendations of each
kind say what their effect and cost mean; approving and rejecting ask for the key without echoing it and
say that a rejection needs a comment; operator buttons ask for an operator key and go once; the model
error's axis is in UTC and in time order; no word is cut to fit a column, and the audit log's long tokens
stay inside its panel; the header's errors are
legible. API answers the store cannot give quickly (a capacity plan, steering) are stood in for with
`page.route`."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine

from advisor import workflow
from advisor.auth import Role
from advisor.keys import create_api_key
from finetwin.schema import migrate
from tests.advisor.seed import seed_overloaded_cluster
from tests.advisor.test_dashboard import CHROMIUM_ARGS
from tests.conftest import api_headers, finetwin_api, wait_for
from twin.db import make_engine, session_scope
from twin.store import Job, utcnow

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.browser, pytest.mark.integration]
OLD_QUEUED = 80  # beyond the page's 50, and submitted before the seed's queue
A100 = "NVIDIA-A100-SXM4-80GB"


def seed(engine: Engine) -> dict[str, str]:
    seed_overloaded_cluster(engine)  # 1 running, 11 queued in the last half hour
    now = utcnow()
    with session_scope(engine) as session:
        for i in range(OLD_QUEUED):
            session.add(
                Job(
                    job_id=f"old-{i:03d}", state="submitted", model_name="llama3-8b", method="lora",
                    gpu_model=A100, number_gpus=8, number_nodes=1, batch_size=128, tokens_per_sample=2048,
                    enable_roce=False, fast_moe=0, fast_kernels=False, dataset_tokens=3e8,
                    submitted_at=now - timedelta(hours=2, minutes=i), updated_at=now,
                )
            )  # fmt: skip
        steering = workflow.Proposal(
            kind="add_nodes", target=f"nodes:{A100}", title="add 1 A100-SXM node",
            action={"gpu_model": A100, "add_nodes": 1},
            effect={"mean": 0.2, "p10": 0.1, "p90": 0.3, "ci95": [0.15, 0.25], "runs": 8},
            cost=192.0, score=0.001,
        )  # fmt: skip
        capacity = workflow.Proposal(  # as advisor.routers.plan.recommend_plan makes them
            kind="capacity", target="capacity", title="provision 2 x A100 nodes",
            action={"nodes": {A100: 2}, "policy": "fifo", "admission": "none"},
            effect={
                "metric": "SLOs met in at least the plan's confidence of its runs (capacity plan)",
                "plan_id": "p", "confidence": 0.9, "runs": 4,
                "slos": {"wait": {"attainment": {"mean": 0.97}, "met_share": 1.0},
                         "throughput": {"attainment": {"mean": 0.95}, "met_share": 0.75}},
                "gpu_hours_per_day": 384.0, "energy_kwh_per_day": 150.0,
            },
            cost=384.0, score=0.75,
        )  # fmt: skip
        recs = workflow.propose(
            session,
            [steering, capacity],
            cluster_id="default",
            actor="system",
            source="test",
            ttl=timedelta(hours=1),
        )
        return {r.kind: r.id for r in recs}


@pytest.fixture
def api_server(tmp_path: Path) -> Iterator[dict[str, object]]:
    data = tmp_path / "data"
    data.mkdir()
    engine = make_engine(f"sqlite:///{data / 'finetwin.db'}")
    migrate(engine)
    recs = seed(engine)
    roles = {"viewer": "viewer", "fresh viewer": "viewer", "operator": "operator", "approver": "approver"}
    keys = {
        name: api_headers(engine, role, name=name.replace(" ", "-"))["X-API-Key"]
        for name, role in roles.items()
    }
    other_cluster = create_api_key(engine, Role.APPROVER, name="lab-b", actor="test", cluster_id="lab-b")
    keys["lab-b approver"] = other_cluster
    engine.dispose()
    env = {
        **os.environ, "FINETWIN_DATA_DIR": str(data), "FINETWIN_SCHEDULER_ENABLED": "false",
        "FINETWIN_FORECAST_RUNS": "2", "FINETWIN_FORECAST_HORIZON_HOURS": "2",
    }  # fmt: skip
    env.pop("FINETWIN_DATABASE_URL", None)
    with finetwin_api(env, tmp_path / "api.log") as url:
        yield {"url": url, "keys": keys, "recs": recs}


@pytest.fixture
def browser(chromium_path: Path) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium_path), headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def use_key(page, key: str) -> None:  # type: ignore[no-untyped-def]
    """Enter `key` and wait until every panel has answered with it (the page marks each load's end)."""
    page.evaluate("() => { delete document.body.dataset.loaded; }")
    page.fill("#key-input", key)
    page.click("#key-form button[type=submit]")
    page.wait_for_function("() => document.body.dataset.loaded !== undefined", timeout=90_000)


def contrast(foreground: str, background: str) -> float:
    """WCAG contrast ratio of two computed `rgb(r, g, b)` colours."""

    def luminance(rgb: str) -> float:
        channels = [int(c) / 255 for c in rgb[rgb.index("(") + 1 : rgb.index(")")].split(",")[:3]]
        linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    light, dark = sorted([luminance(foreground), luminance(background)], reverse=True)
    return (light + 0.05) / (dark + 0.05)


def test_a_refused_key_stops_the_polling_and_the_next_key_works(api_server: dict, browser) -> None:  # type: ignore[no-untyped-def]
    keys, bad = api_server["keys"], "ft_revoked_or_never_issued_key"
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.clock.install()  # the 15 s polling run forward on demand, not waited for
    sent_with_bad: list[str] = []
    page.on("request", lambda r: sent_with_bad.append(r.url) if r.headers.get("x-api-key") == bad else None)
    page.goto(api_server["url"] + "/")
    use_key(page, keys["viewer"])
    assert not page.locator("main.stale").count()
    use_key(page, bad)
    status = page.locator("#status")
    assert "the API refused the key (invalid or revoked API key)" in status.inner_text()
    assert page.locator("main.stale").count() == 1  # the viewer's numbers, still shown, marked stale
    # The header's error text is legible on the header (WCAG AA: 4.5:1).
    colours = page.evaluate(
        "() => [getComputedStyle(document.getElementById('status')).color,"
        " getComputedStyle(document.querySelector('header')).backgroundColor]"
    )
    assert contrast(*colours) >= 4.5, colours
    refused_after = len(sent_with_bad)
    page.clock.run_for(4 * 15_000)  # four polling periods: the bad key is not sent again
    assert "enter a valid key" in status.inner_text()
    # A key never checked before is what the failed-key limiter refuses (429) once an address has failed
    # 30 times a minute: the refused key's polling would have got it there.
    use_key(page, keys["fresh viewer"])
    assert "error" not in (status.get_attribute("class") or ""), status.inner_text()
    assert not page.locator("main.stale").count()
    assert len(sent_with_bad) == refused_after, sent_with_bad[refused_after:]
    # And polling goes on with it.
    loaded = page.evaluate("() => document.body.dataset.loaded")
    page.clock.run_for(15_000)
    page.wait_for_function("(before) => document.body.dataset.loaded !== before", arg=loaded, timeout=60_000)


def test_a_key_for_another_cluster_is_refused_as_such_and_not_sent_again(api_server: dict, browser) -> None:  # type: ignore[no-untyped-def]
    """This API serves `default`: a key made for lab-b's API is refused once, saying so, and forgotten."""
    other = api_server["keys"]["lab-b approver"]
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.clock.install()
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if r.headers.get("x-api-key") == other else None)
    page.goto(api_server["url"] + "/")
    use_key(page, other)
    status = page.locator("#status").inner_text()
    assert "this key is for cluster 'lab-b'; this API serves cluster 'default'" in status, status
    refused_after = len(sent)
    page.clock.run_for(2 * 15_000)
    assert len(sent) == refused_after, sent[refused_after:]


def test_the_tables_say_what_they_show(api_server: dict, browser) -> None:  # type: ignore[no-untyped-def]
    keys, recs = api_server["keys"], api_server["recs"]
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.goto(api_server["url"] + "/")
    use_key(page, keys["viewer"])
    # The cluster this API serves is named (one store may hold several, each with its dashboard).
    assert (page.inner_text("#cluster-name"), page.title()) == ("default", "finetwin · default")
    # 91 queued: the table shows 50 of them, the longest waiting first, and says so.
    queued = 11 + OLD_QUEUED
    assert page.inner_text("#jobs-note") == (
        f"1 running (newest first); showing 50 of {queued} queued (longest waiting first)"
    )
    rows = page.locator("#jobs tbody tr td:first-child").all_inner_texts()
    assert len(rows) == 51 and rows[1] == f"old-{OLD_QUEUED - 1:03d}", rows[:3]
    # Each kind of recommendation says what its effect and its GPU-hours are.
    capacity = page.locator(f"#recs tr:has(td[data-recommendation='{recs['capacity']}']) td")
    assert (
        capacity.nth(1).inner_text() == "every SLO met in at least 75 % of 4 runs (the plan asked for 90 %)"
    )
    assert capacity.nth(2).inner_text() == "384 for the whole cluster"
    steering = page.locator(f"#recs tr:has(td[data-recommendation='{recs['add_nodes']}']) td")
    assert steering.nth(1).inner_text().startswith("+20.0 pts attainment")
    assert steering.nth(2).inner_text() == "+192 added"
    # Each chart is an image whose label says what it shows, in words (a screen reader found nothing).
    queue = page.get_attribute("#chart-queue", "aria-label") or ""
    assert page.get_attribute("#chart-queue", "role") == "img"
    assert queue.startswith("Queue length (mean, p10-p90): mean from "), queue
    assert "(lowest " in queue and "highest " in queue, queue
    slo = page.get_attribute("#chart-slo", "aria-label") or ""
    assert slo.startswith("SLO attainment") and "mean attainment %: " in slo, slo
    # A word is never cut in two to fit its column ("pendi|ng", an "appro|ve" button, "submitte|d"): every
    # one-word cell and button of the recommendations and jobs tables lies on one line.
    cut = page.evaluate(
        """() => [...document.querySelectorAll('#recs td, #recs button, #jobs td')]
             .filter(e => !e.children.length && /^[A-Za-z]+$/.test(e.textContent.trim()))
             .filter(e => { const r = document.createRange(); r.selectNodeContents(e);
                            return r.getClientRects().length > 1; })
             .map(e => e.textContent)"""
    )
    assert cut == [], cut
    assert page.locator("#recs td.state-pending").count() >= 2 and page.locator("#recs button").count() >= 4
    # What waits for a person sits beside the cluster, on the first screen; the forecast spans the page below
    # (it came between them, and left a hole beside the cluster).
    boxes = page.evaluate(
        "() => Object.fromEntries(['cluster', 'recommendations', 'forecast'].map(id => [id,"
        " document.getElementById(id).getBoundingClientRect().toJSON()]))"
    )
    assert boxes["recommendations"]["top"] == boxes["cluster"]["top"], boxes
    assert boxes["recommendations"]["left"] > boxes["cluster"]["right"], boxes
    assert boxes["forecast"]["top"] > boxes["cluster"]["bottom"], boxes
    # At 1400 px no panel scrolls sideways: everything fits.
    scrolling = page.evaluate(
        "() => [...document.querySelectorAll('.panel')]"
        ".filter(p => p.scrollWidth > p.clientWidth).map(p => p.id)"
    )
    assert scrolling == [], scrolling
    # On a phone (375 px) the page is as wide as the screen: it was 576 px, every panel past its right edge.
    # A table wider than its panel scrolls inside the panel.
    page.set_viewport_size({"width": 375, "height": 800})
    widths = page.evaluate(
        "() => [document.documentElement.scrollWidth, window.innerWidth,"
        " Math.max(...[...document.querySelectorAll('.panel')].map(p => p.getBoundingClientRect().right))]"
    )
    assert widths[0] == widths[1] == 375 and widths[2] <= 375, widths


def test_rejecting_asks_for_the_key_unechoed_and_a_comment(api_server: dict, browser) -> None:  # type: ignore[no-untyped-def]
    keys, rec_id = api_server["keys"], api_server["recs"]["add_nodes"]
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    # The page's 15 s polling stopped (its clock paused): a poll ending between the rejection and the read
    # of the status line said "updated ..." where the rejection had said "rejected".
    page.clock.install(time=datetime.now(UTC))
    prompted: list[str] = []
    page.on("dialog", lambda d: (prompted.append(d.message), d.dismiss()))
    page.goto(api_server["url"] + "/")
    # A second past the wall clock, which the page's clock (set to it before, running since) has not
    # reached: a fixed second past the install was in the page's past after a load that took longer.
    page.clock.pause_at(datetime.now(UTC) + timedelta(seconds=1))
    use_key(page, keys["viewer"])
    page.click(f"button[data-action=reject][data-recommendation='{rec_id}']")
    dialog = page.locator("dialog#ask")
    dialog.wait_for(timeout=5_000)
    assert dialog.locator("#ask-title").inner_text() == "Approver API key to reject this recommendation"
    assert page.get_attribute("#ask-key", "type") == "password"
    page.fill("#ask-key", keys["approver"])
    page.click("#ask-form button[type=submit]")
    assert page.inner_text("#ask-error") == "a comment is required"
    assert dialog.is_visible()
    # A long unbroken token, as a ticket URL or a recommendation's id in the audit log is.
    comment = "duplicate-of-https://tickets.example.com/" + "x" * 150
    page.fill("#ask-comment", comment)
    page.click("#ask-form button[type=submit]")
    page.locator(f"td[data-recommendation='{rec_id}']", has_text="rejected").wait_for(timeout=15_000)
    assert page.inner_text("#status") == "rejected"
    page.locator("#audit-log tbody tr", has_text="duplicate-of").wait_for(timeout=15_000)
    assert prompted == []  # nothing asked in window.prompt, whose field echoes the key
    for width in (1280, 1920):
        page.set_viewport_size({"width": width, "height": 1000})
        box = page.evaluate(
            """() => { const p = document.getElementById('audit').getBoundingClientRect();
                       const t = document.getElementById('audit-log').getBoundingClientRect();
                       const page = document.documentElement.clientWidth;
                       return {panel: p.right, table: t.right, page}; }"""
        )
        assert box["table"] <= box["panel"] <= box["page"], (width, box)


PLAN = {
    "scenarios": [
        {"nodes": {A100: 2}, "policy": "fifo", "admission": "none", "error": None, "unplaceable_share": 0,
         "slos": {"wait": {"met_share": 1.0}}, "gpu_hours_per_day": 384.0, "energy_kwh_per_day": 150.0,
         "meets_slos": True, "frontier": True},
    ],
    "runs": 4, "executor": "local", "confidence": 0.9,
}  # fmt: skip
PLAN["cheapest"] = PLAN["scenarios"][0]


def test_operator_buttons_ask_for_an_operator_key_and_send_once(api_server: dict, browser) -> None:  # type: ignore[no-untyped-def]
    from playwright.sync_api import expect

    keys = api_server["keys"]
    context = browser.new_context(viewport={"width": 1400, "height": 1100}, timezone_id="America/New_York")
    page = context.new_page()
    held: list = []  # operator requests, answered once the test has looked at the page meanwhile
    sent: list[str] = []

    def operator_only(route) -> None:  # type: ignore[no-untyped-def]
        key = route.request.headers.get("x-api-key")
        sent.append(key)
        if key == keys["operator"]:
            held.append(route)
        else:
            route.fulfill(status=403, json={"detail": "this needs the operator role; the key has viewer"})

    page.route("**/v1/recommendations/run", operator_only)
    # The steering run goes on in the API's background: the page follows it at the address it was given.
    steering: dict = {"ran": False, "why_none": "steering has not run yet", "under_way": None}
    page.route("**/v1/recommendations/steering", lambda r: r.fulfill(json=steering))
    page.route("**/v1/plan/p1/recommend", operator_only)
    page.route("**/v1/plan", lambda r: r.fulfill(json=[{"id": "p1", "status": "done"}]))
    page.route("**/v1/plan/p1", lambda r: r.fulfill(json={"id": "p1", "status": "done", "result": PLAN}))
    # The model error as the API may give it: out of time order, around midnight UTC (evening in New York).
    points = [{"ended_at": f"2026-01-01T23:{m}:00Z", "rolling_mdape": 0.1} for m in ("50", "30", "40")]
    page.route(
        "**/v1/models/live-error?*",
        lambda r: r.fulfill(body=json.dumps({"points": points, "mdape_threshold": 0.25}),
                            content_type="application/json"),
    )  # fmt: skip
    page.goto(api_server["url"] + "/")
    use_key(page, keys["viewer"])
    labels = page.evaluate("() => window.finetwinCharts.error.data.labels")
    assert labels == ["23:30", "23:40", "23:50"]
    assert "(UTC)" in page.inner_text("#error-caption")

    under_way = {"started_at": "2026-01-02T03:04:05Z", "actor": "key:1 (op)", "source": "on-demand"}
    started = {"under_way": under_way, "joined": False, "poll": "/v1/recommendations/steering"}
    for button, title, answer, said in [
        ("#steering-run", "Operator API key to run steering now", started,
         ("#steering-run-result", "steering evaluated 3 actions")),
        ("#plan-recommend", "Operator API key to recommend the cheapest",
         {"recommendation_id": "r", "title": "x"}, ("#status", "recommended: x")),
    ]:  # fmt: skip
        sent.clear()
        page.dblclick(button)
        page.locator("dialog#ask").wait_for(timeout=5_000)
        assert page.inner_text("#ask-title") == title
        page.fill("#ask-key", keys["operator"])
        page.click("#ask-form button[type=submit]")
        # Playwright runs route handlers only inside its own calls: evaluate until this one has run.
        wait_for(lambda: held or page.evaluate("() => false"), 10, "the operator's request")
        # The double click sent one request with the viewer's key and, asked, one with the operator's.
        assert sent == [keys["viewer"], keys["operator"]]
        assert page.locator(button).is_disabled()  # while its request is on its way
        request = held.pop()
        if button == "#steering-run":
            # Asked to answer at once (RFC 7240), and told where the run's outcome will be.
            assert request.request.headers.get("prefer") == "respond-async"
            steering["under_way"] = under_way
            request.fulfill(status=202, json=answer)
            following = page.locator("#steering-run-result", has_text="steering… (started")
            following.wait_for(timeout=15_000)
            assert "by key:1 (op)" in following.inner_text() and page.locator(button).is_disabled()
            steering.update(ran=True, evaluated=3, recommended=0, notes=[], why_none=None, under_way=None,
                            at="2026-01-02T03:04:45Z")  # fmt: skip
        else:
            request.fulfill(json=answer)
        page.locator(said[0], has_text=said[1]).wait_for(timeout=15_000)
        expect(page.locator(button)).to_be_enabled()  # once the panels it changed are reloaded
    # A page opened while a run is under way (another operator's, or the schedule's) says so.
    steering["under_way"] = under_way
    page.reload()
    note = page.locator("#steering-note", has_text="A steering run is under way (started")
    note.wait_for(timeout=15_000)
    assert note.inner_text().startswith("Last steering run")  # after the last run's outcome
    context.close()


def test_the_latest_report_opens_as_a_styled_page_with_its_figures(
    api_server: dict, browser, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """The dashboard's report link opened report.md as text, the Markdown raw. It opens the report rendered,
    styled (its style element allowed by hash, nothing else) and with every figure loaded."""
    from types import SimpleNamespace

    from calibrate.report.latest import record_latest, reports_root
    from finetwin.settings import Settings

    out = tmp_path / "report"
    shutil.copytree(REPO / "docs" / "report-example", out)
    figures = {path.stem: path for path in out.glob("*.png")}
    report = SimpleNamespace(
        out_dir=out, report_md=out / "report.md", numbers_json=out / "numbers.json", figures=figures,
        generated_at="2026-12-06T12:00:00Z", source="the bundled sample",
    )  # fmt: skip
    record_latest(report, reports_root(Settings(data_dir=tmp_path / "data")))
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
    page.goto(api_server["url"] + "/")
    use_key(page, api_server["keys"]["viewer"])
    page.click("#report-link a")
    page.wait_for_load_state("load")
    assert page.url == api_server["url"] + "/reports/latest/"
    assert page.title() == "Characterization report: the bundled sample"
    assert page.locator("h1").first.inner_text().strip()
    assert page.locator("table").count() > 0
    table_style = "() => getComputedStyle(document.querySelector('table')).borderCollapse"
    assert page.evaluate(table_style) == "collapse"  # the style applied: its hash is in the policy
    sizes = page.evaluate("() => [...document.images].map((i) => [i.getAttribute('src'), i.naturalWidth])")
    assert len(sizes) == len(figures) and all(width > 0 for _, width in sizes), sizes
    assert not refused, refused
    page.close()


def test_jobs_that_need_attention_come_first_and_say_why(api_server: dict, browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A job past its time limit with no end reported, and one silent for two hours: the cluster panel counts
    them and the jobs table lists them first (older than every running job it shows), each with its reason."""
    engine = make_engine(f"sqlite:///{tmp_path / 'data' / 'finetwin.db'}")
    now = utcnow()
    life = {"overdue": {"time_limit_s": 600.0}, "stalled": {"progress_at": now - timedelta(hours=2)}}
    with session_scope(engine) as session:
        for kind, more in life.items():
            session.add(
                Job(
                    job_id=f"{kind}-job", state="running", model_name="llama3-8b", method="lora",
                    gpu_model=A100, number_gpus=8, number_nodes=1, batch_size=128, tokens_per_sample=2048,
                    submitted_at=now - timedelta(days=2), started_at=now - timedelta(hours=3),
                    updated_at=now, **more,
                )
            )  # fmt: skip
    engine.dispose()
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.goto(api_server["url"] + "/")
    use_key(page, api_server["keys"]["viewer"])
    flagged = page.locator("#cluster-summary span.attention")
    assert flagged.inner_text() == "2 need attention (1 overdue, 1 stalled)"
    rows = page.locator("#jobs tbody tr")
    first = [rows.nth(k).locator("td").nth(1) for k in range(2)]
    assert sorted(cell.inner_text() for cell in first) == ["running: overdue", "running: stalled"]
    for cell in first:
        assert cell.get_attribute("class") == "attention"
        why = cell.get_attribute("title")
        assert ("past its time limit of 10 min" in why) or ("no progress reported for 2.0 h" in why), why
    assert page.inner_text("#jobs-note").startswith("2 needing attention; ")
    page.close()
