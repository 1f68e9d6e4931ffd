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
- ``tokenpace_inter_token_seconds{tier,backend}``: gaps between chunks carrying tokens,
  observed in bulk about once a second per stream and at its end.
- ``tokenpace_qoe{tenant,tier,metric}``: QoE of every completed stream, from the
  times the gateway emitted each token; ``metric`` is ``andes`` (Andes Eq. 1,
  :func:`qos.metrics.andes_qoe`) or ``monotone`` (:func:`qos.metrics.monotone_qoe`).
- ``tokenpace_output_tokens_total{tenant,tier,backend}``.
- ``tokenpace_failovers_total{backend}``: attempts on a backend that failed before
  the first byte and were retried elsewhere.
- ``tokenpace_backend_healthy{backend}``, ``tokenpace_backend_in_flight{backend}``,
  ``tokenpace_backend_outstanding_tokens{backend}``,
  ``tokenpace_backend_waiting_time_seconds{backend}`` (the routing estimate),
  ``tokenpace_backend_prompt_tokens{backend}`` and
  ``tokenpace_backend_prefix_cached_tokens{backend}`` (cache-aware routing: prompt
  tokens sent, and those its index estimated cached; their ratio is the estimated
  hit rate): read from the router at scrape time.
- ``tokenpace_admissions_total{tenant,outcome}``, ``tokenpace_queue_waiting``,
  ``tokenpace_vtc_counter{tenant}``: admission (:mod:`gateway.admission.controller`).
- ``tokenpace_queued_with_notice_total{tenant,tier}``: streams answered 200 at once
  while they wait for an engine, told their place in line about once a second;
  ``tokenpace_overloaded_total{tenant,tier,answer}``: requests answered ``overloaded``,
  ``answer`` one of ``at_arrival`` (503, the estimated wait past the tier's bound),
  ``at_bound`` (503 once the bound passed) and ``in_stream`` (an error event after the
  200).
- ``tokenpace_longest_freeze_seconds{tenant,tier,side}``: the longest freeze of each
  reply on the reader's displayed timeline (:func:`qos.metrics.freezes`, 0 when it never
  froze), and ``tokenpace_user_idle_seconds{tenant,tier,side}``: its user idle latency
  (Wang et al. Eq. 9, :func:`qos.metrics.user_idle_latency`). ``side=gateway``: every
  completed stream, from the times the gateway sent each token; ``side=client``: every
  SDK report stored, from the arrivals it reports.
- ``tokenpace_qoe_window{tenant,tier,side,metric,stat}``: the telemetry summary over
  ``telemetry.window_s`` (:mod:`gateway.telemetry.reports`), every replica's records,
  refreshed at a scrape at most once a second; ``metric=reader`` holds what the readers
  saw (``stat`` = a key of :meth:`qos.metrics.ReaderSummary.as_dict`), ``metric=away``
  the readers away (``replies`` whose reports said, ``away_share``, ``mean_away_s``).
- ``tokenpace_reader_signals_total{tenant,presence}``: reader signals accepted
  (``POST /v1/tokenpace/reader``, :mod:`gateway.relay.reader`);
  ``tokenpace_reader_signals_refused_total{reason}`` (``rate``: faster than the
  signals' interval; ``invalid``; ``not_yours``: another tenant's request or another
  token's); ``tokenpace_reader_streams{presence}``: the streams this process relays by
  their reader's last word (``watching`` until told otherwise, ``away``): the share of
  readers away is ``away`` over the sum; ``tokenpace_reader_pace_away_tps``: the
  capacity they give back, the tier pace (TDS) of the away readers' streams, summed (an
  engine's guard lets a reply yield once its client holds its return cushion,
  :mod:`qos.policy.presence`).
- ``tokenpace_store_mode{mode}``: 1 for the store's mode (``redis``; ``local`` or
  ``closed`` while Redis is down, by ``store.fail_mode``; ``memory`` without Redis);
  ``tokenpace_store_redis_calls_total`` (round trips), ``tokenpace_store_local_calls_total``
  (calls served from local state), ``tokenpace_store_outages_total``,
  ``tokenpace_store_errors_total{kind}`` (``busy``, ``command``),
  ``tokenpace_store_pool_connections{state}`` (``in_use``, ``size``),
  ``tokenpace_store_pool_waits_total`` (calls that waited for a connection): the shared
  store as this process sees it (:class:`StoreMetrics`).

