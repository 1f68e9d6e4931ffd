"""QoE telemetry: the SDKs' reports, the gateway's own measurements, their summary.

``POST /v1/tokenpace/telemetry`` (docs/protocol.md, "SDK → gateway: QoE telemetry"):
the report is validated strictly (:class:`TelemetryReport`, bounded in size, length,
times and counts), its request id must be one of the caller's (else 404) and not
reported yet (409, or 403 with a telemetry token), and only then is it charged to the
tenant's telemetry rate limit, in the same store call that stores it: a report that is
refused costs the tenant nothing. The gateway recomputes the QoE itself from the
timelines, never trusting a client's number: Andes QoE (Liu et al. §3.1, Eq. 1,
:func:`qos.metrics.andes_qoe`) and the monotone variant (:func:`qos.metrics.monotone_qoe`)
of the *arrivals* and of the *displayed* timeline (what the pacing buffer showed), and
what the reader saw of the arrivals (:func:`qos.metrics.freezes`, the SDKs' release
rule, its freezes counted only while the reader watched: outside the report's optional
``away`` intervals; and the user idle latency of Wang et al. Eq. 9,
:func:`qos.metrics.user_idle_latency`), against the tier the gateway served the request
under (the ``expected`` the client sends is checked for form only). A timeline whose
numbers give no finite QoE is a 400 naming it, before anything is written.

Every completed stream the gateway relays adds a ``gateway`` record with the same
measures of its emission times, measured in batches (:mod:`gateway.telemetry.replies`)
when the records are flushed, one store call per replica every :data:`FLUSH_INTERVAL_S`,
and when ``/metrics`` is read (the ``tokenpace_qoe`` and reader histograms are observed
then). ``GET
/v1/tokenpace/qoe`` puts both sides next to each other per tenant and tier over a
window; ``/metrics`` exports the same summary (``tokenpace_qoe_window``). Both read the
store's aggregates (:mod:`gateway.store.aggregates`), never the records, and a summary
is read at most once every :data:`SUMMARY_TTL_S` per window and tenant.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.background import stop
from gateway.config.schema import LimitsConfig, TelemetryConfig
from gateway.context import RequestContext, StreamOutcome
from gateway.errors import GatewayError, bad_request, forbidden, validation_error
from gateway.store import (
    QoEAggregates,
    QoERecord,
    Store,
    StoreCommandError,
    StoreUnavailable,
    aggregates,
)
from gateway.store.base import MAX_SECONDS
from gateway.telemetry.errors import (
    duplicate_report,
    report_too_large,
    too_many_reports,
    unknown_request,
)
from gateway.telemetry.metrics import GatewayMetrics, QoESummary, series
from gateway.telemetry.replies import Replies
from qos.metrics import freezes, reply_qoe, watched_times

log = logging.getLogger("tokenpace.gateway.telemetry")

FLUSH_INTERVAL_S = 0.25
SUMMARY_TTL_S = 1.0  # a summary is read from the store at most this often (per window)
MAX_TIMELINE_S = MAX_SECONDS  # a time in a report: seconds since the request, at most a day
_PENDING_MAX = 10000
_CACHED_MAX = 256  # summaries kept (windows and tenants asked for in the last second)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class Expected(_Strict):
    ttft: float = Field(ge=0)
    tds: float = Field(gt=0)


class SdkInfo(_Strict):
    name: str = Field(max_length=64)
    version: str = Field(max_length=64)


Seconds = Annotated[float, Field(ge=0, le=MAX_TIMELINE_S)]
Tokens = Annotated[int, Field(ge=1)]


class TelemetryReport(_Strict):
    """The SDK's report on one request (docs/protocol.md)."""

    request_id: str = Field(pattern=r"^[0-9a-f]{32}$", description="the X-Request-Id")
    expected: Expected
    arrivals: list[tuple[Seconds, Tokens]] = Field(
        description="[seconds since the request was sent, tokens] per chunk received"
    )
    displayed: list[tuple[Seconds, Tokens]] = Field(
        default_factory=list, description="the same for tokens shown to the user"
    )
    outcome: Literal["completed", "aborted", "error"]
    away: list[tuple[Seconds, Seconds]] | None = Field(
        None,
        description="[start, end] seconds since the request was sent, in time order, not "
        "overlapping: when the reader was away (freezes count only outside them)",
    )
    sdk: SdkInfo | None = None


