"""QoE telemetry: the SDKs' reports, the gateway's own measurements, their summary.

``POST /v1/tokenpace/telemetry`` (docs/protocol.md, "SDK → gateway: QoE telemetry"):
the report is validated strictly (:class:`TelemetryReport`, bounded in size and
length), its request id must be one of the caller's (else 404), and the gateway
recomputes the QoE itself from the timelines, never trusting a client's number:
Andes QoE (Liu et al. §3.1, Eq. 1, :func:`qos.metrics.andes_qoe`) and the monotone
variant (:func:`qos.metrics.monotone_qoe`) of the *arrivals* and of the *displayed*
timeline (what the pacing buffer showed), against the tier the gateway served the
request under (the ``expected`` the client sends is checked for form only).

Every completed stream the gateway relays adds a ``gateway`` record with the QoE of
its emission times (computed in :mod:`gateway.relay.streaming`); these are batched, one store
call per replica every :data:`FLUSH_INTERVAL_S`. ``GET /v1/tokenpace/qoe`` puts both
sides next to each other per tenant and tier over a window; ``/metrics`` exports the
same summary (``tokenpace_qoe_window``), refreshed at each scrape.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.background import stop
from gateway.config.schema import LimitsConfig, TelemetryConfig
from gateway.context import RequestContext, StreamOutcome
from gateway.errors import bad_request, forbidden, validation_error
from gateway.store import QoERecord, Store, StoreUnavailable
from gateway.telemetry.errors import (
    duplicate_report,
    report_too_large,
    too_many_reports,
    unknown_request,
)
from gateway.telemetry.metrics import GatewayMetrics, QoESummary
from qos.metrics import andes_qoe, monotone_qoe

log = logging.getLogger("tokenpace.gateway.telemetry")

FLUSH_INTERVAL_S = 0.25
_PENDING_MAX = 10000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class Expected(_Strict):
    ttft: float = Field(ge=0)
    tds: float = Field(gt=0)


class SdkInfo(_Strict):
    name: str = Field(max_length=64)
    version: str = Field(max_length=64)


class TelemetryReport(_Strict):
    """The SDK's report on one request (docs/protocol.md)."""

    request_id: str = Field(pattern=r"^[0-9a-f]{32}$", description="the X-Request-Id")
    expected: Expected
    arrivals: list[tuple[float, int]] = Field(
        description="[seconds since the request was sent, tokens] per chunk received"
    )
    displayed: list[tuple[float, int]] = Field(
        default_factory=list, description="the same for tokens shown to the user"
    )
    outcome: Literal["completed", "aborted", "error"]
    sdk: SdkInfo | None = None


def _qoe(timeline: list[tuple[float, int]], ttft: float, tds: float) -> tuple[float, float]:
    if not timeline:
        return 0.0, 0.0  # nothing reached the user
    return andes_qoe(timeline, ttft, tds), monotone_qoe(timeline, ttft, tds)


