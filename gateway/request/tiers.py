"""Tier resolution, per docs/protocol.md ("Client → gateway: choosing a tier").

Inputs: the ``X-TokenPace-Tier`` header, the body's ``tokenpace`` object, the tenant's
plan and the operator's tier table. Output: the :class:`ResolvedTier` the request is
served under (what the response headers announce and the engine is told), or a
:class:`~gateway.errors.GatewayError`: 400 for an unknown tier, malformed numbers or a
header that contradicts the body; 403 for a tier outside the plan or explicit numbers
without ``allow_custom``; 400 for explicit numbers outside the plan's range
(:func:`plan_limits`).
"""

from __future__ import annotations

import math
from typing import Any

from gateway.config.schema import CUSTOM_TIER, CustomTierLimits, GatewayConfig, TenantConfig
from gateway.context import ResolvedTier
from gateway.errors import bad_request, forbidden
from gateway.request.schemas import MAX_TIER_CHARS

TIER_HEADER = "X-TokenPace-Tier"
_SANE = CustomTierLimits()  # the widest range a plan gets without limits of its own


def plan_limits(config: GatewayConfig, tenant: TenantConfig) -> CustomTierLimits:
    """The range of explicit ttft/tds ``tenant``'s plan accepts: its ``custom_tier_limits``,
    else the range its tiers span: a TTFT no shorter than its shortest tier's and a TDS
    no faster than its fastest tier's (the slow ends as wide as any plan's)."""
    if tenant.custom_tier_limits is not None:
        return tenant.custom_tier_limits
    names = tenant.tiers if tenant.tiers is not None else list(config.tiers)
    tiers = [config.tiers[n] for n in names]
    return CustomTierLimits(
        ttft_min=min(t.ttft for t in tiers),
        ttft_max=max(_SANE.ttft_max, *(t.ttft for t in tiers)),
        tds_min=min(_SANE.tds_min, *(t.tds for t in tiers)),
        tds_max=max(t.tds for t in tiers),
    )


def _number(value: Any, param: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"Invalid value for '{param}': must be a number.", param=param)
    value = float(value)
    if not math.isfinite(value):
        raise bad_request(f"Invalid value for '{param}': must be finite.", param=param)
    return value


def resolve_tier(
    config: GatewayConfig,
    tenant: TenantConfig,
    header_tier: str | None,
    options: dict[str, Any] | None,
) -> ResolvedTier:
    """The tier a request is served under (see the module docstring for the rules)."""
    if options is not None and not isinstance(options, dict):
        raise bad_request("Invalid value for 'tokenpace': must be an object.", param="tokenpace")
    options = options or {}
    unknown = sorted(set(options) - {"tier", "ttft", "tds"})
    if unknown:
        raise bad_request(
            f"Unrecognized field in 'tokenpace': '{unknown[0]}' (expected tier, ttft, tds).",
            param=f"tokenpace.{unknown[0]}",
        )
    body_tier = options.get("tier")
    if body_tier is not None and not isinstance(body_tier, str):
        raise bad_request(
            "Invalid value for 'tokenpace.tier': must be a string.", param="tokenpace.tier"
        )
    if body_tier is not None and len(body_tier) > MAX_TIER_CHARS:
        raise bad_request(
            f"Invalid value for 'tokenpace.tier': longer than a tier's name "
            f"({MAX_TIER_CHARS} characters).",
            param="tokenpace.tier",
            code="unknown_tier",
        )
    if header_tier is not None:
        header_tier = header_tier.strip()
        if not header_tier:
            raise bad_request(f"Empty {TIER_HEADER} header.", param=TIER_HEADER)
        if len(header_tier) > MAX_TIER_CHARS:
            raise bad_request(
                f"{TIER_HEADER} is longer than a tier's name ({MAX_TIER_CHARS} characters).",
                param=TIER_HEADER,
                code="unknown_tier",
            )
    if header_tier is not None and body_tier is not None and header_tier != body_tier:
        raise bad_request(
            f"{TIER_HEADER} ({header_tier!r}) and tokenpace.tier ({body_tier!r}) disagree.",
            param="tokenpace.tier",
        )
    name = body_tier if body_tier is not None else header_tier
    param = "tokenpace.tier" if body_tier is not None else TIER_HEADER
    allowed = tenant.tiers if tenant.tiers is not None else list(config.tiers)

    if name is not None:
        if name not in config.tiers:
            raise bad_request(
                f"Unknown tier {name!r}; this gateway serves: {', '.join(sorted(config.tiers))}.",
                param=param,
                code="unknown_tier",
            )
        if name not in allowed:
            raise forbidden(
                f"Tier {name!r} is not in your plan; allowed: {', '.join(allowed)}.",
                param=param,
                code="tier_not_allowed",
            )
    base_name = name if name is not None else tenant.default_tier
    base = config.tiers[base_name]

    ttft_raw, tds_raw = options.get("ttft"), options.get("tds")
    if ttft_raw is None and tds_raw is None:
        return ResolvedTier(base_name, base.ttft, base.tds, base.priority, base.overload_after_s)

    # Explicit expectations: malformed numbers first (400), then the plan (403), then the
    # plan's range (400).
    ttft = base.ttft if ttft_raw is None else _number(ttft_raw, "tokenpace.ttft")
    tds = base.tds if tds_raw is None else _number(tds_raw, "tokenpace.tds")
    if ttft < 0:
        raise bad_request(
            "Invalid value for 'tokenpace.ttft': must be at least 0 seconds.",
            param="tokenpace.ttft",
        )
    if tds <= 0:
        raise bad_request(
            "Invalid value for 'tokenpace.tds': must be more than 0 tokens/s.",
            param="tokenpace.tds",
        )
    if not tenant.allow_custom:
        raise forbidden(
            "Explicit tokenpace.ttft/tds are not in your plan; choose a tier instead.",
            param="tokenpace.ttft" if ttft_raw is not None else "tokenpace.tds",
            code="custom_tier_not_allowed",
        )
    limits = plan_limits(config, tenant)
    if ttft_raw is not None and not limits.ttft_min <= ttft <= limits.ttft_max:
        raise bad_request(
            f"Invalid value for 'tokenpace.ttft': {ttft} is outside your plan's range "
            f"[{limits.ttft_min}, {limits.ttft_max}] seconds.",
            param="tokenpace.ttft",
        )
    if tds_raw is not None and not limits.tds_min <= tds <= limits.tds_max:
        raise bad_request(
            f"Invalid value for 'tokenpace.tds': {tds} is outside your plan's range "
            f"[{limits.tds_min}, {limits.tds_max}] tokens/s.",
            param="tokenpace.tds",
        )
    return ResolvedTier(CUSTOM_TIER, ttft, tds, base.priority)
