"""`finetwin api --forwarded-allow-ips`: behind a reverse proxy, each client's failed-key budget is its own
(read from the proxy's X-Forwarded-For), against a real server."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from tests.conftest import finetwin_api

pytestmark = pytest.mark.integration


def test_each_client_behind_the_proxy_has_its_own_failed_key_budget(tmp_path: Path) -> None:
    """The option was in the docs but not in the command ("No such option"). uvicorn's own variable names
    another proxy here, so the loopback proxy is believed only because of the option."""
    env = {
        **os.environ, "FINETWIN_DATA_DIR": str(tmp_path / "data"), "FINETWIN_SCHEDULER_ENABLED": "false",
        "FINETWIN_AUTH_MAX_FAILURES": "3", "FORWARDED_ALLOW_IPS": "192.0.2.99",
    }  # fmt: skip
    env.pop("FINETWIN_DATABASE_URL", None)
    with (
        finetwin_api(env, tmp_path / "api.log", "--forwarded-allow-ips", "127.0.0.1") as url,
        httpx.Client(base_url=url, timeout=30) as client,
    ):

        def guess(client_address: str) -> int:
            headers = {"X-API-Key": "ft_not_a_key", "X-Forwarded-For": client_address}
            return client.get("/v1/jobs", headers=headers).status_code

        assert [guess("203.0.113.1") for _ in range(4)] == [401, 401, 401, 429]
        assert guess("203.0.113.2") == 401  # another client behind the same proxy: not locked out
