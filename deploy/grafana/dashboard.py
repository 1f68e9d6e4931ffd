"""The Grafana dashboard over the gateway's own metrics (the series
gateway/telemetry/metrics.py lists): writes ``tokenpace-gateway.json`` beside this file.

Each row of :data:`ROWS` is a topic, each :class:`Panel` a titled time series of one or
more PromQL queries. To add a panel, add it to its row (or add a row) and run
``python deploy/grafana/dashboard.py``; tests/deploy checks that the JSON is the one
this writes and that every series its queries name is in a gateway's ``/metrics``.
Layout is computed: panels fill each row left to right, two to a line by default.

The queries aggregate over pods (one scrape target per gateway pod; its workers are
summed in its own ``/metrics``): counters and histograms by ``sum``, per-replica views
of shared state (backend health, VTC counters, the telemetry window) by ``min``/``max``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("tokenpace-gateway.json")
UID = "tokenpace-gateway"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "[$__rate_interval]"
TT = 'tenant=~"$tenant", tier=~"$tier"'  # the tenant and tier variables' selection
GRID_WIDTH = 24
PANEL_HEIGHT = 8


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    width: int = 12
    bounds: tuple[float, float] | None = None  # the y axis' min and max


def quantiles(series: str, selector: str, by: str, legend: str) -> tuple[Query, ...]:
    """p50, p90 and p99 of a histogram, per ``by``."""
    return tuple(
        Query(
            f"histogram_quantile({q}, sum by (le, {by}) "
            f"(rate({series}_bucket{{{selector}}}{RATE})))",
            f"p{round(q * 100)} {legend}",
        )
        for q in (0.5, 0.9, 0.99)
    )


def mean(series: str, selector: str, by: str) -> str:
    """Mean of a histogram's observations over the rate interval, per ``by``."""
    return (
        f"sum by ({by}) (rate({series}_sum{{{selector}}}{RATE}))\n/\n"
        f"sum by ({by}) (rate({series}_count{{{selector}}}{RATE}))"
    )


QOE = f'metric="andes", {TT}'
TOKENS = f"tokenpace_output_tokens_total{{{TT}}}"
FREEZE = "tokenpace_longest_freeze_seconds"


def frozen_share(over_s: float, by: str) -> str:
    """The share of replies whose longest freeze passed ``over_s`` seconds, per ``by``:
    1 - (bucket le=over_s) / count (the histogram has buckets at 2, 5 and 10 s, written
    "2.0", "5.0", "10.0" by prometheus-client)."""
    return (
        f'1 - sum by ({by}) (rate({FREEZE}_bucket{{le="{float(over_s)}", {TT}}}{RATE}))\n'
        f"/\nsum by ({by}) (rate({FREEZE}_count{{{TT}}}{RATE}))"
    )