def _invalid_timeline(name: str, why: str) -> GatewayError:
    return bad_request(f"'{name}' {why}.", param=name, code="invalid_value")


def _measure(
    name: str,
    timeline: list[tuple[float, int]],
    ttft: float,
    tds: float,
    away: list[tuple[float, float]] | None = None,
) -> dict[str, Any]:
    """The QoE of a timeline (0 when empty: nothing reached the user) and, for a timeline
    that is not empty, what its reader saw, its freezes counted only while the reader
    watched (``away``: :func:`qos.metrics.freezes`); 400 naming the timeline when it is not
    one or its numbers give no finite, in-range value."""
    if not timeline:
        return {"andes": 0.0, "monotone": 0.0}
    try:
        qoe = reply_qoe(timeline, ttft, tds)
        seen = freezes(timeline, tds, away) if away else qoe.freezes
        out: dict[str, Any] = {
            "andes": qoe.andes,
            "monotone": qoe.monotone,
            "longest_freeze_s": seen.longest_s,
            "freezes": seen.count,
            "idle_s": qoe.idle_s,
        }
    except ValueError as exc:
        raise _invalid_timeline(name, f"is not a timeline: {exc}") from None
    for key, value in out.items():
        high = 1.0 if key in ("andes", "monotone") else MAX_SECONDS
        if key != "freezes" and not (math.isfinite(value) and 0.0 <= value <= high):
            raise _invalid_timeline(name, f"gives {key} = {value}, not a number in [0, {high}]")
    return out


def _side(g: Mapping[str, float] | None) -> dict[str, Any]:
    """One side's summary from its aggregate (gateway.store.aggregates)."""
    if not g or g.get("n", 0.0) <= 0:
        return {"count": 0}
    out: dict[str, Any] = {"count": int(g["n"])}
    hists = aggregates.histograms(g)
    for metric in ("andes", "monotone", "displayed_andes"):
        stats = aggregates.qoe_stats(g, metric, hists)
        if stats is not None:
            out[metric] = stats
    reader = aggregates.reader_summary(g, hists)
    if reader is not None:
        out["reader"] = reader.as_dict()
    away = aggregates.away_summary(g)
    if away is not None:
        out["away"] = away
    return out


def summarize(groups: QoEAggregates) -> QoESummary:
    """``tenant -> {overall, tiers: {tier -> {gateway, client}}}``."""
    by_tenant: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for (tenant, tier, side), g in groups.items():
        by_tenant.setdefault(tenant, {}).setdefault(tier, {})[side] = g
    out: dict[str, Any] = {}
    for tenant, tiers in sorted(by_tenant.items()):
        overall = {
            side: aggregates.combine(t[side] for t in tiers.values() if side in t)
            for side in ("gateway", "client")
        }
        out[tenant] = {
            "overall": _pair(overall),
            "tiers": {tier: _pair(sides) for tier, sides in sorted(tiers.items())},
        }
    return out


