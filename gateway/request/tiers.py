"""Tier resolution, per docs/protocol.md ("Client → gateway: choosing a tier").

Inputs: the ``X-TokenPace-Tier`` header, the body's ``tokenpace`` object, the tenant's
plan and the operator's tier table. Output: the :class:`ResolvedTier` the request is
served under (what the response headers announce and the engine is told), or a
:class:`~gateway.errors.GatewayError`: 400 for an unknown tier, out-of-range numbers or
a header that contradicts the body; 403 for a tier outside the plan or explicit numbers
without ``allow_custom``.
"""

from __future__ import annotations

import math
from typing import Any

from gateway.config.schema import CUSTOM_TIER, GatewayConfig, TenantConfig
from gateway.context import ResolvedTier
from gateway.errors import bad_request, forbidden

TIER_HEADER = "X-TokenPace-Tier"


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
    if header_tier is not None:
        header_tier = header_tier.strip()
        if not header_tier:
            raise bad_request(f"Empty {TIER_HEADER} header.", param=TIER_HEADER)
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

    # Explicit expectations: validate the numbers first (400), then the plan (403).
    limits = config.custom_tier_limits
    ttft, tds = base.ttft, base.tds
    if ttft_raw is not None:
        ttft = _number(ttft_raw, "tokenpace.ttft")
        if not limits.ttft_min <= ttft <= limits.ttft_max:
            raise bad_request(
                f"Invalid value for 'tokenpace.ttft': {ttft} is outside "
                f"[{limits.ttft_min}, {limits.ttft_max}] seconds.",
                param="tokenpace.ttft",
            )
    if tds_raw is not None:
        tds = _number(tds_raw, "tokenpace.tds")
        if not limits.tds_min <= tds <= limits.tds_max:
            raise bad_request(
                f"Invalid value for 'tokenpace.tds': {tds} is outside "
                f"[{limits.tds_min}, {limits.tds_max}] tokens/s.",
                param="tokenpace.tds",
            )
    if not tenant.allow_custom:
        raise forbidden(
            "Explicit tokenpace.ttft/tds are not in your plan; choose a tier instead.",
            param="tokenpace.ttft" if ttft_raw is not None else "tokenpace.tds",
            code="custom_tier_not_allowed",
        )
    return ResolvedTier(CUSTOM_TIER, ttft, tds, base.priority)
