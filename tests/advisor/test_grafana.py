"""deploy/grafana: the provisioned dashboard asks Prometheus only for metrics finetwin exports, and the
compose file mounts it (a panel over a misspelled metric is an empty graph nobody notices)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine

import ingest.worker  # noqa: F401  (its counters are in the process registry, as in `finetwin ingest`)
from finetwin.settings import Settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "finetwin.json"
METRIC = re.compile(r"\bfinetwin_[a-z0-9_]+\b")


def exported_names(text: str) -> set[str]:
    """Every series name a scrape can hold: families (even without samples yet) and their samples."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        if family.type == "counter":
            names |= {f"{family.name}_total", f"{family.name}_created"}
        names |= {sample.name for sample in family.samples}
    return names


def test_every_dashboard_query_names_an_exported_metric(client: TestClient) -> None:
    response = client.get("/metrics")
    assert response.status_code == 200
    exported = exported_names(response.text)
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(queries) >= 10
    for query in queries:
        named = METRIC.findall(query)
        assert named, f"a query that names no finetwin metric: {query}"
        for name in named:
            assert name in exported, f"{query}: {name} is not exported (have: {sorted(exported)})"


def test_the_dashboard_covers_what_an_operator_watches() -> None:
    text = DASHBOARD.read_text()
    for metric in (
        "finetwin_ingest_events_applied_total", "finetwin_ingest_lag_messages",
        "finetwin_ingest_dead_letters_total", "finetwin_forecast_wape", "finetwin_forecast_coverage",
        "finetwin_model_live_error", "finetwin_recommendations", "finetwin_forecast_skill_score",
        "finetwin_forecast_slo_brier_skill",
    ):  # fmt: skip
        assert metric in text, metric


def test_compose_provisions_prometheus_and_grafana_with_the_dashboard() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    grafana_mounts = [v.split(":")[0] for v in services["grafana"]["volumes"]]
    for mount in grafana_mounts:
        assert (DEPLOY / mount).exists(), mount
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/finetwin.yaml").read_text())
    inside = provider["providers"][0]["options"]["path"]
    assert any(v.endswith(f":{inside}:ro") for v in services["grafana"]["volumes"])
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    ports = {c["job_name"]: c for c in scrape["scrape_configs"]}
    assert "--metrics-port" in services["ingest"]["command"]
    port = services["ingest"]["command"][services["ingest"]["command"].index("--metrics-port") + 1]
    assert ports["finetwin-ingest"]["dns_sd_configs"][0]["port"] == int(port)


def test_each_clusters_gauges_are_picked_by_the_dashboards_cluster_variable(
    engine: Engine, settings: Settings
) -> None:
    """With an API per cluster, Prometheus holds each cluster's gauges under its `cluster` label: every panel
    over them keeps to the clusters picked in `$cluster`, whose values are read from one of them."""
    from advisor.routers.health import _NOT_A_CLUSTERS, _StoreCollector

    families = {family.name for family in _StoreCollector(engine, "lab-a", settings)._families()}
    per_cluster = families - _NOT_A_CLUSTERS
    assert per_cluster and families >= _NOT_A_CLUSTERS
    dashboard = json.loads(DASHBOARD.read_text())
    (variable,) = dashboard["templating"]["list"]
    assert variable["name"] == "cluster" and variable["includeAll"] and variable["multi"]
    assert re.fullmatch(r"label_values\((finetwin_\w+), cluster\)", variable["query"]["query"])
    assert METRIC.findall(variable["query"]["query"])[0] in per_cluster
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            if set(METRIC.findall(target["expr"])) & per_cluster:
                assert '{cluster=~"$cluster"}' in target["expr"], target["expr"]
                assert "{{cluster}}" in target["legendFormat"], target
            else:
                assert "$cluster" not in target["expr"], target["expr"]