def _pair(sides: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    return {"gateway": _side(sides.get("gateway")), "client": _side(sides.get("client"))}


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
        self._replies = Replies(_PENDING_MAX)  # completed streams, their QoE not measured yet
        self._task: asyncio.Task[None] | None = None
        self._qoe = series(metrics.qoe)
        self._freeze = series(metrics.longest_freeze)
        self._idle = series(metrics.user_idle)
        # (tenant or None, window) -> (when read, the read): at most one per SUMMARY_TTL_S
        self._summaries: dict[tuple[str | None, float], tuple[float, asyncio.Future[Any]]] = {}

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._flush_loop(), name="tokenpace-telemetry"
        )

    async def aclose(self) -> None:
        if self._task is not None:
            await stop(self._task)
            self._task = None
        with contextlib.suppress(Exception):
            await self.flush()

    # -- gateway side ------------------------------------------------------------------
    def record_stream(self, ctx: RequestContext, result: StreamOutcome) -> None:
        """Queue a finished stream for its gateway-side QoE (a completed one has it)."""
        if result.emissions is not None:
            self._replies.add(ctx, result.outcome, result.emissions)

    def _measure_streams(self) -> None:
        """The QoE of the streams queued: observed (``tokenpace_qoe`` and the reader's
        histograms) and queued as records."""
        qoe_of = self._qoe
        for reply, qoe in self._replies.measure():
            record = QoERecord(
                reply.request_id,
                reply.tenant,
                reply.tier,
                "gateway",
                qoe.andes,
                qoe.monotone,
                reply.outcome,
                longest_freeze_s=qoe.freezes.longest_s,
                freezes=qoe.freezes.count,
                idle_s=qoe.idle_s,
            )
            qoe_of(reply.tenant, reply.tier, "andes").observe(qoe.andes)
            qoe_of(reply.tenant, reply.tier, "monotone").observe(qoe.monotone)
            self._observe(record)
            if len(self._pending) < _PENDING_MAX:
                self._pending.append(record)

    def _observe(self, rec: QoERecord) -> None:
        """The reader's histograms (``tokenpace_longest_freeze_seconds``, ``_user_idle_``)."""
        if rec.longest_freeze_s is not None and rec.idle_s is not None:
            self._freeze(rec.tenant, rec.tier, rec.side).observe(rec.longest_freeze_s)
            self._idle(rec.tenant, rec.tier, rec.side).observe(rec.idle_s)

    async def flush(self) -> None:
        """Measure the queued streams and write the queued records now (the flush loop
        does every ``FLUSH_INTERVAL_S``)."""
        self._measure_streams()
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
                await self.flush()
            except Exception:
                log.warning("writing QoE records failed", exc_info=True)

    # -- client side --------------------------------------------------------------------------
    async def report(
        self, tenant: str, body: bytes, token_request_id: str | None = None
    ) -> dict[str, Any]:
        """Validate, check ownership and reuse, recompute, then charge and store in one
        store call; raise GatewayError otherwise.

        ``token_request_id``: the report came with a telemetry token for that request
        (:mod:`gateway.telemetry.tokens`); a report on another request, or a second one on
        it (the token used again), gets 403, and costs the tenant nothing.
        """
        cfg = self.cfg
        check_size(body, cfg.max_body_bytes)
        try:
            report = TelemetryReport.model_validate_json(body or b"null")
        except ValidationError as exc:
            raise validation_error(exc.errors(include_url=False)) from None
        max_tokens = self.max_tokens
        for name in ("arrivals", "displayed"):
            timeline = getattr(report, name)
            if len(timeline) > cfg.max_points:
                raise _invalid_timeline(
                    name, f"has {len(timeline)} entries; at most {cfg.max_points}"
                )
            if sum(n for _, n in timeline) > max_tokens:
                raise _invalid_timeline(name, f"counts more than {max_tokens} tokens")
        away = _away(report.away, cfg.max_points)
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
        if info.reported:
            raise _reported(report.request_id, token_request_id)
        arrived = _measure("arrivals", report.arrivals, info.ttft, info.tds, away)
        shown = _measure("displayed", report.displayed, info.ttft, info.tds, away)
        record = QoERecord(
            report.request_id,
            tenant,
            info.tier,
            "client",
            arrived["andes"],
            arrived["monotone"],
            report.outcome,
            shown["andes"] if report.displayed else None,
            shown["monotone"] if report.displayed else None,
            longest_freeze_s=arrived.get("longest_freeze_s"),
            freezes=arrived.get("freezes"),
            idle_s=arrived.get("idle_s"),
            away_s=None if away is None else sum(end - start for start, end in away),
        )
        result, wait_ms = await self.store.add_report(record, cfg.requests_per_minute)
        if result == "limited":
            raise too_many_reports(cfg.requests_per_minute, wait_ms)
        if result == "unknown":
            raise unknown_request(report.request_id)
        if result == "duplicate":
            raise _reported(report.request_id, token_request_id)
        self._observe(record)
        return {
            "object": "tokenpace.telemetry",
            "stored": result == "ok",  # False: buffered while the shared store is down (202)
            "request_id": report.request_id,
            "tier": info.tier,
            "expected": {"ttft": info.ttft, "tds": info.tds},
            "qoe": {
                "andes": record.andes,
                "monotone": record.monotone,
                "displayed_andes": record.displayed_andes,
                "displayed_monotone": record.displayed_monotone,
                "longest_freeze_s": record.longest_freeze_s,
                "freezes": record.freezes,
                "idle_s": record.idle_s,
                "away_s": record.away_s,
            },
        }

    # -- summaries ---------------------------------------------------------------------------------
    async def _aggregates(self, tenant: str | None, window_s: float) -> QoEAggregates:
        """The store's aggregates of the window, read at most once per SUMMARY_TTL_S (a
        flood of scrapes or calls costs the store one read a second); callers meanwhile
        share that read."""
        now = time.monotonic()
        key = (tenant, float(window_s))
        cached = self._summaries.get(key)
        if cached is None or now - cached[0] >= SUMMARY_TTL_S:
            if len(self._summaries) >= _CACHED_MAX:
                self._summaries = {
                    k: v for k, v in self._summaries.items() if now - v[0] < SUMMARY_TTL_S
                }
            read = asyncio.ensure_future(self.store.qoe_window(window_s, tenant))
            cached = self._summaries[key] = (now, read)
        try:
            result: QoEAggregates = await asyncio.shield(cached[1])
        except Exception:
            if self._summaries.get(key) is cached:
                del self._summaries[key]  # a failed read is not kept
            raise
        return result

    async def summary(self, tenant: str | None, window_s: float) -> dict[str, Any]:
        tenants = summarize(await self._aggregates(tenant, window_s))
        if tenant is not None:
            tenants.setdefault(tenant, {"overall": _pair({}), "tiers": {}})
        return {"object": "tokenpace.qoe_summary", "window_s": window_s, "tenants": tenants}

    async def refresh_metrics(self) -> None:
        """Observe the queued streams' QoE and recompute the ``/metrics`` summary (kept
        as it was if the store fails)."""
        self._measure_streams()
        with contextlib.suppress(StoreUnavailable, StoreCommandError):
            groups = await self._aggregates(None, self.cfg.window_s)
            self.metrics.qoe_window.summary = summarize(groups)


def _away(
    away: list[tuple[float, float]] | None, max_points: int
) -> list[tuple[float, float]] | None:
    """The report's away intervals, checked as :func:`qos.metrics.watched_times` reads
    them (400 naming ``away`` otherwise)."""
    if away is None:
        return None
    if len(away) > max_points:
        raise _invalid_timeline("away", f"has {len(away)} intervals; at most {max_points}")
    try:
        watched_times(np.zeros(0), away)
    except ValueError as exc:
        raise _invalid_timeline("away", f"is not a list of intervals: {exc}") from None
    return away


def _reported(request_id: str, token_request_id: str | None) -> GatewayError:
    """A second report on a request: 403 with a telemetry token, else 409."""
    if token_request_id is not None:
        return forbidden(
            f"The telemetry token was already used: request {request_id} was already reported.",
            "request_id",
            "telemetry_token_used",
        )
    return duplicate_report(request_id)


def check_size(body: bytes, limit: int) -> None:
    """413 for a report over ``telemetry.max_body_bytes``."""
    if len(body) > limit:
        raise report_too_large(limit)
