"""Telemetry tokens: a QoE report authenticated without the tenant's API key.

A web page must never hold a tenant's API key; usually it talks to its own backend,
which calls the gateway and relays the stream. Every completions response therefore
carries ``X-TokenPace-Telemetry-Token``, which the backend passes on with the stream,
and the page's SDK authenticates its report on that one request with it
(docs/protocol.md, "Telemetry token").

The token is ``tpt1.<payload>.<signature>``: ``payload`` is the base64url of
``<request id>.<expiry, unix seconds>.<tenant>`` and ``signature`` the base64url of
HMAC-SHA256 over ``tpt1.<payload>`` with a secret every replica shares:
``telemetry.token_secret``, else one created once in the shared store (set if absent,
so every replica on one Redis uses the same; per process for the memory store). It is
bound to the request and its tenant, lives ``telemetry.token_ttl_s`` and is single use:
the store keeps one client report per request.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import orjson

from gateway.config.schema import TelemetryConfig
from gateway.errors import GatewayError
from gateway.store import Store, StoreUnavailable
from gateway.telemetry.errors import invalid_token

TOKEN_HEADER = "X-TokenPace-Telemetry-Token"
BODY_FIELD = "telemetry_token"  # where a sendBeacon report (no headers) carries it
SECRET_NAME = "telemetry_token"
_VERSION = "tpt1"
VERIFIED_MAX = 10_000  # tokens whose signature was checked, kept (oldest forgotten first)


@dataclass(frozen=True, slots=True)
class TokenClaims:
    """What a valid token vouches for."""

    request_id: str
    tenant: str
    expires: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign(secret: bytes, claims: TokenClaims) -> str:
    """The token for ``claims``."""
    payload = _b64(f"{claims.request_id}.{claims.expires}.{claims.tenant}".encode())
    signed = f"{_VERSION}.{payload}"
    mac = hmac.new(secret, signed.encode(), hashlib.sha256).digest()
    return f"{signed}.{_b64(mac)}"


def _invalid(message: str) -> GatewayError:
    return invalid_token(message, BODY_FIELD)


def verify(secret: bytes, token: str, now: float) -> TokenClaims:
    """The claims of a token signed with ``secret``; 401 when forged, malformed or expired."""
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != _VERSION:
        raise _invalid(
            f"The telemetry token is malformed: send the response's {TOKEN_HEADER} unchanged."
        )
    signed = f"{parts[0]}.{parts[1]}"
    mac = hmac.new(secret, signed.encode(), hashlib.sha256).digest()
    try:
        given = _unb64(parts[2])
        request_id, expires, tenant = _unb64(parts[1]).decode().split(".", 2)
        claims = TokenClaims(request_id, tenant, int(expires))
    except (binascii.Error, UnicodeDecodeError, ValueError):
        given, claims = b"", None
    if claims is None or not hmac.compare_digest(mac, given):
        raise _invalid("The telemetry token is not valid: it was not issued by this gateway.")
    if now >= claims.expires:
        raise _invalid(
            "The telemetry token has expired: report within telemetry.token_ttl_s of the "
            "response, or authenticate with the API key."
        )
    return claims


class TelemetryTokens:
    """Issues and verifies the tokens of one gateway (see the module docstring)."""

    def __init__(self, cfg: TelemetryConfig, store: Store, tenants: Collection[str]) -> None:
        self.store = store
        self.tenants = tenants
        self.ttl_s = cfg.token_ttl_s
        configured = cfg.token_secret
        self._secret: bytes | None = configured.encode() if configured else None
        self._lock = asyncio.Lock()
        self._verified: OrderedDict[str, TokenClaims] = OrderedDict()  # token -> its claims

    async def secret(self) -> bytes:
        """The shared secret (fetched from, or created in, the store once); StoreUnavailable."""
        if self._secret is None:
            async with self._lock:
                if self._secret is None:
                    candidate = secrets.token_hex(32)
                    shared = await self.store.shared_secret(SECRET_NAME, candidate)
                    self._secret = shared.encode()
        return self._secret

    async def header(self, request_id: str, tenant: str) -> dict[str, str]:
        """The response header carrying a new token; none while the store is unreachable."""
        try:
            secret = await self.secret()
        except StoreUnavailable:
            return {}
        claims = TokenClaims(request_id, tenant, int(time.time()) + self.ttl_s)
        return {TOKEN_HEADER: sign(secret, claims)}

    async def verify(self, token: str) -> TokenClaims:
        """The token's claims; 401 when forged, malformed, expired or its tenant is gone.

        A stream's client sends its token with every reader signal, several a second: the
        claims of the last :data:`VERIFIED_MAX` tokens verified are kept, so each token's
        signature is checked once (its expiry and tenant every time)."""
        token = token.strip()
        now = time.time()
        claims = self._verified.get(token)
        if claims is None:
            claims = verify(await self.secret(), token, now)
            self._verified[token] = claims
            if len(self._verified) > VERIFIED_MAX:
                self._verified.popitem(last=False)
        elif now >= claims.expires:
            verify(await self.secret(), token, now)  # raises: expired
        if claims.tenant not in self.tenants:
            raise _invalid("The telemetry token's tenant no longer exists.")
        return claims


@dataclass(frozen=True, slots=True)
class TokenReport:
    """A report that came with a token: the token (if any) and the body without it."""

    token: str | None
    body: bytes


def split_token(headers: Mapping[str, str], body: bytes) -> TokenReport:
    """The token from the header, else from the body's ``telemetry_token`` (a beacon's).

    The body returned no longer holds the field, so the report's strict schema applies
    to the rest as to any report.
    """
    token = headers.get(TOKEN_HEADER.lower())
    if token:
        return TokenReport(token, body)
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return TokenReport(None, body)
    if not isinstance(data, dict) or BODY_FIELD not in data:
        return TokenReport(None, body)
    token = data.pop(BODY_FIELD)
    if not isinstance(token, str) or not token:
        raise _invalid(f"'{BODY_FIELD}' must be the token string of the response's header.")
    return TokenReport(token, orjson.dumps(data))


class AnonymousBodies:
    """The bytes of report bodies being read without a credential, in this process.

    A beacon cannot set headers, so a report may carry its telemetry token in its body,
    and that body is read before anyone is known (:class:`gateway.http.gate.AccessGate`).
    Each such body reserves its announced length (or the report limit, when chunked) for
    as long as its request lasts; once ``telemetry.anonymous_bodies_max_bytes`` are
    reserved, the next one is refused (503) before a byte of it is read.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held = 0

    def take(self, n: int) -> bool:
        if self.held + n > self.max_bytes:
            return False
        self.held += n
        return True

    def give_back(self, n: int) -> None:
        self.held -= n
