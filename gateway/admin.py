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
are refused with 503, never made on one replica only (docs/architecture.md, "API keys:
what survives what").
"""

from __future__ import annotations

import hmac
from typing import Annotated, Any

from fastapi import FastAPI, Path, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.responses import JSONResponse

from gateway.admission import store_unavailable
from gateway.config import hash_key, new_api_key
from gateway.errors import GatewayError, unauthorized
from gateway.schemas import ErrorResponse
from gateway.state import GatewayState
from gateway.store import StoreUnavailable

ADMIN_PREFIX = "/v1/tokenpace/admin/"

_admin_bearer = HTTPBearer(
    auto_error=False, scheme_name="AdminKey", description="The operator's admin key."
)

KeyId = Annotated[str, Path(pattern=r"^[0-9a-f]{64}$", description="the key's SHA-256 digest")]


def is_admin(gw: GatewayState, authorization: str | None) -> bool:
    """True when ``authorization`` carries the admin key (compared in constant time)."""
    digest = gw.config.admin.key_sha256
    if not digest or not authorization:
        return False
    scheme, _, key = authorization.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        return False
    return hmac.compare_digest(hash_key(key.strip()), digest)


async def admin_dependency(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_admin_bearer)],
) -> None:
    if not is_admin(request.app.state.gateway, request.headers.get("authorization")):
        raise unauthorized("This route needs the gateway's admin key.")


def _tenant(gw: GatewayState, name: str) -> None:
    if name not in gw.tenants:
        raise GatewayError(404, f"No tenant {name!r}.", param="tenant", code="tenant_not_found")


async def _new_key(gw: GatewayState, tenant: str) -> tuple[str, str]:
    key = new_api_key()
    digest = hash_key(key)
    await gw.store.add_key(tenant, digest)
    return key, digest


def admin_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    what = {
        400: "A malformed key id (64 hexadecimal characters)",
        401: "Missing or wrong admin key",
        404: "No such tenant, or no such live key of the tenant",
        503: "The shared store is unreachable, or its key table is being restored; Retry-After",
    }
    return {c: {"model": ErrorResponse, "description": what[c]} for c in codes}


def add_admin_routes(app: FastAPI) -> None:
    deps = [Security(admin_dependency)]
    tags = ["admin"]

    def gw_of(request: Request) -> GatewayState:
        return request.app.state.gateway

    @app.get(
        "/v1/tokenpace/admin/tenants",
        tags=tags,
        dependencies=deps,
        responses=admin_responses(401, 503),
    )
    async def list_tenants(request: Request) -> dict[str, Any]:
        gw = gw_of(request)
        data = []
        try:
            for name, t in gw.tenants.items():
                data.append(
                    {
                        "name": name,
                        "weight": t.weight,
                        "requests_per_minute": t.requests_per_minute,
                        "tokens_per_minute": t.tokens_per_minute,
                        "token_budget": t.token_budget,
                        "max_queued": t.max_queued,
                        "keys": await gw.store.tenant_keys(name),
                    }
                )
        except StoreUnavailable:
            raise store_unavailable() from None
        return {"object": "list", "data": data}

    @app.post(
        "/v1/tokenpace/admin/tenants/{tenant}/keys",
        tags=tags,
        dependencies=deps,
        status_code=201,
        responses=admin_responses(401, 404, 503),
    )
    async def add_key(request: Request, tenant: str) -> JSONResponse:
        gw = gw_of(request)
        _tenant(gw, tenant)
        try:
            key, digest = await _new_key(gw, tenant)
        except StoreUnavailable:
            raise store_unavailable() from None
        return JSONResponse({"tenant": tenant, "id": digest, "key": key}, status_code=201)

    @app.post(
        "/v1/tokenpace/admin/tenants/{tenant}/keys/{key_id}/rotate",
        tags=tags,
        dependencies=deps,
        status_code=201,
        responses=admin_responses(400, 401, 404, 503),
    )
    async def rotate_key(request: Request, tenant: str, key_id: KeyId) -> JSONResponse:
        gw = gw_of(request)
        _tenant(gw, tenant)
        try:
            if key_id not in await gw.store.tenant_keys(tenant):
                raise _no_key(key_id)
            key, digest = await _new_key(gw, tenant)
            await gw.store.revoke_key(tenant, key_id)
        except StoreUnavailable:
            raise store_unavailable() from None
        gw.keys.forget(key_id)
        body = {"tenant": tenant, "id": digest, "key": key, "revoked": key_id}
        return JSONResponse(body, status_code=201)

    @app.delete(
        "/v1/tokenpace/admin/tenants/{tenant}/keys/{key_id}",
        tags=tags,
        dependencies=deps,
        responses=admin_responses(400, 401, 404, 503),
    )
    async def revoke_key(request: Request, tenant: str, key_id: KeyId) -> dict[str, Any]:
        gw = gw_of(request)
        _tenant(gw, tenant)
        try:
            if not await gw.store.revoke_key(tenant, key_id):
                raise _no_key(key_id)
        except StoreUnavailable:
            raise store_unavailable() from None
        gw.keys.forget(key_id)
        return {"tenant": tenant, "id": key_id, "revoked": True}


def _no_key(key_id: str) -> GatewayError:
    return GatewayError(404, f"No live key {key_id} for this tenant.", param="key_id")
