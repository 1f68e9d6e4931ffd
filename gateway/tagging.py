"""The body a backend receives (docs/protocol.md, "Gateway → engine").

The client's JSON is relayed untouched except for:

- ``tokenpace`` is removed (it is the gateway's, no engine knows it);
- ``priority`` sent by the client is removed: the queue position is the gateway's
  decision. Backends declaring ``supports_priority`` get the tier's priority instead;
- for backends running the tokenpace scheduler, ``vllm_xargs`` gets the tags
  ``tp_tier, tp_ttft, tp_tds, tp_tenant, tp_weight, tp_request_id``, merged into any
  ``vllm_xargs`` the client sent (the gateway's ``tp_*`` values win; a client cannot
  pick its own tier or weight this way). Other backends get no tags, and any ``tp_*``
  key a client put in ``vllm_xargs`` is dropped.
"""

from __future__ import annotations

from typing import Any

from gateway.backends import Backend
from gateway.context import RequestContext

TAG_KEYS = ("tp_tier", "tp_ttft", "tp_tds", "tp_tenant", "tp_weight", "tp_request_id")


def tags(ctx: RequestContext) -> dict[str, Any]:
    return {
        "tp_tier": ctx.tier.name,
        "tp_ttft": float(ctx.tier.ttft),
        "tp_tds": float(ctx.tier.tds),
        "tp_tenant": ctx.tenant,
        "tp_weight": float(ctx.weight),
        "tp_request_id": ctx.request_id,
    }


def upstream_body(raw: dict[str, Any], ctx: RequestContext, backend: Backend) -> dict[str, Any]:
    """A shallow copy of the client's body, tagged for ``backend``."""
    body = {k: v for k, v in raw.items() if k not in ("tokenpace", "priority")}
    client_xargs = body.get("vllm_xargs")
    if isinstance(client_xargs, dict):
        kept = {k: v for k, v in client_xargs.items() if not str(k).startswith("tp_")}
    else:
        kept = None
    if backend.tokenpace:
        body["vllm_xargs"] = {**(kept or {}), **tags(ctx)}
    elif kept is not None and len(kept) != len(client_xargs):
        if kept:
            body["vllm_xargs"] = kept
        else:  # it held only tp_* keys
            del body["vllm_xargs"]
    if backend.supports_priority:
        body["priority"] = int(ctx.tier.priority)
    return body
