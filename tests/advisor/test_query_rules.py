"""Query parameters say what they mean, and offset pages hold each row once, on SQLite and PostgreSQL.

A single-valued parameter given twice kept its last value: `?state=running&state=completed` (which many
clients write to mean either) answered the completed jobs alone, and `?limit=1&limit=3` three entries. The
recommendations were sorted by keys that rows can share (pending first, score, time), so rows equal in all
of them could swap places between two page requests: one row on two pages, another on none.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from advisor import workflow
from tests.advisor.test_workflow import proposal
from twin.db import session_scope
from twin.store import utcnow


@pytest.mark.parametrize(
    ("query", "name", "values"),
    [
        ("/v1/jobs?state=running&state=completed", "state", ["running", "completed"]),
        ("/v1/audit?limit=1&limit=3", "limit", ["1", "3"]),
        ("/v1/recommendations?offset=0&state=pending&offset=10", "offset", ["0", "10"]),
        ("/v1/jobs?limit=5&limit=5", "limit", ["5", "5"]),  # the same value twice is no clearer
    ],
)
def test_a_parameter_given_twice_is_a_422_that_names_it(
    client: TestClient, keys: dict, query: str, name: str, values: list[str]
) -> None:
    response = client.get(query, headers=keys["viewer"])
    assert response.status_code == 422, response.text
    (error,) = response.json()["errors"]
    assert error["loc"] == ["query", name] and error["type"] == "repeated_parameter"
    given = ", ".join(repr(v) for v in values)
    assert (
        response.json()["detail"]
        == f"query.{name}: given 2 times ({given}); it takes one value, so give it once"
    )


def test_a_repeated_and_an_unknown_parameter_are_both_said(client: TestClient, keys: dict) -> None:
    response = client.get("/v1/jobs?status=running&state=running&state=failed", headers=keys["viewer"])
    assert response.status_code == 422
    assert [(e["loc"], e["type"]) for e in response.json()["errors"]] == [
        (["query", "status"], "extra_forbidden"),
        (["query", "state"], "repeated_parameter"),
    ]


def test_every_v1_read_refuses_each_of_its_parameters_given_twice(client: TestClient, keys: dict) -> None:
    document = client.get("/openapi.json").json()
    checked = 0
    for path, operations in document["paths"].items():
        if not path.startswith("/v1/") or "{" in path or "get" not in operations:
            continue
        for parameter in operations["get"].get("parameters", []):
            if parameter["in"] != "query":
                continue
            name = parameter["name"]
            response = client.get(f"{path}?{name}=1&{name}=2", headers=keys["viewer"])
            assert response.status_code == 422 and response.json()["errors"][0]["loc"] == ["query", name], (
                path
            )
            checked += 1
    assert checked >= 8, checked
    # Once is as before.
    assert client.get("/v1/jobs?state=running&limit=3", headers=keys["viewer"]).status_code == 200


def test_recommendations_equal_in_every_sort_key_come_in_one_order_page_after_page(
    client: TestClient, keys: dict, engine: Engine
) -> None:
    """One steering run records its proposals at one instant; equal scores are common (the same effect per
    GPU-hour). The id breaks the tie, so a walk by `offset` sees each once."""
    now = utcnow()
    with session_scope(engine) as session:
        recs = workflow.propose(
            session,
            [proposal(target=f"target-{i}") for i in range(12)],  # the same score for all
            cluster_id="default",
            actor="system",
            source="schedule",
            ttl=timedelta(hours=1),
            now=now,
        )
        made = [r.id for r in recs]
    walked = []
    for offset in range(len(made)):
        page = client.get(f"/v1/recommendations?limit=1&offset={offset}", headers=keys["viewer"]).json()
        walked.extend(r["id"] for r in page["recommendations"])
    assert walked == sorted(made)
    whole = client.get("/v1/recommendations?limit=100", headers=keys["viewer"]).json()
    assert [r["id"] for r in whole["recommendations"]] == walked
