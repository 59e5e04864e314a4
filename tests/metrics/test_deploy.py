"""deploy/prometheus.yml and deploy/grafana-dashboard.json: valid, and about what /metrics exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.metrics.conftest import names, needs_promtool, promtool

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def dashboard() -> dict:
    return json.loads((DEPLOY / "grafana-dashboard.json").read_text())


def expressions(board: dict) -> list[str]:
    exprs = [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]
    return exprs + [var["definition"] for var in board["templating"]["list"] if "definition" in var]


def test_the_dashboard_takes_its_prometheus_from_a_variable():
    board = dashboard()
    variables = {var["name"]: var for var in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    drawn = [panel for panel in board["panels"] if panel["type"] != "row"]
    assert len(drawn) >= 8
    for panel in drawn:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert all(target["datasource"]["uid"] == "${datasource}" for target in panel["targets"])
    assert len({panel["id"] for panel in board["panels"]}) == len(board["panels"])


@pytest.mark.usefixtures("lab")
def test_every_metric_the_dashboard_uses_is_exported(scrape):
    used = {name for expr in expressions(dashboard()) for name in re.findall(r"\bgpubook_[a-z_]+\b", expr)}
    exported = names(scrape())
    assert used, "the dashboard uses no gpubook_ metric"
    assert used <= exported, used - exported
    panels = {"utilization_ratio", "memory_used_bytes", "temperature_celsius", "power_watts"}
    wanted = {f"gpubook_gpu_{name}" for name in panels} | {"gpubook_node_up", "gpubook_reservations"}
    wanted |= {"gpubook_pending_approvals", "gpubook_agent_last_report_age_seconds", "gpubook_agent_lease_version_lag"}
    assert wanted <= used, wanted - used


@needs_promtool
def test_the_dashboard_queries_are_valid_promql(tmp_path):
    """promtool parses each query as a recording rule (the variables filled in)."""
    rules = [
        {"record": f"gpubook:dashboard_query_{i}", "expr": expr.replace("$node", ".*")}
        for i, expr in enumerate(expressions(dashboard()))
        if not expr.startswith("label_values(")  # Grafana's own function, not PromQL
    ]
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))  # JSON is YAML
    assert "SUCCESS" in promtool("check", "rules", str(path))


@needs_promtool
def test_the_scrape_example_is_a_valid_prometheus_config(tmp_path):
    text = (DEPLOY / "prometheus.yml").read_text()
    assert "metrics_path: /metrics" in text
    assert "type: Bearer" in text
    token = tmp_path / "token"
    token.write_text("a-token\n")
    config = tmp_path / "prometheus.yml"
    config.write_text(text.replace("/etc/prometheus/gpubook-metrics-token", str(token)))
    assert "SUCCESS" in promtool("check", "config", str(config))
