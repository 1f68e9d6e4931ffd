"""The operator's API, guarded by the admin key (``admin.key_sha256``).

``Authorization: Bearer ADMIN_KEY`` on every route; keys are identified by their
SHA-256 digest (what the configuration and the store hold; never the key itself):

- ``GET /v1/tokenpace/admin/tenants``: tenants, weights, limits and live key ids;
- ``POST /v1/tokenpace/admin/tenants/{tenant}/keys``: a new key (shown once), 201;
- ``POST /v1/tokenpace/admin/tenants/{tenant}/keys/{key_id}/rotate``: a new key, and
  the old one revoked, 201;
- ``DELETE /v1/tokenpace/admin/tenants/{tenant}/keys/{key_id}``: revoke, for good
  (also a configured key: a restart does not bring it back).

Key changes go to the shared store (every replica sees them within
``store.key_cache_s``); while Redis is down, or while this replica's copy of the key
table is not known to match it (start-up, restoring a Redis that lost its data), they
are refused with 503, never made on one replica only (docs/architecture/gateway.md, "API keys:
what survives what").
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Annotated, Any

from fastapi import FastAPI, Path, Security
from starlette.responses import JSONResponse

from gateway.config.schema import TenantConfig, hash_key, new_api_key
from gateway.errors import GatewayError
from gateway.http.auth import admin_key
from gateway.http.keys import KeyCache
from gateway.request.schemas import ErrorResponse
from gateway.store import Store

KeyId = Annotated[str, Path(pattern=r"^[0-9a-f]{64}$", description="the key's SHA-256 digest")]


def tenant_not_found(name: str) -> GatewayError:
    return GatewayError(404, f"No tenant {name!r}.", param="tenant", code="tenant_not_found")


def key_not_found(key_id: str) -> GatewayError:
    return GatewayError(404, f"No live key {key_id} for this tenant.", param="key_id")


def admin_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    what = {
        400: "A malformed key id (64 hexadecimal characters)",
        401: "Missing or wrong admin key",
        404: "No such tenant, or no such live key of the tenant",
        503: "The shared store is unreachable, or its key table is being restored; Retry-After",
    }
    return {c: {"model": ErrorResponse, "description": what[c]} for c in codes}


def add_admin_routes(
    app: FastAPI,
    tenants: Mapping[str, TenantConfig],
    store: Store,
    keys: KeyCache,
) -> None:
    deps = [Security(admin_key)]  # names the key in the OpenAPI document: the gate checks it
    tags: list[str | Enum] = ["admin"]

    def known(name: str) -> None:
        if name not in tenants:
            raise tenant_not_found(name)

    async def new_key(tenant: str) -> tuple[str, str]:
        key = new_api_key()
        digest = hash_key(key)
        await store.add_key(tenant, digest)
        return key, digest

    @app.get(
        "/v1/tokenpace/admin/tenants",
        tags=tags,
        dependencies=deps,
        responses=admin_responses(401, 503),
    )
    async def list_tenants() -> dict[str, Any]:
        data = [
            {
                "name": name,
                "weight": t.weight,
                "requests_per_minute": t.requests_per_minute,
                "tokens_per_minute": t.tokens_per_minute,
                "token_budget": t.token_budget,
                "max_queued": t.max_queued,
                "keys": await store.tenant_keys(name),
            }
            for name, t in tenants.items()
        ]
        return {"object": "list", "data": data}

    @app.post(
        "/v1/tokenpace/admin/tenants/{tenant}/keys",
        tags=tags,
        dependencies=deps,
        status_code=201,
        responses=admin_responses(401, 404, 503),
    )
    async def add_key(tenant: str) -> JSONResponse:
        known(tenant)
        key, digest = await new_key(tenant)
        return JSONResponse({"tenant": tenant, "id": digest, "key": key}, status_code=201)

    @app.post(
        "/v1/tokenpace/admin/tenants/{tenant}/keys/{key_id}/rotate",
        tags=tags,
        dependencies=deps,
        status_code=201,
        responses=admin_responses(400, 401, 404, 503),
    )
    async def rotate_key(tenant: str, key_id: KeyId) -> JSONResponse:
        known(tenant)
        if key_id not in await store.tenant_keys(tenant):
            raise key_not_found(key_id)
        key, digest = await new_key(tenant)
        await store.revoke_key(tenant, key_id)
        keys.forget(key_id)
        body = {"tenant": tenant, "id": digest, "key": key, "revoked": key_id}
        return JSONResponse(body, status_code=201)

    @app.delete(
        "/v1/tokenpace/admin/tenants/{tenant}/keys/{key_id}",
        tags=tags,
        dependencies=deps,
        responses=admin_responses(400, 401, 404, 503),
    )
    async def revoke_key(tenant: str, key_id: KeyId) -> dict[str, Any]:
        known(tenant)
        if not await store.revoke_key(tenant, key_id):
            raise key_not_found(key_id)
        keys.forget(key_id)
        return {"tenant": tenant, "id": key_id, "revoked": True}
