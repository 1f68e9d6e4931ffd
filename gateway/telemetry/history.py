"""The gateway's load over the last half hour, for the dashboard to open on.

:func:`load_sample` reads, from the gateway's own metrics, the requests in flight and
queued and each tenant's output tokens and completion requests so far (what
``GET /v1/tokenpace/admin/status`` shows live); :class:`LoadHistory` keeps one such
sample every :data:`INTERVAL_S` in a ring of :data:`KEPT_S`, which
``GET /v1/tokenpace/admin/history`` returns. With ``--workers N`` the metrics are every
worker's together (``/metrics``' multiprocess view), so each worker's ring holds the
whole gateway's load since that worker started.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from gateway.background import stop
from gateway.telemetry.metrics import GatewayMetrics

INTERVAL_S = 2.0  # the dashboard's poll period
KEPT_S = 1800  # half an hour, the dashboard's chart
SERVED = ("chat.completions", "completions")


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


def load_sample(metrics: GatewayMetrics, tenants: Iterable[str]) -> dict[str, Any]:
    """Now's load: ``time``, ``requests_in_flight``, ``requests_queued`` and, per tenant
    of ``tenants``, ``output_tokens`` and ``requests`` (completions) served so far."""
    registry = metrics.registry
    tokens = _by_tenant(metrics, "tokenpace_output_tokens")
    requests = _by_tenant(metrics, "tokenpace_requests", endpoint=SERVED)
    in_flight = sum(
        registry.get_sample_value("tokenpace_requests_in_flight", {"endpoint": e}) or 0.0
        for e in SERVED
    )
    return {
        "time": time.time(),
        "requests_in_flight": int(in_flight),
        "requests_queued": int(registry.get_sample_value("tokenpace_queue_waiting") or 0),
        "tenants": {
            name: {
                "output_tokens": int(tokens.get(name, 0.0)),
                "requests": int(requests.get(name, 0.0)),
            }
            for name in tenants
        },
    }


class LoadHistory:
    """A :func:`load_sample` every ``interval_s``, the last ``kept_s`` seconds of them."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        tenants: Iterable[str],
        interval_s: float = INTERVAL_S,
        kept_s: float = KEPT_S,
    ) -> None:
        self.metrics = metrics
        self.tenants = list(tenants)
        self.interval_s = interval_s
        self.kept_s = kept_s
        self.samples: deque[dict[str, Any]] = deque(maxlen=int(kept_s / interval_s) + 1)
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> None:
        self.samples.append(load_sample(self.metrics, self.tenants))

    def since(self, seconds: float) -> list[dict[str, Any]]:
        """The samples of the last ``seconds``, oldest first."""
        after = time.time() - seconds
        return [s for s in self.samples if s["time"] >= after]

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name="tokenpace-load-history"
        )

    async def _run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval_s)

    async def aclose(self) -> None:
        if self._task is not None:
            await stop(self._task)
            self._task = None
