"""Advisor fixtures: an app on a migrated store (both backends via `engine`), and keys of each role."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from finetwin.settings import Settings
from tests.advisor.fakes import FakeInUse
from tests.conftest import api_app, api_headers

# The installed console script (`python -m finetwin.cli` would load the module twice: __main__, and itself).
FINETWIN = [str(Path(sys.executable).with_name("finetwin"))]


def advisor_settings(tmp_path: Path, **overrides: object) -> Settings:
    base: dict[str, object] = {
        "data_dir": tmp_path / "data",
        "scheduler_enabled": False,
        "models_dir": tmp_path / "models",
    }
    return Settings(**{**base, **overrides})  # type: ignore[arg-type]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return advisor_settings(tmp_path)


@pytest.fixture
def in_use() -> FakeInUse:
    """The models in use the `client`'s app is built with: none until a test puts models in."""
    return FakeInUse(None)


@pytest.fixture
def client(engine: Engine, settings: Settings, in_use: FakeInUse) -> Iterator[TestClient]:
    app = api_app(settings, engine, in_use)
    with TestClient(app) as test_client:
        yield test_client


@pytest.fixture
def keys(engine: Engine) -> dict[str, dict[str, str]]:
    """Headers for one key of each role."""
    roles = ("viewer", "operator", "approver")
    return {role: api_headers(engine, role, name=f"{role}-tester") for role in roles}
