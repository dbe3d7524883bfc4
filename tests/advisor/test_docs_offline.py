"""/docs and /redoc work without internet: Swagger UI and ReDoc come from the package (fastapi-offline),
checked in headless Chromium against a real `finetwin api` process with every request that leaves the
machine refused. `FINETWIN_UPDATE_DOCS=1` refreshes docs/api-docs-offline.png."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.advisor.test_dashboard import CHROMIUM_ARGS
from tests.conftest import finetwin_api

pytestmark = [pytest.mark.browser, pytest.mark.integration]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def api_url(tmp_path: Path) -> Iterator[str]:
    env = {**os.environ, "FINETWIN_DATA_DIR": str(tmp_path / "data"), "FINETWIN_SCHEDULER_ENABLED": "false"}
    env.pop("FINETWIN_DATABASE_URL", None)
    with finetwin_api(env, tmp_path / "api.log") as url:
        yield url


def test_swagger_ui_and_redoc_render_with_no_internet(
    api_url: str, chromium_path: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import Route, sync_playwright

    outside: list[str] = []

    def only_this_machine(route: Route) -> None:
        if urlparse(route.request.url).hostname in ("127.0.0.1", "localhost"):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium_path), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            page.route("**/*", only_this_machine)
            page.goto(api_url + "/docs")
            page.locator(".swagger-ui .opblock").first.wait_for(timeout=30_000)
            assert page.locator(".swagger-ui .opblock").count() > 20  # every operation listed
            shots = REPO / "docs" if os.environ.get("FINETWIN_UPDATE_DOCS") == "1" else tmp_path
            page.screenshot(path=str(shots / "api-docs-offline.png"))
            page.goto(api_url + "/redoc")
            page.locator("[role=menuitem], .menu-content li").first.wait_for(timeout=30_000)
            assert "finetwin" in page.title()
        finally:
            browser.close()
    # ReDoc's bundle asks for its "powered by" logo on its CDN; refused, the page renders all the same.
    needed = [url for url in outside if not url.endswith("/redoc/logo-mini.svg")]
    assert needed == [], f"the docs asked the internet for {needed}"
