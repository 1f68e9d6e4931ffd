"""Per-app state: configuration, tenants, router, metrics, the shared store.

Request ids and their tenant (for telemetry ownership) live in the store
(:mod:`gateway.store`): in Redis they are shared by every replica and outlive a
restart; in memory the last ``recent_requests`` are kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx

from gateway.backends import Backend, Router
from gateway.config import GatewayConfig, TenantConfig
from gateway.metrics import GatewayMetrics

if TYPE_CHECKING:
    from gateway.admission import AdmissionController
    from gateway.keys import KeyCache
    from gateway.store import Store
    from gateway.telemetry import Telemetry
    from gateway.telemetry_token import TelemetryTokens


@dataclass(eq=False)
class GatewayState:
    config: GatewayConfig
    backends: list[Backend]
    router: Router
    metrics: GatewayMetrics
    tenants: dict[str, TenantConfig]
    store: Store
    keys: KeyCache
    admission: AdmissionController = field(init=False)
    telemetry: Telemetry = field(init=False)
    telemetry_tokens: TelemetryTokens = field(init=False)
    http: httpx.AsyncClient | None = None
    started: bool = field(default=False)
