"""Per-app state: configuration, tenants, router, metrics, recent requests."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import httpx

from gateway.backends import Backend, Router
from gateway.config import GatewayConfig, TenantConfig
from gateway.metrics import GatewayMetrics
from gateway.tiers import ResolvedTier


@dataclass(frozen=True, slots=True)
class RequestRecord:
    tenant: str
    tier: ResolvedTier
    model: str


class RecentRequests:
    """The last ``maxlen`` request ids and whose they were (bounded, O(1)).

    For the telemetry endpoint: a tenant may report only on its own request ids.
    """

    def __init__(self, maxlen: int) -> None:
        self.maxlen = maxlen
        self._items: OrderedDict[str, RequestRecord] = OrderedDict()

    def add(self, request_id: str, record: RequestRecord) -> None:
        if self.maxlen <= 0:
            return
        self._items[request_id] = record
        if len(self._items) > self.maxlen:
            self._items.popitem(last=False)

    def get(self, request_id: str) -> RequestRecord | None:
        return self._items.get(request_id)

    def __len__(self) -> int:
        return len(self._items)


@dataclass(eq=False)
class GatewayState:
    config: GatewayConfig
    backends: list[Backend]
    router: Router
    metrics: GatewayMetrics
    tenants_by_digest: dict[str, TenantConfig]
    recent: RecentRequests
    http: httpx.AsyncClient | None = None
    started: bool = field(default=False)
