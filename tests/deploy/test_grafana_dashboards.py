"""deploy/ for observability: the Grafana dashboards graph only what the gateway exports, and
docker-compose.yml's `tracing` and `monitoring` profiles add services without changing what a
plain `docker compose up` starts.

The dashboards are checked against the real app's /metrics (at the path deploy/prometheus.yml
scrapes): every metric family a PromQL expression names must be exported, with the labels it
selects or groups by. No Docker here: the compose file is checked as data.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway.ops.metrics import METRICS, PREFIX
from tests.helpers.otlp import Collector, tracing_env
from tests.helpers.proxying import AppFactory

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = ROOT / "docker-compose.yml"
DASHBOARDS = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))

# What `docker compose up` starts without a profile, as before the observability profiles.
DEFAULT_SERVICES = {"gateway-1", "gateway-2", "nginx", "postgres", "redis"}
PROFILES = {"jaeger": ["tracing"], "prometheus": ["monitoring"], "grafana": ["monitoring"]}
# Labels Prometheus adds to every scraped series, and the one of histogram buckets.
SCRAPE_LABELS = {"instance", "job"}

METRIC = re.compile(r"\bmcp_gateway_[a-z0-9_]+")
SELECTOR = re.compile(r"\b(mcp_gateway_[a-z0-9_]+)\{([^}]*)\}")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
SUFFIXES = {"_total": "counter", "_bucket": "histogram", "_sum": "histogram", "_count": "histogram"}


def load_dashboard(path: Path) -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(path.read_text())
    return dashboard


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel that queries, collapsed rows' panels included."""
    found = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def expressions(dashboard: dict[str, Any]) -> list[str]:
    """The PromQL of every target, and the queries of the template variables."""
    exprs = [target["expr"] for panel in panels(dashboard) for target in panel["targets"]]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def family_of(sample: str) -> tuple[str, str]:
    """(family, its type) a sample name belongs to: mcp_gateway_probes_total is the counter
    mcp_gateway_probes; a name without a known suffix is a gauge."""
    for suffix, kind in SUFFIXES.items():
        if sample.endswith(suffix):
            return sample.removesuffix(suffix), kind
    return sample, "gauge"


def used_by_dashboards() -> dict[str, list[str]]:
    """Sample name -> the expressions that use it, over every dashboard."""
    used: dict[str, list[str]] = {}
    for path in DASHBOARDS:
        for expr in expressions(load_dashboard(path)):
            for name in METRIC.findall(expr):
                used.setdefault(name, []).append(expr)
    return used


def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return document


def prometheus_config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    return config


# -- the dashboards as files ------------------------------------------------------------------


def test_there_are_dashboards() -> None:
    assert DASHBOARDS, "no deploy/grafana/dashboards/*.json"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda path: path.name)
def test_every_panel_queries_the_chosen_prometheus(path: Path) -> None:
    dashboard = load_dashboard(path)
    assert dashboard["uid"] and dashboard["title"]
    # Grafana migrates older documents on load; this is the JSON model of Grafana 10.4 to 12.
    assert 39 <= dashboard["schemaVersion"] <= 41
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    chosen = {"type": "prometheus", "uid": "${datasource}"}
    rows = [panel for panel in dashboard["panels"] if panel["type"] == "row"]
    ids = [panel["id"] for panel in [*rows, *panels(dashboard)]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    assert panels(dashboard)
    for panel in panels(dashboard):
        where = f"{path.name}: panel {panel['title']!r}"
        assert panel["datasource"] == chosen, where
        assert panel["targets"], f"{where} has no targets"
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), f"{where}: refIds repeat"
        for target in panel["targets"]:
            assert target["datasource"] == chosen, where
            assert METRIC.search(target["expr"]), f"{where}: no mcp_gateway_ metric"
            assert target["expr"].count("(") == target["expr"].count(")"), where
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, where
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == chosen, variable["name"]


def test_quantiles_are_taken_over_bucket_rates_kept_by_le() -> None:
    for name, exprs in used_by_dashboards().items():
        for expr in exprs:
            if name.endswith("_bucket"):
                assert "histogram_quantile(" in expr and re.search(r"by \([^)]*\ble\b", expr), expr
                assert f"rate({name}" in expr, expr


# -- the dashboards against the real /metrics ---------------------------------------------------


