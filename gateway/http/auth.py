"""Who is calling: a tenant by its API key, or the operator by the admin key.

``Authorization: Bearer KEY``: a tenant's key is looked up by its SHA-256 digest in
the store (cached per replica, :class:`~gateway.http.keys.KeyCache`); the admin key is
compared with ``admin.key_sha256`` in constant time.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gateway.config.schema import TenantConfig, hash_key
from gateway.errors import unauthorized
from gateway.http.keys import KeyCache

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
    """Tenants by API key, the operator by the admin key."""

    def __init__(
        self, keys: KeyCache, tenants: Mapping[str, TenantConfig], admin_digest: str | None
    ) -> None:
        self.keys = keys
        self.tenants = tenants
        self.admin_digest = admin_digest

    def is_admin(self, authorization: str | None) -> bool:
        return matches(authorization, self.admin_digest)

    async def tenant(self, authorization: str | None) -> TenantConfig:
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

    def admin_dependency(self) -> Callable[..., Awaitable[None]]:
        """A route dependency: 401 unless the request carries the admin key."""

        async def require_admin(
            request: Request,
            credentials: Annotated[HTTPAuthorizationCredentials | None, Security(admin_bearer)],
        ) -> None:
            if not self.is_admin(request.headers.get("authorization")):
                raise unauthorized("This route needs the gateway's admin key.")

        return require_admin
