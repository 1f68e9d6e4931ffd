"""A client of a running gateway's key administration (``tokenpace keys``).

The routes are :mod:`gateway.http.admin`'s (docs/protocol.md, "Admin API"): the tenants
and their key ids, a new key for a tenant, a key rotated or revoked. Every call sends the
admin key; every failure is an :class:`AdminCallFailed` whose message says what to fix
(the gateway's own error message, or that nothing answers at the URL).
"""

from __future__ import annotations

from typing import Any

import httpx

BASE_URL_ENV = "TOKENPACE_BASE_URL"  # as the examples: the gateway's URL, /v1 included
DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
TIMEOUT_S = 10.0


class AdminCallFailed(Exception):
    """An admin call failed; the message says why and what to do."""


class KeysClient:
    """The key routes of the gateway at ``base_url`` (``http://host:port/v1``)."""

    def __init__(
        self, base_url: str, admin_key: str, transport: httpx.BaseTransport | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=f"{self.base_url}/tokenpace/admin",
            headers={"Authorization": f"Bearer {admin_key}"},
            timeout=TIMEOUT_S,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def tenants(self) -> list[dict[str, Any]]:
        """Every tenant: name, weight, limits and its live key ids."""
        data: list[dict[str, Any]] = self._call("GET", "/tenants")["data"]
        return data

    def add(self, tenant: str) -> dict[str, Any]:
        """A new key for ``tenant``: ``{tenant, id, key}`` (the key is shown only now)."""
        return self._call("POST", f"/tenants/{tenant}/keys")

    def rotate(self, tenant: str, key_id: str) -> dict[str, Any]:
        """A new key, and ``key_id`` revoked: ``{tenant, id, key, revoked}``."""
        return self._call("POST", f"/tenants/{tenant}/keys/{key_id}/rotate")

    def revoke(self, tenant: str, key_id: str) -> dict[str, Any]:
        """``key_id`` of ``tenant`` revoked for good."""
        return self._call("DELETE", f"/tenants/{tenant}/keys/{key_id}")

    def _call(self, method: str, path: str) -> dict[str, Any]:
        try:
            response = self._http.request(method, path)
        except httpx.TransportError as exc:
            raise AdminCallFailed(
                f"No tokenpace gateway answers at {self.base_url} ({type(exc).__name__}). "
                f"Start one (`tokenpace serve`), or give its URL with --base-url or "
                f"{BASE_URL_ENV}."
            ) from None
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.is_success and isinstance(body, dict):
            return body
        error = body.get("error") if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        if response.status_code == 401:
            message = f"{message or 'Unauthorized.'} (the admin key given is not admin.key)"
        raise AdminCallFailed(
            f"{response.status_code}: {message or response.text[:200] or response.reason_phrase}"
        )
