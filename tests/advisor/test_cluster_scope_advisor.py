"""Each cluster's API steers its own cluster: the recommendations, SLOs and capacity plans it shows and acts
on are those of the cluster it serves (FINETWIN_CLUSTER_ID), on a store that holds several. Before, two APIs
on one store listed and decided each other's recommendations, one cluster's steering superseded the other's
pending recommendation for the same target, the SLOs declared for one were steered toward on the other, a
plan of one was recommended on the other, and an approved action did not say which cluster was to apply it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine
from sqlmodel import Session, col, select

from advisor import plan_jobs, workflow
from advisor.records import OutboxMessage, Recommendation
from finetwin.schema import migrate
from tests.advisor.conftest import advisor_settings
from tests.advisor.fakes import FakeInUse, FakeModels
from tests.advisor.seed import seed_overloaded_cluster
from tests.advisor.test_one_pending_per_target import done_plan
from tests.advisor.test_steering import WAIT_SLO
from tests.advisor.test_workflow import proposal
from tests.conftest import api_app, api_headers
from twin.db import make_engine, session_scope

CLUSTERS = ("lab-a", "lab-b")
OTHER = {"lab-a": "lab-b", "lab-b": "lab-a"}


@contextmanager
def api_of(
    cluster_id: str, engine: Engine, tmp_path: Path, in_use: FakeInUse | None = None, **settings: Any
) -> Iterator[TestClient]:
    """The API of `cluster_id` on the shared store, as an approver."""
    configured = advisor_settings(tmp_path / cluster_id, cluster_id=cluster_id, **settings)
    app = api_app(configured, engine, in_use)
    with TestClient(app, headers=api_headers(engine, "approver", name=cluster_id)) as client:
        yield client


def propose_on(engine: Engine, cluster_id: str, title: str, target: str = "policy") -> str:
    with session_scope(engine) as session:
        (rec,) = workflow.propose(
            session, [proposal(target=target, title=title)], cluster_id=cluster_id, actor="system",
            source="schedule", ttl=timedelta(hours=1),
        )  # fmt: skip
        return rec.id


def recommendation_gauge(client: TestClient) -> dict[str, float]:
    return {
        sample.labels["state"]: sample.value
        for family in text_string_to_metric_families(client.get("/metrics").text)
        if family.name == "finetwin_recommendations"
        for sample in family.samples
    }


def audit_rows(entries: list[dict[str, Any]]) -> list[tuple[str, str, str | None]]:
    """(subject, to state, cluster) of each entry, a key's subject as `api_key`."""
    return [
        ("api_key" if e["subject"].startswith("api_key:") else e["subject"], e["to_state"], e["cluster_id"])
        for e in entries
    ]


def test_each_cluster_lists_and_decides_only_its_own_recommendations(engine: Engine, tmp_path: Path) -> None:
    # One target on each cluster, lab-b's twice: its second supersedes its first, and neither lab-a's.
    first = {c: propose_on(engine, c, f"round robin on {c}") for c in CLUSTERS}
    newer_b = propose_on(engine, "lab-b", "round robin on lab-b, again")
    shown = {}
    for cluster_id in CLUSTERS:
        other = first[OTHER[cluster_id]]
        with api_of(cluster_id, engine, tmp_path) as api:
            shown[cluster_id] = {
                "listed": api.get("/v1/recommendations").json(),
                "own": api.get(f"/v1/recommendations/{first[cluster_id]}"),
                "other's": [
                    api.get(f"/v1/recommendations/{other}"),
                    api.post(f"/v1/recommendations/{other}/approve", json={}),
                    api.post(f"/v1/recommendations/{other}/reject", json={"comment": "not ours"}),
                ],
                "gauge": recommendation_gauge(api),
                "audit": api.get("/v1/audit").json()["entries"],
            }

    a, b = shown["lab-a"], shown["lab-b"]
    assert a["listed"]["total"] == 1
    assert [(r["id"], r["cluster_id"], r["state"]) for r in a["listed"]["recommendations"]] == [
        (first["lab-a"], "lab-a", "pending")
    ]
    assert b["listed"]["total"] == 2
    assert [(r["id"], r["state"], r["superseded_by"]) for r in b["listed"]["recommendations"]] == [
        (newer_b, "pending", None),
        (first["lab-b"], "superseded", newer_b),
    ]
    for cluster_id, seen in shown.items():
        assert seen["own"].status_code == 200 and seen["own"].json()["cluster_id"] == cluster_id
        for refused in seen["other's"]:
            assert refused.status_code == 404, refused.text
            assert refused.json()["detail"] == (
                f"no recommendation {first[OTHER[cluster_id]]!r} in cluster {cluster_id!r}"
            )
    assert a["gauge"] == {"pending": 1}
    assert b["gauge"] == {"pending": 1, "superseded": 1}

    # Each audit log: its cluster's recommendations' entries, newest first, after the store's entries of the
    # keys made since for each API as it was asked (a key works on every cluster's API).
    key = ("api_key", "approver", None)
    assert audit_rows(a["audit"]) == [key, (f"recommendation:{first['lab-a']}", "pending", "lab-a")]
    assert audit_rows(b["audit"]) == [
        key,
        key,
        (f"recommendation:{newer_b}", "pending", "lab-b"),
        (f"recommendation:{first['lab-b']}", "superseded", "lab-b"),
        (f"recommendation:{first['lab-b']}", "pending", "lab-b"),
    ]

    # Neither API's refused decisions touched the other's: lab-a's is pending, and lab-a approves it.
    with api_of("lab-a", engine, tmp_path) as api:
        approved = api.post(f"/v1/recommendations/{first['lab-a']}/approve", json={"comment": "go"})
    assert approved.status_code == 200 and approved.json()["state"] == "approved"
    with Session(engine) as session:
        (message,) = session.exec(select(OutboxMessage)).all()
    # Every cluster's actions share the topic: the message says which cluster is to apply it.
    assert (message.key, message.payload["cluster_id"]) == (first["lab-a"], "lab-a")