def _stats(values: Sequence[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=float)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"mean": float(a.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def _side(records: Sequence[QoERecord]) -> dict[str, Any]:
    out: dict[str, Any] = {"count": len(records)}
    if records:
        out["andes"] = _stats([r.andes for r in records])
        out["monotone"] = _stats([r.monotone for r in records])
        shown = [r.displayed_andes for r in records if r.displayed_andes is not None]
        if shown:
            out["displayed_andes"] = _stats(shown)
    return out


def _pair(records: Sequence[QoERecord]) -> dict[str, Any]:
    return {
        "gateway": _side([r for r in records if r.side == "gateway"]),
        "client": _side([r for r in records if r.side == "client"]),
    }


def summarize(records: Sequence[QoERecord]) -> QoESummary:
    """``tenant -> {overall, tiers: {tier -> {gateway, client}}}``."""
    by_tenant: dict[str, list[QoERecord]] = {}
    for r in records:
        by_tenant.setdefault(r.tenant, []).append(r)
    out: dict[str, Any] = {}
    for tenant, recs in sorted(by_tenant.items()):
        tiers: dict[str, list[QoERecord]] = {}
        for r in recs:
            tiers.setdefault(r.tier, []).append(r)
        out[tenant] = {
            "overall": _pair(recs),
            "tiers": {tier: _pair(rs) for tier, rs in sorted(tiers.items())},
        }
    return out


class Telemetry:
    """Reports in, records batched out, summaries (see the module docstring)."""

    def __init__(
        self, cfg: TelemetryConfig, limits: LimitsConfig, store: Store, metrics: GatewayMetrics
    ) -> None:
        self.cfg = cfg
        self.max_tokens = limits.max_tokens * limits.max_n  # the most a timeline may count
        self.store = store
        self.metrics = metrics
        self._pending: list[QoERecord] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._flush_loop(), name="tokenpace-telemetry"
        )

    async def aclose(self) -> None:
        if self._task is not None:
            await stop(self._task)
            self._task = None
        with contextlib.suppress(Exception):
            await self._flush()

    # -- gateway side ------------------------------------------------------------------
    def record_stream(self, ctx: RequestContext, result: StreamOutcome) -> None:
        """Queue the gateway-side QoE of a finished stream (a completed one has it)."""
        if result.qoe_andes is None or result.qoe_monotone is None:
            return
        if len(self._pending) >= _PENDING_MAX:
            return
        self._pending.append(
            QoERecord(
                ctx.request_id,
                ctx.tenant,
                ctx.tier.name,
                "gateway",
                result.qoe_andes,
                result.qoe_monotone,
                result.outcome,
            )
        )

    async def _flush(self) -> None:
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        try:
            await self.store.add_qoe(batch)
        except StoreUnavailable:
            self._pending = (batch + self._pending)[-_PENDING_MAX:]

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL_S)
            try:
                await self._flush()
            except Exception:
                log.warning("writing QoE records failed", exc_info=True)

    # -- client side --------------------------------------------------------------------------
    async def report(
        self, tenant: str, body: bytes, token_request_id: str | None = None
    ) -> dict[str, Any]:
        """Validate, check ownership, recompute, store; raise GatewayError otherwise.

        ``token_request_id``: the report came with a telemetry token for that request
        (:mod:`gateway.telemetry.tokens`); a report on another request, or a second one on
        it (the token used again), gets 403.
        """
        cfg = self.cfg
        check_size(body, cfg.max_body_bytes)
        allowed, wait = await self.store.hit(tenant, "tel", cfg.requests_per_minute)
        if not allowed:
            raise too_many_reports(cfg.requests_per_minute, wait)
        try:
            report = TelemetryReport.model_validate_json(body or b"null")
        except ValidationError as exc:
            raise validation_error(exc.errors(include_url=False)) from None
        max_tokens = self.max_tokens
        for name in ("arrivals", "displayed"):
            timeline = getattr(report, name)
            if len(timeline) > cfg.max_points:
                raise bad_request(
                    f"'{name}' has {len(timeline)} entries; at most {cfg.max_points}.",
                    param=name,
                    code="invalid_value",
                )
            if sum(n for _, n in timeline) > max_tokens:
                raise bad_request(
                    f"'{name}' counts more than {max_tokens} tokens.",
                    param=name,
                    code="invalid_value",
                )
        if token_request_id is not None and report.request_id != token_request_id:
            raise forbidden(
                f"The telemetry token is for request {token_request_id}, not "
                f"{report.request_id}: send each report with its own response's token.",
                "request_id",
                "telemetry_token_mismatch",
            )
        info = await self.store.request_info(report.request_id)
        if info is None or info.tenant != tenant:
            raise unknown_request(report.request_id)
        try:
            andes, mono = _qoe(report.arrivals, info.ttft, info.tds)
            shown_andes, shown_mono = _qoe(report.displayed, info.ttft, info.tds)
        except ValueError as exc:
            name = "displayed" if "displayed" in str(exc) else "arrivals"
            raise bad_request(str(exc), param=name, code="invalid_value") from None
        record = QoERecord(
            report.request_id,
            tenant,
            info.tier,
            "client",
            andes,
            mono,
            report.outcome,
            shown_andes if report.displayed else None,
            shown_mono if report.displayed else None,
        )
        (result,) = await self.store.add_qoe([record])
        if result == "unknown":
            raise unknown_request(report.request_id)
        if result == "duplicate" and token_request_id is not None:
            raise forbidden(
                f"The telemetry token was already used: request {report.request_id} was "
                "already reported.",
                "request_id",
                "telemetry_token_used",
            )
        if result == "duplicate":
            raise duplicate_report(report.request_id)
        return {
            "object": "tokenpace.telemetry",
            "stored": result == "ok",  # False: buffered while the shared store is down (202)
            "request_id": report.request_id,
            "tier": info.tier,
            "expected": {"ttft": info.ttft, "tds": info.tds},
            "qoe": {
                "andes": andes,
                "monotone": mono,
                "displayed_andes": record.displayed_andes,
                "displayed_monotone": record.displayed_monotone,
            },
        }

    # -- summaries ---------------------------------------------------------------------------------
    async def summary(self, tenant: str | None, window_s: float) -> dict[str, Any]:
        records = await self.store.qoe_records(time.time() - window_s, tenant)
        tenants = summarize(records)
        if tenant is not None:
            tenants.setdefault(tenant, {"overall": _pair([]), "tiers": {}})
        return {"object": "tokenpace.qoe_summary", "window_s": window_s, "tenants": tenants}

    async def refresh_metrics(self) -> None:
        """Recompute the ``/metrics`` summary (kept as it was if the store fails)."""
        with contextlib.suppress(StoreUnavailable):
            records = await self.store.qoe_records(time.time() - self.cfg.window_s)
            self.metrics.qoe_window.summary = summarize(records)


def check_size(body: bytes, limit: int) -> None:
    """413 for a report over ``telemetry.max_body_bytes``."""
    if len(body) > limit:
        raise report_too_large(limit)
