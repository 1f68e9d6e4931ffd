"""The Grafana dashboard (deploy/grafana): the committed JSON is what its generator
writes, its layout is sound, and every query parses as PromQL and names gateway series
(that each is in a gateway's /metrics after traffic: test_deploy_gateway_image)."""

from __future__ import annotations

import json

from tests.support.deploy import dashboard, dashboard_series, names_in, queries, render, shipped


def test_committed_json_is_what_the_generator_writes() -> None:
    assert dashboard.OUT.read_text() == dashboard.render(), (
        "run `python deploy/grafana/dashboard.py` and commit tokenpace-gateway.json"
    )


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    panels = shipped()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine


def test_every_query_parses_and_names_gateway_series() -> None:
    exprs = queries()
    assert len(exprs) >= 20
    names = dashboard_series()
    assert all(n.startswith("tokenpace_") for n in names), names
    # Some of the series the names are taken from: the extraction is not vacuous.
    assert {"tokenpace_qoe_bucket", "tokenpace_qoe_window", "tokenpace_failovers_total"} <= names
    assert names_in("sum by (x) (rate(a_total[1m])) / ignoring (x) group_left sum(b)") == {
        "a_total",
        "b",
    }


def test_the_sidecar_configmap_carries_the_dashboard() -> None:
    (config_map,) = render("../grafana")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["tokenpace-gateway.json"]) == shipped()
