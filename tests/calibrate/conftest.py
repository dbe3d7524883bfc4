"""Fixtures of the calibrate tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibrate.fit import CalibratedModels
from calibrate.registry import ModelRegistry


@pytest.fixture(scope="module")
def models(calibrated_models_dir: Path) -> CalibratedModels:
    """The version in use of the session's models, fitted on the shared sample."""
    found = ModelRegistry(calibrated_models_dir).load_in_use()
    assert found is not None
    return found[1]
