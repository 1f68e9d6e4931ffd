"""The body a backend receives (docs/protocol.md, "Gateway → engine").

The client's JSON is relayed untouched except for:

- ``tokenpace`` is removed (it is the gateway's, no engine knows it);
- ``priority`` sent by the client is removed: the queue position is the gateway's
  decision. Backends declaring ``supports_priority`` get the tier's priority instead;
- for backends running the tokenpace scheduler, ``vllm_xargs`` gets the tags
  (:mod:`qos.tags`: tier, TTFT, TDS, tenant, weight, request id), merged into any
  ``vllm_xargs`` the client sent (the gateway's ``tp_*`` values win; a client cannot
  pick its own tier or weight this way). Other backends get no tags, and any ``tp_*``
  key a client put in ``vllm_xargs`` is dropped.
"""

from __future__ import annotations

from typing import Any

from gateway.backends import Backend
from gateway.context import RequestContext
from qos.tags import TAG_PREFIX, RequestTags, encode_tags


def tags(ctx: RequestContext) -> dict[str, str | float]:
    """The ``tp_*`` entries of ``vllm_xargs`` for ``ctx`` (encoded by :mod:`qos.tags`)."""
    tier = ctx.tier
    return encode_tags(
        RequestTags(
            tier=tier.name,
            ttft=tier.ttft,
            tds=tier.tds,
            tenant=ctx.tenant,
            weight=ctx.weight,
            request_id=ctx.request_id,
        )
    )


def upstream_body(raw: dict[str, Any], ctx: RequestContext, backend: Backend) -> dict[str, Any]:
    """A shallow copy of the client's body, tagged for ``backend``."""
    body = {k: v for k, v in raw.items() if k not in ("tokenpace", "priority")}
    client_xargs = body.get("vllm_xargs")
    kept: dict[str, Any] = {}
    client_tagged = False  # the client sent tp_* keys of its own
    if isinstance(client_xargs, dict):
        kept = {k: v for k, v in client_xargs.items() if not str(k).startswith(TAG_PREFIX)}
        client_tagged = len(kept) != len(client_xargs)
    if backend.tokenpace:
        body["vllm_xargs"] = {**kept, **tags(ctx)}
    elif client_tagged:
        if kept:
            body["vllm_xargs"] = kept
        else:  # it held only tp_* keys
            del body["vllm_xargs"]
    if backend.supports_priority:
        body["priority"] = int(ctx.tier.priority)
    return body
