"""The Grafana dashboard and its provisioning examples."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.ops.tools import DASHBOARD, ROOT, dashboard, expressions, metric_names

PROVISIONING = ROOT / "etc" / "grafana" / "provisioning"


def test_provisionable_with_a_datasource_variable() -> None:
    text = DASHBOARD.read_text()
    document = dashboard()
    assert "__inputs" not in document and "${DS_" not in text
    variables = {v["name"]: v for v in document["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in document["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
    assert document["uid"] and document["editable"] is False


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    panels = dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, (panel["title"], cells.get((x, y)))
                cells[(x, y)] = panel["title"]


def test_the_dashboard_covers_what_operators_watch() -> None:
    used = set().union(*(metric_names(e) for e in expressions()))
    for name in (
        "sparkd_cluster_phase",
        "sparkd_probe_duration_seconds_bucket",
        "sparkd_probe_ttft_seconds_bucket",
        "sparkd_probes_total",
        "sparkd_probe_reasoning_only_ratio",
        "sparkd_probe_last_completion_tokens",
        "sparkd_ray_gpus",
        "sparkd_ray_gpus_desired",
        "sparkd_model_load_progress_ratio",
        "sparkd_model_load_eta_seconds",
        "sparkd_remediations_total",
        "sparkd_host_up",
        "sparkd_reconcile_duration_seconds_bucket",
        "sparkd_cluster_triage",
        "sparkd_host_kernel_events_total",
        "sparkd_gpu_xid_total",
        "sparkd_host_memory_available_bytes",
        "sparkd_fabric_link_up",
    ):
        assert name in used, name
    kinds = {p["type"] for p in dashboard()["panels"]}
    assert "state-timeline" in kinds


def test_provisioning_examples() -> None:
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "sparkd.yml").read_text())
    [provider] = providers["providers"]
    assert provider["type"] == "file" and provider["allowUiUpdates"] is False
    assert Path(provider["options"]["path"]).is_absolute()
    sources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())
    [source] = sources["datasources"]
    assert source["type"] == "prometheus" and source["url"].startswith("http://127.0.0.1:")
