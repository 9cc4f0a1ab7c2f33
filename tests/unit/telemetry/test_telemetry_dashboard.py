"""The Grafana dashboard in deploy/grafana reads only series that telemetry exports, so a
renamed metric fails here rather than as an empty panel; the profiling, NVLink, row-remap
and retired-page families have their panels and the chart's alert rules read them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from gpuop.services.telemetry import catalog
from gpuop.services.telemetry.instruments import ExporterMetrics
from gpuop.services.telemetry.operator_metrics import OperatorMetrics
from tests.support.telemetry import ISSUE_38

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy/grafana/gpuop-telemetry.json"
ALERTS = Path(__file__).resolve().parents[3] / "deploy/helm/gpuop/templates/prometheusrule.yaml"
ALERTED = ISSUE_38 - {
    "DCGM_FI_PROF_SM_OCCUPANCY",  # how well a program fills the GPU is not an operator's alarm
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
    "DCGM_FI_DEV_RETIRED_SBE",  # single-bit errors are corrected; DBE and pending alert
}
"""Of those, the ones an alert reads; the others are the dashboard's only."""
SERIES = re.compile(r"\b(DCGM_\w+|gpuop_\w+)")


def exported() -> set[str]:
    registry = CollectorRegistry()
    ExporterMetrics(registry)
    OperatorMetrics(registry)
    samples = {sample.name for family in registry.collect() for sample in family.samples}
    return samples | set(catalog.NAMES)


def expressions(document: object) -> list[str]:
    if isinstance(document, dict):
        found = [document["expr"]] if isinstance(document.get("expr"), str) else []
        query = document.get("query")
        if isinstance(query, dict) and isinstance(query.get("query"), str):
            found.append(query["query"])
        return found + [e for value in document.values() for e in expressions(value)]
    if isinstance(document, list):
        return [e for value in document for e in expressions(value)]
    return []


def test_every_series_the_dashboard_queries_is_exported() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = expressions(dashboard)

    referenced = {name for query in queries for name in SERIES.findall(query)}

    assert len(queries) > 25
    assert referenced - exported() == set()
    for name in ("DCGM_FI_DEV_GPU_TEMP", "gpuop_upgrade_nodes", "gpuop_rollout_progress_ratio"):
        assert name in referenced


def test_panels_have_unique_ids_and_use_the_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]

    assert len({panel["id"] for panel in panels}) == len(panels)
    for panel in panels:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"


def test_every_family_issue_38_added_has_a_panel_and_the_alerts_read_theirs() -> None:
    referenced = {
        name
        for query in expressions(json.loads(DASHBOARD.read_text()))
        for name in SERIES.findall(query)
    }
    alerted = set(SERIES.findall(ALERTS.read_text()))

    assert {metric.name for metric in catalog.METRICS} >= ISSUE_38
    assert ISSUE_38 - referenced == set()
    assert ALERTED - alerted == set()
    assert {"DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_PENDING"} <= alerted


def test_mig_instance_series_are_told_apart_in_the_profiling_panels() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    sm_active = next(p for p in panels if p["title"] == "SM active")

    assert "{{GPU_I_ID}}" in sm_active["targets"][0]["legendFormat"]
