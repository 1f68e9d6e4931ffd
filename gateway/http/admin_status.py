"""``GET /v1/tokenpace/admin/status``: the live numbers of the operator's dashboard.

One JSON document behind the admin key: backend health and load, requests in flight
and queued, and per tenant its fair-share standing (its weight and its counter, the
weighted service it has had, shared by every replica: the Virtual Token Counter of
"Fairness in Serving Large Language Models", Sheng et al.) and the output tokens and
requests this replica served it (completions only). In-flight, queued and token figures are this
replica's (as on ``/metrics``); a dashboard on several replicas adds them up.
QoE is ``GET /v1/tokenpace/qoe``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Security

from gateway.backends.routing import Router
from gateway.config.schema import TenantConfig
from gateway.http.admin import admin_responses
from gateway.http.auth import admin_key
from gateway.store import Store
from gateway.telemetry.metrics import GatewayMetrics

_SERVED = ("chat.completions", "completions")


def _by_tenant(metrics: GatewayMetrics, metric: str, **only: tuple[str, ...]) -> dict[str, float]:
    """A counter's total per tenant, over the samples whose labels are among ``only``'s."""
    out: dict[str, float] = {}
    for family in metrics.registry.collect():
        if family.name != metric:
            continue
        for s in family.samples:
            if not s.name.endswith("_total") or "tenant" not in s.labels:
                continue
            if all(s.labels.get(label) in values for label, values in only.items()):
                out[s.labels["tenant"]] = out.get(s.labels["tenant"], 0.0) + s.value
    return out


async def status(
    store: Store, router: Router, metrics: GatewayMetrics, tenants: Mapping[str, TenantConfig]
) -> dict[str, Any]:
    """The document (see the module docstring); StoreUnavailable when the store is down."""
    registry = metrics.registry
    counters = await store.counters()
    tokens = _by_tenant(metrics, "tokenpace_output_tokens")
    requests = _by_tenant(metrics, "tokenpace_requests", endpoint=_SERVED)
    in_flight = sum(
        registry.get_sample_value("tokenpace_requests_in_flight", {"endpoint": e}) or 0.0
        for e in _SERVED
    )
    return {
        "object": "tokenpace.status",
        "time": time.time(),
        "ready": router.any_healthy(),
        "requests_in_flight": int(in_flight),
        "requests_queued": int(registry.get_sample_value("tokenpace_queue_waiting") or 0),
        "backends": [
            {
                "name": s.name,
                "healthy": s.healthy,
                "in_flight": s.in_flight,
                "outstanding_tokens": s.outstanding_tokens,
                "last_error": s.last_error,
            }
            for s in router.states
        ],
        "tenants": {
            name: {
                "weight": t.weight,
                "vtc_counter": counters.get(name, 0.0),
                "output_tokens": int(tokens.get(name, 0.0)),
                "requests": int(requests.get(name, 0.0)),
            }
            for name, t in tenants.items()
        },
    }


def add_status_route(
    app: FastAPI,
    store: Store,
    router: Router,
    metrics: GatewayMetrics,
    tenants: Mapping[str, TenantConfig],
) -> None:
    @app.get(
        "/v1/tokenpace/admin/status",
        tags=["admin"],
        summary="Backends, requests in flight and queued, fair share per tenant",
        dependencies=[Security(admin_key)],
        responses=admin_responses(401, 503),
    )
    async def admin_status() -> dict[str, Any]:
        return await status(store, router, metrics, tenants)
