"""Who is calling: one authentication path for every route.

Each route that needs a credential has an access rule (:func:`access_rule`): a tenant's
API key, the admin key, either of them, a QoE report's credential (the API key, or the
response's telemetry token, :mod:`gateway.telemetry.tokens`), or the metrics token.
:class:`~gateway.http.gate.AccessGate` authenticates every request to such a route,
before its body is read, with :meth:`Authenticator.caller` (a report without an API
key: :meth:`Authenticator.reporter`, once its body is read) and leaves the
:class:`~gateway.context.Caller` on the request's record, where the routes read it
(:func:`caller_of`). The route dependencies below only name the credential in the
OpenAPI document.

``Authorization: Bearer KEY``: a tenant's key is looked up by its SHA-256 digest in
the store (cached per replica, :class:`~gateway.http.keys.KeyCache`); the admin key and
the metrics token are compared with their digests in constant time.
"""

from __future__ import annotations

import enum
import hmac
from collections.abc import Mapping
from typing import Annotated

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gateway.config.schema import TenantConfig, hash_key
from gateway.context import Caller, request_record
from gateway.errors import unauthorized
from gateway.http.keys import KeyCache
from gateway.telemetry.errors import missing_telemetry_credentials
from gateway.telemetry.tokens import BODY_FIELD, TOKEN_HEADER, TelemetryTokens, split_token

ADMIN_PREFIX = "/v1/tokenpace/admin/"
MODELS_PREFIX = "/v1/models/"  # one model: GET /v1/models/{model}
TELEMETRY_PATH = "/v1/tokenpace/telemetry"
READER_PATH = "/v1/tokenpace/reader"
QOE_PATH = "/v1/tokenpace/qoe"
METRICS_PATH = "/metrics"


class Access(enum.Enum):
    """The credential a route asks for."""

    TENANT = "a tenant's API key"
    ADMIN = "the admin key"
    TENANT_OR_ADMIN = "a tenant's API key or the admin key"
    REPORT = "a tenant's API key or the request's telemetry token"  # QoE, reader signals
    METRICS = "the metrics token, when one is configured"


_ROUTES = {
    "/v1/chat/completions": Access.TENANT,
    "/v1/completions": Access.TENANT,
    "/v1/models": Access.TENANT,
    TELEMETRY_PATH: Access.REPORT,
    READER_PATH: Access.REPORT,  # reader signals: the same credentials, the token not used up
    QOE_PATH: Access.TENANT_OR_ADMIN,
    METRICS_PATH: Access.METRICS,
}


def access_rule(path: str) -> Access | None:
    """What ``path`` asks of its caller, for every method; None: nothing (a public route,
    or no route at all)."""
    if path.startswith(ADMIN_PREFIX):
        return Access.ADMIN
    if path.startswith(MODELS_PREFIX):
        return Access.TENANT
    return _ROUTES.get(path)


tenant_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="TenantKey",
    description="The tenant's API key: `Authorization: Bearer KEY`.",
)
admin_bearer = HTTPBearer(
    auto_error=False, scheme_name="AdminKey", description="The operator's admin key."
)


def bearer_token(authorization: str | None) -> str | None:
    """The key of ``Bearer KEY``, or None for another scheme or no key."""
    scheme, _, key = (authorization or "").partition(" ")
    key = key.strip()
    return key if scheme.lower() == "bearer" and key else None


def matches(authorization: str | None, digest: str | None) -> bool:
    """``authorization`` is ``Bearer KEY`` with ``hash_key(KEY) == digest`` (constant time)."""
    key = bearer_token(authorization)
    if digest is None or key is None:
        return False
    return hmac.compare_digest(hash_key(key), digest)


class Authenticator:
    """Tenants by API key or telemetry token, the operator by the admin key, the metrics
    scraper by the metrics token."""

    def __init__(
        self,
        keys: KeyCache,
        tenants: Mapping[str, TenantConfig],
        tokens: TelemetryTokens,
        admin_digest: str | None,
        metrics_digest: str | None,
    ) -> None:
        self.keys = keys
        self.tenants = tenants
        self.tokens = tokens
        self.admin_digest = admin_digest
        self.metrics_digest = metrics_digest

    async def caller(self, rule: Access, authorization: str | None) -> Caller:
        """The caller ``rule`` admits with the ``Authorization`` header, else 401
        (StoreUnavailable when a tenant's key cannot be looked up)."""
        if rule is Access.ADMIN:
            if not matches(authorization, self.admin_digest):
                raise unauthorized("This route needs the gateway's admin key.")
            return Caller(admin=True)
        if rule is Access.METRICS:
            digest = self.metrics_digest
            if digest is not None and not matches(authorization, digest):
                raise unauthorized("/metrics needs the metrics token: Authorization: Bearer TOKEN.")
            return Caller()
        if rule is Access.TENANT_OR_ADMIN and matches(authorization, self.admin_digest):
            return Caller(admin=True)
        return Caller(tenant=await self._tenant(authorization))

    async def reporter(self, headers: Mapping[str, str], body: bytes) -> tuple[Caller, bytes]:
        """A QoE report's caller by its telemetry token (the header, else the body's
        field), and the body without the field; 401 without a valid token."""
        sent = split_token(headers, body)
        if sent.token is None:
            raise missing_telemetry_credentials(TOKEN_HEADER, BODY_FIELD)
        claims = await self.tokens.verify(sent.token)
        return Caller(tenant=self.tenants[claims.tenant], report_on=claims.request_id), sent.body

    async def _tenant(self, authorization: str | None) -> TenantConfig:
        """The tenant owning the Bearer key, else 401 (StoreUnavailable: no store)."""
        if not authorization:
            raise unauthorized(
                "You didn't provide an API key. You need to provide your API key in an "
                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
            )
        key = bearer_token(authorization)
        if key is None:
            raise unauthorized("The Authorization header must be 'Bearer YOUR_KEY'.")
        name = await self.keys.tenant(hash_key(key))
        tenant = self.tenants.get(name) if name is not None else None
        if tenant is None:
            raise unauthorized("Incorrect API key provided.")
        return tenant


def caller_of(request: Request) -> Caller:
    """The caller :class:`~gateway.http.gate.AccessGate` authenticated for this request."""
    caller = request_record(request.scope).caller
    assert caller is not None, "every route with an access rule is authenticated by the gate"
    return caller


def tenant_of(request: Request) -> TenantConfig:
    """The tenant calling a route of :attr:`Access.TENANT` (authenticated by the gate)."""
    tenant = caller_of(request).tenant
    assert tenant is not None, "a tenant's route admits tenants only"
    return tenant


# Route dependencies: they name the credential in the OpenAPI document (the gate has
# already checked it).


async def tenant_key(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(tenant_bearer)],
) -> TenantConfig:
    """The calling tenant (:func:`tenant_of`), for a route documented with the tenant key."""
    return tenant_of(request)


async def admin_key(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(admin_bearer)],
) -> None:
    """Documents a route's admin key (the gate checked it)."""