def test_each_cluster_has_its_own_slos(engine: Engine, tmp_path: Path) -> None:
    lab_b_slos = {"slos": [{"name": "utilization >= 50 %", "metric": "utilization", "min": 0.5}]}
    with api_of("lab-a", engine, tmp_path) as api:
        assert api.put("/v1/slos", json=WAIT_SLO).status_code == 200
    with api_of("lab-b", engine, tmp_path) as api:
        before = api.get("/v1/slos").json()
        assert api.put("/v1/slos", json=lab_b_slos).status_code == 200
        audit = api.get("/v1/audit", params={"subject": "slos:lab-b"}).json()
    with api_of("lab-a", engine, tmp_path) as api:
        after = api.get("/v1/slos").json()
    assert before["source"] == "default"  # lab-a's declaration is not lab-b's
    assert after["source"] == "api"  # and lab-b's declaration is not lab-a's
    assert [s["name"] for s in after["slos"]] == [WAIT_SLO["slos"][0]["name"]]
    assert [(e["subject"], e["reason"]) for e in audit["entries"]] == [("slos:lab-b", "utilization >= 50 %")]


def test_a_clusters_capacity_plan_is_not_anothers(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plan_jobs, "MAX_KEPT", 1)  # each cluster keeps its newest plan only
    with api_of("lab-a", engine, tmp_path) as api:
        plan_id = done_plan(api)
    with api_of("lab-b", engine, tmp_path) as api:
        lab_b_plan = done_plan(api)  # newer than lab-a's, which lab-b's API does not prune
        listed = [p["id"] for p in api.get("/v1/plan").json()]
        refused = [api.get(f"/v1/plan/{plan_id}"), api.post(f"/v1/plan/{plan_id}/recommend")]
    with api_of("lab-a", engine, tmp_path) as api:
        own = [p["id"] for p in api.get("/v1/plan").json()]
        made = api.post(f"/v1/plan/{plan_id}/recommend")
    assert listed == [lab_b_plan] and own == [plan_id]
    for response in refused:
        assert response.status_code == 404, response.text
        assert response.json()["detail"].startswith(f"no plan {plan_id!r} in cluster 'lab-b'")
    assert made.status_code == 200, made.text
    with Session(engine) as session:
        rec = session.get(Recommendation, made.json()["recommendation_id"])
        assert rec is not None and (rec.cluster_id, rec.target) == ("lab-a", "capacity")


def test_each_clusters_steering_recommends_for_its_own_cluster(sqlite_url: str, tmp_path: Path) -> None:
    """Two overloaded clusters of one GPU type: each one's steering recommends a node more of it, for the
    same target; lab-b's run leaves lab-a's recommendation pending."""
    engine = make_engine(sqlite_url)
    migrate(engine)
    for cluster_id in CLUSTERS:
        seed_overloaded_cluster(engine, cluster_id=cluster_id)
    runs = {}
    for cluster_id in CLUSTERS:
        with api_of(
            cluster_id, engine, tmp_path, FakeInUse(FakeModels()), steering_replications=4,
            steering_horizon_hours=12,
        ) as api:  # fmt: skip
            assert api.put("/v1/slos", json=WAIT_SLO).status_code == 200
            runs[cluster_id] = api.post("/v1/recommendations/run").json()
    added = {}
    for cluster_id, run in runs.items():
        kinds = {r["kind"]: r for r in run["recommendations"]}
        assert "add_nodes" in kinds, run
        assert {r["cluster_id"] for r in run["recommendations"]} == {cluster_id}
        added[cluster_id] = kinds["add_nodes"]
    assert added["lab-a"]["target"] == added["lab-b"]["target"] == "nodes:NVIDIA-A100-SXM4-80GB"
    with Session(engine) as session:
        query = select(Recommendation.cluster_id, Recommendation.state).where(
            col(Recommendation.id).in_([r["id"] for r in added.values()])
        )
        assert sorted(session.exec(query).all()) == [("lab-a", "pending"), ("lab-b", "pending")]