def idle_p99(by: str) -> str:
    return (
        f"histogram_quantile(0.99, sum by (le, {by}) "
        f"(rate(tokenpace_user_idle_seconds_bucket{{{TT}}}{RATE})))"
    )


ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    (
        "Quality of experience (gateway side)",
        (
            Panel(
                "Mean QoE by tenant and tier",
                "Andes QoE (Eq. 1) of completed streams, from the times the gateway "
                "emitted each token: 1 = every token on the tier's timeline.",
                (Query(mean("tokenpace_qoe", QOE, "tenant, tier"), "{{tenant}} {{tier}}"),),
                unit="percentunit",
                bounds=(0, 1),
            ),
            Panel(
                "Streams at QoE 0.9 or less",
                "Share of completed streams whose QoE was at most 0.9, per tier.",
                (
                    Query(
                        f'sum by (tier) (rate(tokenpace_qoe_bucket{{le="0.9", {QOE}}}{RATE}))\n'
                        f"/\nsum by (tier) (rate(tokenpace_qoe_count{{{QOE}}}{RATE}))",
                        "{{tier}}",
                    ),
                ),
                unit="percentunit",
                bounds=(0, 1),
            ),
        ),
    ),
    (
        "Client against gateway (telemetry window)",
        (
            Panel(
                "Mean QoE: client against gateway",
                "Over telemetry.window_s, all replicas: side=client from the SDKs' "
                "reports (what arrived), side=gateway from the gateway's emission times.",
                (
                    Query(
                        "max by (tenant, tier, side) "
                        f'(tokenpace_qoe_window{{metric="andes", stat="mean", {TT}}})',
                        "{{tenant}} {{tier}} {{side}}",
                    ),
                ),
                unit="percentunit",
                bounds=(0, 1),
            ),
            Panel(
                "Displayed QoE and reports",
                "The QoE of what the reader saw (the SDK's paced display), and the "
                "number of streams in the window per side.",
                (
                    Query(
                        "max by (tenant, tier) (tokenpace_qoe_window"
                        f'{{side="client", metric="displayed_andes", stat="mean", {TT}}})',
                        "displayed {{tenant}} {{tier}}",
                    ),
                    Query(
                        "max by (tenant, tier, side) "
                        f'(tokenpace_qoe_window{{metric="all", stat="count", {TT}}})',
                        "streams {{tenant}} {{tier}} {{side}}",
                    ),
                ),
            ),
        ),
    ),
    (
        "What the readers saw: freezes and idle latency, client against gateway",
        (
            Panel(
                "Replies frozen over 2 s, by tier",
                "Share of replies that stopped on the reader's screen for over 2 s at least "
                "once (a display gap beyond the tier's pace, the SDKs' release rule): "
                "side=gateway from the gateway's send times, side=client from the SDKs' "
                "reports of what arrived.",
                (Query(frozen_share(2, "tier, side"), "{{tier}} {{side}}"),),
                unit="percentunit",
                bounds=(0, 1),
            ),
            Panel(
                "Replies frozen over 2 s, by tenant",
                "As by tier, per tenant, all tiers together.",
                (Query(frozen_share(2, "tenant, side"), "{{tenant}} {{side}}"),),
                unit="percentunit",
                bounds=(0, 1),
            ),
            Panel(
                "Replies frozen over 5 s and over 10 s",
                "The long freezes, all tenants and tiers selected, per side.",
                (
                    Query(frozen_share(5, "side"), "over 5 s {{side}}"),
                    Query(frozen_share(10, "side"), "over 10 s {{side}}"),
                ),
                unit="percentunit",
                width=8,
                bounds=(0, 1),
            ),
            Panel(
                "User idle latency p99, by tier",
                "99th percentile of the longest a token came after its deadline "
                "TTFT + (i-1)/TDS (Wang et al., Eq. 9), per tier and side.",
                (Query(idle_p99("tier, side"), "{{tier}} {{side}}"),),
                unit="s",
                width=8,
            ),
            Panel(
                "Longest freeze in the telemetry window",
                "Over telemetry.window_s, all replicas: the longest freeze of any reply, per "
                "tenant, tier and side.",
                (
                    Query(
                        "max by (tenant, tier, side) (tokenpace_qoe_window"
                        f'{{metric="reader", stat="longest_freeze_s", {TT}}})',
                        "{{tenant}} {{tier}} {{side}}",
                    ),
                ),
                unit="s",
                width=8,
            ),
            Panel(
                "Readers away now",
                "Streams relayed whose reader's client says nobody watches or listens (the tab "
                "hidden, the speech paused), as a share of all streams relayed.",
                (
                    Query(
                        'sum (tokenpace_reader_streams{presence="away"}) '
                        "/ sum (tokenpace_reader_streams)",
                        "away",
                    ),
                ),
                unit="percentunit",
                width=12,
            ),
            Panel(
                "Capacity the away readers give back",
                "The tier pace (tokens/s) of the streams whose readers are away: what the "
                "engines are no longer asked to deliver until they come back.",
                (Query("sum (tokenpace_reader_pace_away_tps)", "tokens/s"),),
                unit="short",
                width=12,
            ),
        ),
    ),
    (
        "Fair share",
        (
            Panel(
                "Output tokens per second by tenant",
                "Tokens relayed to clients.",
                (Query(f"sum by (tenant) (rate({TOKENS}{RATE}))", "{{tenant}}"),),
                unit="short",
                width=8,
            ),
            Panel(
                "Share of output tokens by tenant",
                "Each tenant's part of the tokens relayed; under contention it follows "
                "the tenants' weights.",
                (
                    Query(
                        f"sum by (tenant) (rate({TOKENS}{RATE}))\n/ ignoring (tenant) "
                        f"group_left\nsum (rate({TOKENS}{RATE}))",
                        "{{tenant}}",
                    ),
                ),
                unit="percentunit",
                width=8,
                bounds=(0, 1),
            ),
            Panel(
                "Virtual token counter by tenant",
                "VTC service counter per tenant, as the replicas last saw it: the "
                "admission queue serves the lowest counter over weight first.",
                (
                    Query(
                        'max by (tenant) (tokenpace_vtc_counter{tenant=~"$tenant"})',
                        "{{tenant}}",
                    ),
                ),
                width=8,
            ),
        ),
    ),
    (
        "Queue and admission",
        (
            Panel(
                "Admission decisions per second",
                "admitted, queued, limited (rate limits, budgets), queue_full, timeout, gone_away.",
                (
                    Query(
                        "sum by (outcome) "
                        f'(rate(tokenpace_admissions_total{{tenant=~"$tenant"}}{RATE}))',
                        "{{outcome}}",
                    ),
                ),
                width=8,
            ),
            Panel(
                "Queued and in flight",
                "Requests waiting in the gateways' queues, and being served.",
                (
                    Query("sum (tokenpace_queue_waiting)", "queued"),
                    Query(
                        "sum by (endpoint) (tokenpace_requests_in_flight)",
                        "in flight {{endpoint}}",
                    ),
                ),
                width=8,
            ),
            Panel(
                "Requests per second by status",
                "Finished API requests by HTTP status and outcome (completed, error, aborted).",
                (
                    Query(
                        f"sum by (status, outcome) (rate(tokenpace_requests_total{{{TT}}}{RATE}))",
                        "{{status}} {{outcome}}",
                    ),
                ),
                width=8,
            ),
        ),
    ),
    (
        "Backends",
        (
            Panel(
                "Healthy",
                "1 while a backend passes the health checks of every gateway replica.",
                (
                    Query(
                        'min by (backend) (tokenpace_backend_healthy{backend=~"$backend"})',
                        "{{backend}}",
                    ),
                ),
                width=6,
                bounds=(0, 1),
            ),
            Panel(
                "Requests in flight",
                "Per backend, all gateway replicas together.",
                (
                    Query(
                        'sum by (backend) (tokenpace_backend_in_flight{backend=~"$backend"})',
                        "{{backend}}",
                    ),
                ),
                width=6,
            ),
            Panel(
                "Outstanding tokens and estimated wait",
                "Output tokens still expected from each backend (all replicas), and the "
                "longest waiting-time estimate a replica routes by.",
                (
                    Query(
                        "sum by (backend) "
                        '(tokenpace_backend_outstanding_tokens{backend=~"$backend"})',
                        "tokens {{backend}}",
                    ),
                    Query(
                        "max by (backend) "
                        '(tokenpace_backend_waiting_time_seconds{backend=~"$backend"})',
                        "wait (s) {{backend}}",
                    ),
                ),
                width=6,
            ),
            Panel(
                "Prefix-cache hit rate (estimated)",
                "Cache-aware routing: of the prompt tokens routed to each backend over the "
                "interval, the share its index estimated the backend's prefix cache held "
                "(all gateway replicas). vLLM's own count is on the engine's /metrics: "
                "vllm:prefix_cache_hits_total over vllm:prefix_cache_queries_total.",
                (
                    Query(
                        "sum by (backend) (delta(tokenpace_backend_prefix_cached_tokens"
                        f'{{backend=~"$backend"}}{RATE})) / sum by (backend) '
                        f'(delta(tokenpace_backend_prompt_tokens{{backend=~"$backend"}}{RATE}))',
                        "{{backend}}",
                    ),
                ),
                unit="percentunit",
                width=6,
                bounds=(0, 1),
            ),
            Panel(
                "Failovers per second",
                "Attempts that failed before the first byte and were retried on another "
                "backend, by the backend that failed.",
                (
                    Query(
                        "sum by (backend) "
                        f'(rate(tokenpace_failovers_total{{backend=~"$backend"}}{RATE}))',
                        "{{backend}}",
                    ),
                ),
                width=6,
            ),
        ),
    ),
    (
        "Shared state (Redis)",
        (
            Panel(
                "Store mode",
                "Gateway processes on Redis (redis), on their local state while Redis is "
                "down (local, fail open), refusing (closed, fail closed), or without Redis "
                "(memory).",
                (Query("sum by (mode) (tokenpace_store_mode)", "{{mode}}"),),
                width=6,
            ),
            Panel(
                "Redis round trips per second",
                "Commands, pipelines and scripts sent to Redis, all gateway processes.",
                (Query(f"sum (rate(tokenpace_store_redis_calls_total{RATE}))", "round trips"),),
                width=6,
            ),
            Panel(
                "Redis connections in use",
                "Store calls holding a Redis connection, against the pools' size, and the "
                "calls that waited for one.",
                (
                    Query("sum by (state) (tokenpace_store_pool_connections)", "{{state}}"),
                    Query(
                        f"sum (rate(tokenpace_store_pool_waits_total{RATE}))", "waits per second"
                    ),
                ),
                width=6,
            ),
            Panel(
                "Outages, local-state calls and refused calls",
                "Per second: calls served from local state while Redis was down, Redis "
                "outages, and calls refused as busy or by a Redis error reply.",
                (
                    Query(f"sum (rate(tokenpace_store_local_calls_total{RATE}))", "local state"),
                    Query(f"sum (rate(tokenpace_store_outages_total{RATE}))", "outages"),
                    Query(
                        f"sum by (kind) (rate(tokenpace_store_errors_total{RATE}))",
                        "refused: {{kind}}",
                    ),
                ),
                width=6,
            ),
        ),
    ),
    (
        "Latency and delivery",
        (
            Panel(
                "Time to first token by tier",
                "From the request's receipt to the first token the gateway emitted.",
                quantiles("tokenpace_ttft_seconds", TT, "tier", "{{tier}}"),
                unit="s",
            ),
            Panel(
                "Gap between tokens by tier",
                "Between consecutive token-carrying chunks the gateway emitted.",
                quantiles(
                    "tokenpace_inter_token_seconds",
                    'tier=~"$tier", backend=~"$backend"',
                    "tier",
                    "{{tier}}",
                ),
                unit="s",
            ),
            Panel(
                "Time to first token by tenant (p90)",
                "The 90th percentile per tenant, all tiers.",
                (
                    Query(
                        "histogram_quantile(0.9, sum by (le, tenant) "
                        f"(rate(tokenpace_ttft_seconds_bucket{{{TT}}}{RATE})))",
                        "{{tenant}}",
                    ),
                ),
                unit="s",
                width=24,
            ),
        ),
    ),
)