async def test_every_metric_the_dashboards_use_is_exported(
    make_api: AppFactory, collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With tracing on: its span counter is on the dashboard too.
    tracing_env(monkeypatch, collector.endpoint)
    api = await make_api(tracing=True)
    [job] = prometheus_config()["scrape_configs"]
    reply = await api.get(job["metrics_path"], expect=200)
    families: dict[str, str] = {}
    labels: dict[str, set[str]] = {}
    for exported in text_string_to_metric_families(reply.body):
        families[exported.name] = exported.type
        labels[exported.name] = {key for sample in exported.samples for key in sample.labels}
    # A family without samples yet (no probe ran) says its labels only in the app's metrics.
    for series in api.app[METRICS].series():
        labels.setdefault(PREFIX + series.name, set()).update([*series.labelnames, "worker"])

    used = used_by_dashboards()
    assert used, "the dashboards use no mcp_gateway_ metric"
    for name, exprs in sorted(used.items()):
        family, kind = family_of(name)
        assert family in families, f"{name} is not exported by /metrics: {exprs[0]}"
        assert families[family] == kind, f"{name}: {family} is a {families[family]}"
        allowed = labels[family] | SCRAPE_LABELS | ({"le"} if kind == "histogram" else set())
        for expr in exprs:
            for selected, matchers in SELECTOR.findall(expr):
                if selected == name:
                    unknown = set(MATCHER.findall(matchers)) - allowed
                    assert not unknown, f"{name} has no label {unknown}: {expr}"
            for grouping in GROUPING.findall(expr):
                unknown = {label.strip() for label in grouping.split(",")} - allowed
                assert not unknown, f"{name} has no label {unknown}: {expr}"
            for variable in re.findall(r"label_values\(\s*" + name + r"\b[^,]*,\s*(\w+)\)", expr):
                assert variable in allowed, f"{name} has no label {variable}: {expr}"


# -- docker-compose.yml -----------------------------------------------------------------------


def test_the_profiles_leave_plain_compose_up_as_it_was() -> None:
    services = compose()["services"]
    assert {name for name, s in services.items() if "profiles" not in s} == DEFAULT_SERVICES
    assert {name: s.get("profiles") for name, s in services.items() if "profiles" in s} == (
        PROFILES
    )
    for name in DEFAULT_SERVICES:
        depends_on = services[name].get("depends_on", {})
        assert not set(depends_on) & set(PROFILES), f"{name} would pull a profile's service in"
    # compose interpolates every service, started or not: a required ${VAR:?...} in a
    # profile's service would stop a plain `docker compose up` while VAR is unset.
    for name in PROFILES:
        assert ":?" not in yaml.safe_dump(services[name]), name


def test_tracing_is_off_unless_the_environment_turns_it_on() -> None:
    for name in ("gateway-1", "gateway-2"):
        environment = compose()["services"][name]["environment"]
        assert environment["OTEL_EXPORTER_OTLP_ENDPOINT"] == "${OTEL_EXPORTER_OTLP_ENDPOINT:-}"
        assert environment["GATEWAY_TRACE_URL"] == "${GATEWAY_TRACE_URL:-}"
    # What deploy/compose.env.example says to set with --profile tracing reaches Jaeger.
    example = (DEPLOY / "compose.env.example").read_text()
    settings = dict(
        re.findall(r"^#?(OTEL_EXPORTER_OTLP_ENDPOINT|GATEWAY_TRACE_URL)=(.+)$", example, re.M)
    )
    endpoint = urlsplit(settings["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert (endpoint.hostname, endpoint.port) == ("jaeger", 4318)  # OTLP over HTTP
    assert "{trace_id}" in settings["GATEWAY_TRACE_URL"]
    assert compose()["services"]["jaeger"]["image"].startswith("jaegertracing/all-in-one:")


def test_every_file_a_service_mounts_is_in_the_repository() -> None:
    mounts: dict[str, str] = {}
    for name, service in compose()["services"].items():
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which is missing"
                mounts[source] = target
    assert mounts["./deploy/prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    provisioning = DEPLOY / "grafana" / "provisioning"
    [provider] = yaml.safe_load((provisioning / "dashboards" / "mcp-gateway.yml").read_text())[
        "providers"
    ]
    assert provider["options"]["path"] == mounts["./deploy/grafana/dashboards"]
    [source] = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert source["type"] == "prometheus"
    assert urlsplit(source["url"]).hostname in compose()["services"]


def test_prometheus_scrapes_every_replica() -> None:
    [job] = prometheus_config()["scrape_configs"]
    [targets] = job["static_configs"]
    replicas = {n for n in compose()["services"] if n.startswith("gateway-")}
    assert set(targets["targets"]) == {f"{name}:8080" for name in replicas}
    assert "authorization" not in job  # /metrics is public (docs/operations.md, Metrics)