Several workers (``tokenpace serve --workers N``) share one view through
``prometheus_client.multiprocess``: each process writes to ``$PROMETHEUS_MULTIPROC_DIR``
and any worker's scrape reads every file (docs/architecture/gateway.md, "Worker processes", says
how each series combines). The backend series are then gauges each worker publishes
(:meth:`GatewayMetrics.publish_backends`).
"""

from __future__ import annotations

import functools
import os
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from gateway.backends.routing import BackendState, Router
from gateway.context import UNKNOWN
from gateway.store import StoreMonitor
from gateway.store.base import StoreMode

__all__ = ["UNKNOWN", "GatewayMetrics", "QoESummary", "StoreMetrics", "observe_many"]

# gateway.telemetry.reports.summarize: tenant -> tiers -> sides -> stats
QoESummary = dict[str, Any]
_STATS = ("mean", "p50", "p90", "p99")
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's switch to multiprocess mode
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
# le="0": never froze / never idle; 2, 5 and 10: qos.metrics.FREEZE_THRESHOLDS_S
_READER_BUCKETS = (0.0, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_STORE_MODES: tuple[StoreMode, ...] = ("redis", "local", "closed", "memory")


M = TypeVar("M", bound=MetricWrapperBase)


def series(metric: M) -> Callable[..., M]:
    """``metric.labels``, each label set's series looked up once and kept: the gateway's
    label values are bounded (configured tenants, tiers and backends; endpoints,
    statuses, outcomes) and no series is removed."""
    return functools.cache(metric.labels)


def observe_many(histogram: Histogram, values: Iterable[float]) -> None:
    """``histogram.observe(v)`` for each of ``values`` (finite, as a relay's gaps are),
    with one update per bucket.

    ``observe`` takes a lock for the sum and one for the bucket on every call; the relay
    has one gap per token. This counts them first and adds each bucket once, through
    prometheus-client's ``_upper_bounds``, ``_buckets`` and ``_sum`` (pinned in
    pyproject.toml; ``tests/gateway/test_dependency_interfaces.py`` checks it against
    ``observe``).
    """
    bounds = histogram._upper_bounds  # ascending, the last +Inf
    counts = [0] * len(bounds)
    total = 0.0
    for value in values:
        counts[bisect_left(bounds, value)] += 1  # the first bound >= value: its "le"
        total += value
    for bucket, count in zip(histogram._buckets, counts, strict=True):
        if count:
            bucket.inc(count)
    histogram._sum.inc(total)


# Each backend series: name, help, how workers' values combine, how a router state reads.
_Combine = Literal["livemin", "livesum"]  # prometheus_client's multiprocess modes used here
_BACKEND_SERIES: tuple[tuple[str, str, _Combine, Callable[[BackendState], float]], ...] = (
    (
        "tokenpace_backend_healthy",
        "1 when the backend passes health checks",
        "livemin",
        lambda s: 1.0 if s.healthy else 0.0,
    ),
    (
        "tokenpace_backend_in_flight",
        "requests in flight on the backend",
        "livesum",
        lambda s: float(s.in_flight),
    ),
    (
        "tokenpace_backend_outstanding_tokens",
        "output tokens still expected from the backend's requests",
        "livesum",
        lambda s: float(s.outstanding_tokens),
    ),
    (
        "tokenpace_backend_waiting_time_seconds",
        "QLM request waiting time estimate used for routing",
        "livesum",
        lambda s: s.waiting_time(),
    ),
    (
        "tokenpace_backend_prompt_tokens",
        "prompt tokens of the requests routed to the backend (cache_aware), since start",
        "livesum",
        lambda s: float(s.prompt_tokens),
    ),
    (
        "tokenpace_backend_prefix_cached_tokens",
        "of those, the ones the router's index estimated the backend's prefix cache held",
        "livesum",
        lambda s: float(s.cached_tokens),
    ),
)


class _BackendCollector(Collector):
    def __init__(self, router: Router) -> None:
        self._router = router

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for name, doc, _mode, read in _BACKEND_SERIES:
            family = GaugeMetricFamily(name, doc, labels=["backend"])
            for s in self._router.states:
                family.add_metric([s.name], read(s))
            yield family


class _MultiProcessRegistry(CollectorRegistry):
    """What every worker wrote to ``path``, plus this process's collectors of other kinds.

    The metrics registered here (counters, gauges, histograms) write to ``path``; they are
    read back from there with the other workers', not collected twice.
    """

    def __init__(self, path: str) -> None:
        super().__init__(auto_describe=True)
        self._files = MultiProcessCollector(None, path)
        self._live: list[Collector] = []

    def register(self, collector: Collector) -> None:
        super().register(collector)
        if not isinstance(collector, MetricWrapperBase):
            self._live.append(collector)

    def unregister(self, collector: Collector) -> None:
        super().unregister(collector)
        if collector in self._live:
            self._live.remove(collector)

    def collect(self) -> Iterable[Metric]:
        yield from self._files.collect()
        for collector in list(self._live):
            yield from collector.collect()


class _QoEWindowCollector(Collector):
    """``tokenpace_qoe_window`` from the last telemetry summary."""

    def __init__(self) -> None:
        self.summary: QoESummary = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily(
            "tokenpace_qoe_window",
            "QoE over telemetry.window_s, all replicas (side=gateway|client, "
            "metric=andes|monotone|displayed_andes, stat=mean|p50|p90|p99|count; "
            "metric=reader, stat=replies|frozen_over_2s|frozen_over_5s|frozen_over_10s|"
            "longest_freeze_s|median_freeze_s|idle_p50_s|idle_p99_s; metric=away, "
            "stat=replies|away_share|mean_away_s)",
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
                    for metric in ("reader", "away"):
                        for stat, value in s.get(metric, {}).items():
                            if value is not None:
                                g.add_metric([tenant, tier, side, metric, stat], float(value))
        yield g


class StoreMetrics(StoreMonitor):
    """The shared store's series (module docstring): what the store tells its monitor."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self._mode = Gauge(
            "tokenpace_store_mode",
            "1 for the store's mode: redis, local (Redis down, fail open), closed (Redis "
            "down, fail closed), memory (no Redis)",
            ["mode"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self._calls = Counter(
            "tokenpace_store_redis_calls",
            "round trips to Redis (a command, a pipeline or a script)",
            registry=r,
        )
        self._local = Counter(
            "tokenpace_store_local_calls",
            "store calls served from this process's local state while Redis was down",
            registry=r,
        )
        self._outages = Counter(
            "tokenpace_store_outages", "times Redis went from reachable to unreachable", registry=r
        )
        self._errors = Counter(
            "tokenpace_store_errors",
            "store calls refused: busy (no connection or answer in time, Redis up) or "
            "command (an error reply)",
            ["kind"],
            registry=r,
        )
        self._waits = Counter(
            "tokenpace_store_pool_waits",
            "store calls that waited for a free Redis connection",
            registry=r,
        )
        pool = Gauge(
            "tokenpace_store_pool_connections",
            "Redis connections in use by store calls, and the pool's size",
            ["state"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self._in_use, self._size = pool.labels("in_use"), pool.labels("size")
        self._size_now = -1
        for kind in ("busy", "command"):
            self._errors.labels(kind)
        self._error = series(self._errors)
        self._modes = {m: self._mode.labels(m) for m in _STORE_MODES}

    def mode(self, mode: StoreMode) -> None:
        for name, gauge in self._modes.items():
            gauge.set(1.0 if name == mode else 0.0)

    def redis_call(self) -> None:
        self._calls.inc()

    def pool(self, in_use: int, size: int) -> None:
        self._in_use.set(in_use)
        if size != self._size_now:
            self._size_now = size
            self._size.set(size)

    def waited(self) -> None:
        self._waits.inc()

    def local_call(self) -> None:
        self._local.inc()

    def outage(self) -> None:
        self._outages.inc()

    def error(self, kind: Literal["busy", "command"]) -> None:
        self._error(kind).inc()


class GatewayMetrics:
    """Every series the gateway exports, in one registry of the app's own."""

    def __init__(self, router: Router) -> None:
        self._router = router
        path = os.environ.get(MULTIPROC_ENV)
        self.multiprocess = bool(path)
        r = _MultiProcessRegistry(path) if path else CollectorRegistry(auto_describe=True)
        self.registry = r
        self.requests = Counter(
            "tokenpace_requests",
            "finished API requests",
            ["tenant", "tier", "backend", "endpoint", "status", "outcome"],
            registry=r,
        )
        self.in_flight = Gauge(
            "tokenpace_requests_in_flight",
            "API requests being served",
            ["endpoint"],
            multiprocess_mode="livesum",
            registry=r,
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
        self.queued_with_notice = Counter(
            "tokenpace_queued_with_notice",
            "streams answered 200 at once while they wait for an engine, with queue notices",
            ["tenant", "tier"],
            registry=r,
        )
        self.overloaded = Counter(
            "tokenpace_overloaded",
            "requests answered 'overloaded' (answer=at_arrival|at_bound|in_stream)",
            ["tenant", "tier", "answer"],
            registry=r,
        )
        self.queue_waiting = Gauge(
            "tokenpace_queue_waiting",
            "requests waiting in this replica's queue",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.vtc_counter = Gauge(
            "tokenpace_vtc_counter",
            "virtual token counter (VTC) per tenant, as this replica last saw it",
            ["tenant"],
            multiprocess_mode="livemostrecent",
            registry=r,
        )
        self.longest_freeze = Histogram(
            "tokenpace_longest_freeze_seconds",
            "the longest freeze of each reply on the reader's displayed timeline (0: none); "
            "side=gateway from the gateway's send times, side=client from the SDKs' reports",
            ["tenant", "tier", "side"],
            buckets=_READER_BUCKETS,
            registry=r,
        )
        self.user_idle = Histogram(
            "tokenpace_user_idle_seconds",
            "user idle latency of each reply (Wang et al. Eq. 9): the longest a token came "
            "after its deadline TTFT + (i-1)/TDS; sides as tokenpace_longest_freeze_seconds",
            ["tenant", "tier", "side"],
            buckets=_READER_BUCKETS,
            registry=r,
        )
        self.reader_signals = Counter(
            "tokenpace_reader_signals",
            "reader signals accepted (presence=watching|away|left)",
            ["tenant", "presence"],
            registry=r,
        )
        self.reader_signals_refused = Counter(
            "tokenpace_reader_signals_refused",
            "reader signals refused (reason=rate|invalid|not_yours)",
            ["reason"],
            registry=r,
        )
        self.reader_streams = Gauge(
            "tokenpace_reader_streams",
            "streams relayed by this process, by their reader's last signal (watching|away)",
            ["presence"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self.reader_pace_away = Gauge(
            "tokenpace_reader_pace_away_tps",
            "tokens a second of tier pace the engines are no longer asked for: the streams "
            "this process relays whose readers are away",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.store = StoreMetrics(r)
        self.qoe_window = _QoEWindowCollector()
        r.register(self.qoe_window)
        self._backend_gauges: list[tuple[Gauge, Callable[[BackendState], float]]] = []
        if self.multiprocess:
            for name, doc, mode, read in _BACKEND_SERIES:
                gauge = Gauge(name, doc, ["backend"], multiprocess_mode=mode, registry=r)
                self._backend_gauges.append((gauge, read))
        else:
            r.register(_BackendCollector(router))

    def publish_backends(self) -> None:
        """Write this worker's view of the backends for the others' scrapes (multiprocess)."""
        for gauge, read in self._backend_gauges:
            for s in self._router.states:
                gauge.labels(s.name).set(read(s))

    def render(self) -> tuple[bytes, str]:
        self.publish_backends()
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