# --- the store before the revision that gave each row its cluster (0018) ------------------------------------


def _fill_before_0018(engine: Engine, node_clusters: list[str]) -> None:
    """A recommendation, an SLO set and a plan, as a store at revision 0017 held them, and a node of each
    of `node_clusters`."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    with engine.begin() as connection:
        tables = sa.MetaData()
        tables.reflect(connection, only=["nodes", "recommendations", "slo_sets", "capacity_plans"])
        nodes, recommendations = tables.tables["nodes"], tables.tables["recommendations"]
        slo_sets, capacity_plans = tables.tables["slo_sets"], tables.tables["capacity_plans"]
        for k, cluster_id in enumerate(node_clusters):
            connection.execute(
                nodes.insert().values(
                    node_id=f"n{k}",
                    cluster_id=cluster_id,
                    gpu_model="L40S",
                    gpu_count=8,
                    status="up",
                    updated_at=at,
                )  # fmt: skip
            )
        connection.execute(
            recommendations.insert().values(
                id=str(uuid.uuid4()),
                kind="policy",
                target="policy",
                title="t",
                action={},
                effect={},
                cost=1.0,
                score=1.0,
                state="pending",
                source="schedule",
                created_at=at,
                expires_at=at,
            )  # fmt: skip
        )
        connection.execute(slo_sets.insert().values(created_at=at, created_by="ops", document={"slos": []}))
        connection.execute(
            capacity_plans.insert().values(
                id=str(uuid.uuid4()), created_at=at, updated_at=at, status="done", done=1, total=1, owner="o"
            )
        )


@pytest.mark.parametrize(
    ("node_clusters", "theirs"),
    [(["lab-a", "lab-a"], "lab-a"), (["lab-a", "lab-b"], "default"), ([], "default")],
    ids=["one cluster", "two clusters", "no nodes"],
)
def test_rows_stored_before_are_the_stores_one_cluster(
    database_url: str, node_clusters: list[str], theirs: str
) -> None:
    engine = make_engine(database_url)
    migrate(engine, "0017")
    _fill_before_0018(engine, node_clusters)
    migrate(engine)
    with engine.connect() as connection:
        for table in ("recommendations", "slo_sets", "capacity_plans"):
            clusters = connection.execute(sa.text(f"SELECT cluster_id FROM {table}")).scalars().all()
            assert clusters == [theirs], table
    engine.dispose()


def test_a_key_for_one_cluster_is_taken_by_that_clusters_api_alone(engine: Engine, tmp_path: Path) -> None:
    """`finetwin keys create --cluster lab-a`: lab-b's API refuses it (401, saying why) for reads and
    decisions alike, and a key for every cluster (the default, and every key from before 0019) works on
    both. The key's creation is lab-a's in the audit log."""
    from advisor.auth import Role, parse_key_id
    from advisor.keys import create_api_key

    lab_a_key = create_api_key(engine, Role.APPROVER, name="lab-a ops", actor="test", cluster_id="lab-a")
    everywhere = create_api_key(engine, Role.VIEWER, name="reader", actor="test")
    pending_b = propose_on(engine, "lab-b", "round robin on lab-b")
    answers = {}
    for cluster_id in CLUSTERS:
        with api_of(cluster_id, engine, tmp_path) as api:
            answers[cluster_id] = {
                "read": api.get("/v1/cluster", headers={"X-API-Key": lab_a_key}),
                "approve": api.post(
                    f"/v1/recommendations/{pending_b}/approve", json={}, headers={"X-API-Key": lab_a_key}
                ),
                "everywhere": api.get("/v1/cluster", headers={"X-API-Key": everywhere}),
                "audit": api.get("/v1/audit").json()["entries"],
            }
    assert answers["lab-a"]["read"].status_code == 200
    assert answers["lab-a"]["approve"].status_code == 404  # lab-b's recommendation is not lab-a's to see
    for refused in (answers["lab-b"]["read"], answers["lab-b"]["approve"]):
        assert refused.status_code == 401, refused.text
        assert refused.json()["detail"] == "this key is for cluster 'lab-a'; this API serves cluster 'lab-b'"
    assert all(answers[c]["everywhere"].status_code == 200 for c in CLUSTERS)
    with Session(engine) as session:
        assert session.get(Recommendation, pending_b).state == "pending"  # type: ignore[union-attr]
    subject = f"api_key:{parse_key_id(lab_a_key)}"
    assert [e["cluster_id"] for e in answers["lab-a"]["audit"] if e["subject"] == subject] == ["lab-a"]
    assert not [e for e in answers["lab-b"]["audit"] if e["subject"] == subject]
