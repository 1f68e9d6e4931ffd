"""``GET /v1/tokenpace/admin/status``: the live numbers of the operator's dashboard.

One JSON document behind the admin key: backend health and load, requests in flight
and queued, and per tenant its fair-share standing (its weight and its counter, the
weighted service it has had, shared by every replica: the Virtual Token Counter of
"Fairness in Serving Large Language Models", Sheng et al.) and the output tokens and
requests this replica served it (completions only), and the streams it relays by their
readers' last signal (``readers``: watching, away, and the tier pace the away ones no
longer ask, :mod:`gateway.relay.reader`). In-flight, queued, reader and token figures are
this replica's (as on ``/metrics``); a dashboard on several replicas adds them up.
QoE is ``GET /v1/tokenpace/qoe``.

``GET /v1/tokenpace/admin/history?seconds=S``: the same load (in flight, queued, each
tenant's output tokens and requests) sampled every 2 s over the last S seconds (at most
half an hour, :mod:`gateway.telemetry.history`), for a dashboard that opens with the
recent past.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import FastAPI, Query, Security

from gateway.backends.routing import Router
from gateway.config.schema import TenantConfig
from gateway.http.admin import admin_responses
from gateway.http.auth import admin_key
from gateway.store import Store
from gateway.telemetry.history import KEPT_S, LoadHistory, load_sample
from gateway.telemetry.metrics import GatewayMetrics


async def status(
    store: Store, router: Router, metrics: GatewayMetrics, tenants: Mapping[str, TenantConfig]
) -> dict[str, Any]:
    """The document (see the module docstring); StoreUnavailable when the store is down."""
    counters = await store.counters()
    load = load_sample(metrics, tenants)
    sample = metrics.registry.get_sample_value
    return {
        "object": "tokenpace.status",
        "time": load["time"],
        "ready": router.any_healthy(),
        "requests_in_flight": load["requests_in_flight"],
        "requests_queued": load["requests_queued"],
        "backends": [
            {
                "name": s.name,
                "healthy": s.healthy,
                "in_flight": s.in_flight,
                "outstanding_tokens": s.outstanding_tokens,
                "prompt_tokens": s.prompt_tokens,
                "prefix_cached_tokens": s.cached_tokens,
                "last_error": s.last_error,
            }
            for s in router.states
        ],
        "readers": {
            presence: int(sample("tokenpace_reader_streams", {"presence": presence}) or 0)
            for presence in ("watching", "away")
        }
        | {"pace_away_tps": sample("tokenpace_reader_pace_away_tps") or 0.0},
        "tenants": {
            name: {
                "weight": t.weight,
                "vtc_counter": counters.get(name, 0.0),
                **load["tenants"][name],
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
    history: LoadHistory,
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

    @app.get(
        "/v1/tokenpace/admin/history",
        tags=["admin"],
        summary="Requests in flight and queued, and each tenant's tokens, every 2 s",
        dependencies=[Security(admin_key)],
        responses=admin_responses(400, 401),
    )
    async def admin_history(
        seconds: Annotated[
            int, Query(ge=1, le=KEPT_S, description="how far back, seconds (at most 1800)")
        ] = 600,
    ) -> dict[str, Any]:
        return {
            "object": "tokenpace.history",
            "interval_s": history.interval_s,
            "samples": history.since(seconds),
        }
