"""Prometheus metrics, in a registry of the app's own (two apps never share series).

Series (labels bounded: tenants, tiers and backends come from the configuration;
requests that fail before a tenant or tier is known are labelled ``-``):

- ``tokenpace_requests_total{tenant,tier,backend,endpoint,status,outcome}``: finished
  API requests; ``status`` is the HTTP status, ``outcome`` one of ``completed``,
  ``error`` (an error answer, or a stream ended by an error event), ``aborted`` (the
  client went away).
- ``tokenpace_requests_in_flight{endpoint}``.
- ``tokenpace_ttft_seconds{tenant,tier,backend}``: request receipt to the first chunk
  carrying a token, as the gateway emitted it.
- ``tokenpace_inter_token_seconds{tier,backend}``: gaps between chunks carrying tokens.
- ``tokenpace_qoe{tenant,tier,metric}``: QoE of every completed stream, from the
  times the gateway emitted each token; ``metric`` is ``andes`` (Andes Eq. 1,
  :func:`qos.metrics.andes_qoe`) or ``monotone`` (:func:`qos.metrics.monotone_qoe`).
- ``tokenpace_output_tokens_total{tenant,tier,backend}``.
- ``tokenpace_failovers_total{backend}``: attempts on a backend that failed before
  the first byte and were retried elsewhere.
- ``tokenpace_backend_healthy{backend}``, ``tokenpace_backend_in_flight{backend}``,
  ``tokenpace_backend_outstanding_tokens{backend}``,
  ``tokenpace_backend_waiting_time_seconds{backend}`` (the routing estimate): read
  from the router at scrape time.
- ``tokenpace_admissions_total{tenant,outcome}``, ``tokenpace_queue_waiting``,
  ``tokenpace_vtc_counter{tenant}``: admission (:mod:`gateway.admission`).
- ``tokenpace_qoe_window{tenant,tier,side,metric,stat}``: the telemetry summary over
  ``telemetry.window_s`` (:mod:`gateway.telemetry`), refreshed at each scrape.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.context import UNKNOWN
from gateway.routing import Router

__all__ = ["UNKNOWN", "GatewayMetrics", "QoESummary"]

QoESummary = dict[str, Any]  # gateway.telemetry.summarize: tenant -> tiers -> sides -> stats
_STATS = ("mean", "p50", "p90", "p99")
_LATENCY_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    10.0,
    30.0,
    60.0,
)
_ITL_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    1.0,
    2.5,
)
_QOE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)


class _BackendCollector(Collector):
    def __init__(self, router: Router) -> None:
        self._router = router

    def collect(self) -> Iterator[GaugeMetricFamily]:
        healthy = GaugeMetricFamily(
            "tokenpace_backend_healthy",
            "1 when the backend passes health checks",
            labels=["backend"],
        )
        in_flight = GaugeMetricFamily(
            "tokenpace_backend_in_flight", "requests in flight on the backend", labels=["backend"]
        )
        outstanding = GaugeMetricFamily(
            "tokenpace_backend_outstanding_tokens",
            "output tokens still expected from the backend's requests",
            labels=["backend"],
        )
        waiting = GaugeMetricFamily(
            "tokenpace_backend_waiting_time_seconds",
            "QLM request waiting time estimate used for routing",
            labels=["backend"],
        )
        for s in self._router.states:
            healthy.add_metric([s.name], 1.0 if s.healthy else 0.0)
            in_flight.add_metric([s.name], float(s.in_flight))
            outstanding.add_metric([s.name], float(s.outstanding_tokens))
            waiting.add_metric([s.name], s.waiting_time())
        yield from (healthy, in_flight, outstanding, waiting)


class _QoEWindowCollector(Collector):
    """``tokenpace_qoe_window`` from the last telemetry summary."""

    def __init__(self) -> None:
        self.summary: QoESummary = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily(
            "tokenpace_qoe_window",
            "QoE over telemetry.window_s, all replicas (side=gateway|client, "
            "metric=andes|monotone|displayed_andes, stat=mean|p50|p90|p99|count)",
            labels=["tenant", "tier", "side", "metric", "stat"],
        )
        for tenant, t in self.summary.items():
            for tier, sides in t["tiers"].items():
                for side, s in sides.items():
                    g.add_metric([tenant, tier, side, "all", "count"], float(s["count"]))
                    for metric in ("andes", "monotone", "displayed_andes"):
                        for stat in _STATS:
                            if metric in s:
                                g.add_metric([tenant, tier, side, metric, stat], s[metric][stat])
        yield g


class GatewayMetrics:
    """Every series the gateway exports, in one registry of the app's own."""

    def __init__(self, router: Router) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "tokenpace_requests",
            "finished API requests",
            ["tenant", "tier", "backend", "endpoint", "status", "outcome"],
            registry=r,
        )
        self.in_flight = Gauge(
            "tokenpace_requests_in_flight", "API requests being served", ["endpoint"], registry=r
        )
        self.ttft = Histogram(
            "tokenpace_ttft_seconds",
            "time from request receipt to the first token the gateway emitted",
            ["tenant", "tier", "backend"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "tokenpace_inter_token_seconds",
            "time between consecutive token-carrying chunks the gateway emitted",
            ["tier", "backend"],
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.qoe = Histogram(
            "tokenpace_qoe",
            "QoE of completed streams from the gateway's emission times (metric=andes|monotone)",
            ["tenant", "tier", "metric"],
            buckets=_QOE_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "tokenpace_output_tokens",
            "output tokens relayed to clients",
            ["tenant", "tier", "backend"],
            registry=r,
        )
        self.failovers = Counter(
            "tokenpace_failovers",
            "attempts that failed before the first byte and were retried on another backend",
            ["backend"],
            registry=r,
        )
        self.admissions = Counter(
            "tokenpace_admissions",
            "admission decisions (admitted, queued, limited, queue_full, timeout, gone_away)",
            ["tenant", "outcome"],
            registry=r,
        )
        self.queue_waiting = Gauge(
            "tokenpace_queue_waiting", "requests waiting in this replica's queue", registry=r
        )
        self.vtc_counter = Gauge(
            "tokenpace_vtc_counter",
            "virtual token counter (VTC) per tenant, as this replica last saw it",
            ["tenant"],
            registry=r,
        )
        r.register(_BackendCollector(router))
        self.qoe_window = _QoEWindowCollector()
        r.register(self.qoe_window)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
