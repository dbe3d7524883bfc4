"""The forecast endpoints' answers are typed in the OpenAPI document (they were any object), and the
schemas hold to the real answers both ways: every key an answer has is documented, every documented
required key is there (the schemas forbid keys they do not name)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel, ValidationError
from sqlalchemy import Engine

from advisor.routers.forecast_schemas import ForecastOut, SkillOut, VsActualOut, WhatIfOut
from finetwin.settings import Settings
from tests.advisor.seed import seed_overloaded_cluster
from tests.conftest import api_app, api_headers
from twin.band_calibration import Margin, calibrate_bands
from twin.run_metrics import SERIES_FIGURES, SUMMARY_FIGURES

# (path, method, schema) of every typed forecast answer.
TYPED = (
    ("/v1/forecast", "get", ForecastOut),
    ("/v1/forecast/refresh", "post", ForecastOut),
    ("/v1/forecast/vs-actual", "get", VsActualOut),
    ("/v1/forecast/skill", "get", SkillOut),
    ("/v1/whatif", "post", WhatIfOut),
)


@pytest.fixture
def api(engine: Engine, tmp_path: Path) -> Any:
    seed_overloaded_cluster(engine, jobs=6, nodes=2)
    settings = Settings(
        data_dir=tmp_path / "data", models_dir=tmp_path / "models", scheduler_enabled=False,
        forecast_runs=4, forecast_horizon_hours=4,
    )  # fmt: skip
    with TestClient(api_app(settings, engine)) as client:
        yield client, api_headers(engine, "operator")


def test_every_forecast_answer_is_typed_in_the_openapi_document(api: Any) -> None:
    client, _ = api
    openapi = client.get("/openapi.json").json()
    schemas = openapi["components"]["schemas"]
    for path, method, schema in TYPED:
        answer = openapi["paths"][path][method]["responses"]["200"]["content"]["application/json"]
        assert answer["schema"] == {"$ref": f"#/components/schemas/{schema.__name__}"}, path
    # Down to each figure, by the twin's own lists of them.
    assert set(SUMMARY_FIGURES) < set(schemas["ForecastSummary"]["properties"])
    assert set(SERIES_FIGURES) < set(schemas["ForecastSeries"]["properties"])
    assert set(SUMMARY_FIGURES) < set(schemas["WhatIfDifference"]["properties"])
    assert schemas["ForecastSummary"]["properties"]["utilization"] == {"$ref": "#/components/schemas/Spread"}


def test_the_schemas_hold_to_the_real_answers(api: Any) -> None:
    client, headers = api
    refreshed = client.post("/v1/forecast/refresh", headers=headers)
    assert refreshed.status_code == 200, refreshed.text
    ForecastOut.model_validate(refreshed.json())
    served = client.get("/v1/forecast", headers=headers).json()
    assert served["id"] == refreshed.json()["id"] and "stored_at" in served
    ForecastOut.model_validate(served)
    # Bands recalibrated on scored forecasts add their raw band and the margins applied.
    moved = calibrate_bands(served, {"utilization": Margin(0.05, 12), "queue_length": Margin(-0.5, 30)})
    checked = ForecastOut.model_validate(moved)
    assert checked.band_calibration is not None and set(checked.band_calibration.figures) == {
        "utilization", "queue_length"
    }  # fmt: skip
    drawn = client.get("/v1/forecast/vs-actual", headers=headers)
    assert drawn.status_code == 200, drawn.text
    VsActualOut.model_validate(drawn.json())
    SkillOut.model_validate(client.get("/v1/forecast/skill", headers=headers).json())
    body = {"runs": 4, "horizon": "2h", "changes": {"policy": "backfill"}}
    whatif = client.post("/v1/whatif", json=body, headers=headers)
    assert whatif.status_code == 200, whatif.text
    WhatIfOut.model_validate(whatif.json())


@pytest.mark.parametrize("schema", [ForecastOut, WhatIfOut])
def test_a_key_the_schema_does_not_name_fails_it(api: Any, schema: type[BaseModel]) -> None:
    """What keeps a schema from falling behind its document: an undocumented key is refused, at any depth."""
    client, headers = api
    if schema is ForecastOut:
        answer = client.post("/v1/forecast/refresh", headers=headers).json()
    else:
        answer = client.post("/v1/whatif", json={"runs": 2, "horizon": "1h"}, headers=headers).json()
    schema.model_validate(answer)
    figures = answer["summary"] if schema is ForecastOut else answer["difference"]
    figures["utilization"]["p50"] = 0.5
    with pytest.raises(ValidationError, match="p50"):
        schema.model_validate(answer)
    del figures["utilization"]["p50"]
    del figures["gpu_hours"]
    with pytest.raises(ValidationError, match="gpu_hours"):
        schema.model_validate(answer)
