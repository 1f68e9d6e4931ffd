"""Tiers a backend cannot serve as promised: a TDS at or above its batch-1 speed.

A backend whose latency is known (an ``embedded`` backend's ``profile``, :mod:`qos.latency`)
decodes at most 1 / decode_s(1) tokens per second per stream, at batch size 1, and
slower in any bigger batch. A tier asking for that speed or more is late on that backend
at any load: its QoE stays below 1 even when the engine is idle (the fast tier's
25 tokens/s is exactly the OPT-66B profile's batch-1 speed, 40 ms a step, and scores about
0.6 at light load). ``tokenpace check-config`` and the gateway at start-up warn about it;
nothing fails.
"""

from __future__ import annotations

from gateway.config.schema import GatewayConfig
from qos.latency import LatencyProfile, get_profile


def backend_profile(kind: str, options: dict) -> LatencyProfile | None:
    """The latency profile of a backend, if its kind has one (``embedded``)."""
    if kind != "embedded":
        return None
    from gateway.backends.embedded import EmbeddedOptions

    return get_profile(EmbeddedOptions.model_validate(options).profile)


def unservable_tiers(config: GatewayConfig) -> list[str]:
    """One warning per (tier, backend) whose TDS is at or above the backend's batch-1 speed,
    for the tiers some tenant may use."""
    used: set[str] = set()
    for tenant in config.tenants:
        used.update(tenant.tiers if tenant.tiers is not None else config.tiers)
    warnings = []
    for backend in config.backends:
        profile = backend_profile(backend.kind, backend.options)
        if profile is None:
            continue
        step_s = float(profile.decode_s(1))
        speed = 1.0 / step_s
        for name in sorted(used):
            tds = config.tiers[name].tds
            if tds >= speed:
                warnings.append(
                    f"tier {name!r} promises {tds:g} tokens/s, but backend {backend.name!r} "
                    f"(latency profile {profile.name}) delivers at most {speed:.3g} tokens/s "
                    f"per stream, at batch size 1 ({step_s * 1e3:.3g} ms a step): its "
                    f"streams will be late at any load"
                )
    return warnings
