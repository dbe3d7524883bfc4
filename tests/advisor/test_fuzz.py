"""Schemathesis against the app's own OpenAPI document: whatever the request, never a 5xx, and every
response as the document says: status code documented, content type, body schema (issue 10: a 422's
`detail` was a string where the document said a list, the 400 for a body that cannot be read was not in it,
times from SQLite came without their offset).

Two stores: an empty one with no models (every endpoint answers "nothing to do yet" cleanly), and one
with a cluster, recommendations and the trend-following stand-in models, for the advisor's own
endpoints to be exercised past their first checks. Requests carry an approver key, so they get past
authentication to the validation and the logic behind it.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.failures import FailureGroup
from sqlalchemy import Engine

from advisor import workflow
from finetwin.schema import migrate
from tests.advisor.conftest import advisor_settings
from tests.advisor.fakes import FakeInUse, FakeModels
from tests.advisor.seed import seed_overloaded_cluster
from tests.conftest import api_app, api_headers
from twin.db import make_engine, session_scope

pytestmark = pytest.mark.slow
FUZZ = dict(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
ADVISOR_PATHS = r"^/v1/(advise|recommendations|slos|audit|reports)"
MODEL_PATHS = r"^/v1/(advise|predict)$"


def _store(tmp_path: Path, name: str) -> Engine:
    engine = make_engine(f"sqlite:///{tmp_path / name}")
    migrate(engine)
    return engine


@pytest.fixture
def empty_api(tmp_path: Path):  # type: ignore[no-untyped-def]
    engine = _store(tmp_path, "empty.db")
    app = api_app(advisor_settings(tmp_path), engine, FakeInUse(None))
    return schemathesis.openapi.from_asgi("/openapi.json", app), api_headers(engine, "approver")


@pytest.fixture
def busy_api(tmp_path: Path):  # type: ignore[no-untyped-def]
    engine = _store(tmp_path, "busy.db")
    seed_overloaded_cluster(engine)
    with session_scope(engine) as session:
        proposals = [
            workflow.Proposal(kind="policy", target=f"t{i}", title=f"t{i}", action={}) for i in range(3)
        ]
        workflow.propose(
            session, proposals, cluster_id="default", actor="system", source="test", ttl=timedelta(hours=1)
        )
    settings_ = advisor_settings(tmp_path, steering_replications=2, steering_horizon_hours=2)
    app = api_app(settings_, engine, FakeInUse(FakeModels()))
    schema = schemathesis.openapi.from_asgi("/openapi.json", app).include(path_regex=ADVISOR_PATHS)
    return schema, api_headers(engine, "approver")


# Not `negative_data_rejection`: its invalid cases include "no X-API-Key", which the key every request
# carries here makes valid again, and unknown query parameters, which HTTP APIs ignore. Strict types, the
# point of it, are tested case by case in test_bad_requests.py.
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def fuzz(schema, headers: dict[str, str], examples: int = 12) -> list[str]:  # type: ignore[no-untyped-def]
    """Valid and invalid requests for every operation; returns the ones that got a 5xx or a response the
    document does not describe."""
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(max_examples=examples, **FUZZ)  # type: ignore[arg-type]
            @given(case=operation.as_strategy(generation_mode=mode))
            def check(case) -> None:  # type: ignore[no-untyped-def]
                response = case.call(headers=dict(headers))
                try:
                    case.validate_response(response, checks=CHECKS, headers=dict(headers))
                except FailureGroup as exc:
                    failures.append(
                        f"{case.method} {case.formatted_path} {case.query!r} {case.body!r}: "
                        f"{response.status_code} {response.text[:200]}: {exc}"
                    )

            try:
                check()
            except Unsatisfiable:  # nothing to make invalid (an operation without parameters)
                assert mode is GenerationMode.NEGATIVE, operation.label
    return failures


def test_no_5xx_on_an_empty_store(empty_api) -> None:  # type: ignore[no-untyped-def]
    schema, headers = empty_api
    assert fuzz(schema, headers) == []


def test_no_5xx_on_a_busy_store(busy_api) -> None:  # type: ignore[no-untyped-def]
    schema, headers = busy_api
    assert fuzz(schema, headers) == []


@pytest.fixture
def calibrated_api(tmp_path: Path, calibrated_models_dir: Path):  # type: ignore[no-untyped-def]
    engine = _store(tmp_path, "calibrated.db")
    app = api_app(advisor_settings(tmp_path, models_dir=calibrated_models_dir), engine)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app).include(
        path_regex=r"^/v1/(advise|predict)$"
    )
    return schema, api_headers(engine, "viewer")


def test_no_5xx_from_the_calibrated_models(calibrated_api) -> None:  # type: ignore[no-untyped-def]
    """Odd but valid configurations (unknown model names, 4,096 GPUs, ...) reach the real models."""
    schema, headers = calibrated_api
    assert fuzz(schema, headers, examples=8) == []