VARIABLES = (  # name, the label_values() query that lists its values
    ("tenant", "label_values(tokenpace_requests_total, tenant)"),
    ("tier", "label_values(tokenpace_requests_total, tier)"),
    ("backend", "label_values(tokenpace_backend_healthy, backend)"),
)


def panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": panel.unit}
    if panel.bounds is not None:
        defaults["min"], defaults["max"] = panel.bounds
    return {
        "id": panel_id,
        "type": "timeseries",
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": PANEL_HEIGHT, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": DATASOURCE,
                "expr": q.expr,
                "legendFormat": q.legend,
            }
            for i, q in enumerate(panel.queries)
        ],
    }


def layout() -> list[dict[str, Any]]:
    """Rows and their panels with ids and grid positions."""
    panels: list[dict[str, Any]] = []
    y = 0
    for title, row in ROWS:
        panels.append(
            {
                "id": len(panels) + 1,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y},
                "panels": [],
            }
        )
        y += 1
        x = 0
        for panel in row:
            if x + panel.width > GRID_WIDTH:
                x, y = 0, y + PANEL_HEIGHT
            panels.append(panel_json(panel, len(panels) + 1, x, y))
            x += panel.width
        y += PANEL_HEIGHT
    return panels


def variable_json(name: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": name},
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {},
        "refresh": 2,
        "sort": 1,
    }


def dashboard() -> dict[str, Any]:
    datasource = {
        "name": "datasource",
        "label": "Prometheus",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
    }
    return {
        "uid": UID,
        "title": "tokenpace gateway",
        "description": "QoE, fair share, admission, backends and latency of the tokenpace "
        "gateway (deploy/grafana/dashboard.py)",
        "tags": ["tokenpace", "llm"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "annotations": {"list": []},
        "templating": {"list": [datasource, *(variable_json(n, q) for n, q in VARIABLES)]},
        "panels": layout(),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(render(), encoding="utf-8")
    print(f"wrote {OUT}")
