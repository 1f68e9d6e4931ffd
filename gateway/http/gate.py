"""Who may call, then the body within its limit: the one place requests are authenticated.

:class:`AccessGate` sits inside CORS (its refusals carry the CORS headers a browser
needs to read them), in front of every route.
"""

from __future__ import annotations

import contextlib

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.config.schema import LimitsConfig, TelemetryConfig
from gateway.context import Caller, request_record
from gateway.errors import GatewayError
from gateway.http.auth import READER_PATH, Access, Authenticator, access_rule
from gateway.http.errors import COMPLETION_PATHS, Refused, answer, too_large
from gateway.relay.disconnect import ClientGone
from gateway.relay.reader import MAX_BODY_BYTES as READER_MAX_BODY_BYTES
from gateway.request.body import check_shape
from gateway.request.raw_json import check_raw_json
from gateway.store import StoreUnavailable, store_unavailable
from gateway.telemetry.errors import anonymous_bodies_busy
from gateway.telemetry.tokens import AnonymousBodies
from gateway.telemetry.tracing import TRACING_OFF, Tracing

_BODY_METHODS = {"POST", "PUT", "PATCH"}


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return None


class AccessGate:
    """Authenticate every request to a route that asks for a credential, then read its
    body within its limit.

    The credential comes from the headers and is checked before a byte of the body is
    read (401 else), so an unauthenticated client never costs the gateway body memory.
    The one exception is a QoE report or a reader signal without an ``Authorization``
    header: it may carry its telemetry token inside its body (a browser beacon cannot set
    headers), so that body is read first, within ``telemetry.max_body_bytes`` (a
    signal's: :data:`gateway.relay.reader.MAX_BODY_BYTES`) and, all such bodies
    together, ``telemetry.anonymous_bodies_max_bytes`` (:class:`AnonymousBodies`: 503
    past it, before any of it is read), and the token taken out of it. The caller is left
    on the request's record (:func:`~gateway.http.auth.caller_of`).
    Routes that ask for nothing, and routes the gateway does not have, never have their
    body read here. A body is read whole (413 past the limit, before any parsing) and
    replayed to the app; later ``receive()`` calls go to the server, so the app still
    sees ``http.disconnect``. A body that is not UTF-8 or nests deeper than the parsers
    can follow is a 400 before any of them reads it, credential or not.

    A completion request's body is JSON whatever its ``Content-Type`` says, as OpenAI's
    API reads it (``curl -d`` sends ``application/x-www-form-urlencoded``): the request is
    handed on as ``application/json``, so FastAPI parses it and a body that is not JSON
    gets the usual ``invalid_json`` answer.
    """

    def __init__(
        self,
        app: ASGIApp,
        auth: Authenticator,
        limits: LimitsConfig,
        telemetry: TelemetryConfig,
        refused: Refused,
        tracing: Tracing = TRACING_OFF,
    ) -> None:
        self.app = app
        self.auth = auth
        self.refused = refused  # a tenant's completion request answered here is one too
        self.limits = limits
        self.tracing = tracing  # the span tokenpace.authenticate
        self.max_body = limits.max_body_bytes
        self.max_report = min(limits.max_body_bytes, telemetry.max_body_bytes)
        self.max_signal = min(self.max_report, READER_MAX_BODY_BYTES)
        self.anonymous = AnonymousBodies(telemetry.anonymous_bodies_max_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rule = access_rule(scope.get("path", "")) if scope["type"] == "http" else None
        if rule is None:
            await self.app(scope, receive, send)
            return
        anonymous = (
            rule is Access.REPORT
            and scope.get("method") in _BODY_METHODS
            and header(scope, b"authorization") is None
        )
        if not anonymous:
            await self._serve(scope, receive, send, rule)
            return
        reserved = _announced(scope, self._report_limit(scope))
        if not self.anonymous.take(reserved):
            await answer(anonymous_bodies_busy(self.anonymous.max_bytes), scope, receive, send)
            return
        try:
            await self._serve(scope, receive, send, rule)
        finally:
            self.anonymous.give_back(reserved)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, rule: Access) -> None:
        limit = self._report_limit(scope) if rule is Access.REPORT else self.max_body
        with_body = scope.get("method") in _BODY_METHODS
        authorization = header(scope, b"authorization")
        completion = rule is Access.TENANT and scope.get("path") in COMPLETION_PATHS
        body: bytes | None = b""
        caller: Caller | None = None
        try:
            if rule is Access.REPORT and not authorization:
                if with_body:
                    body = await _read_json(scope, receive, limit)
                if body is not None:
                    with self.tracing.span("tokenpace.authenticate"):
                        caller, body = await self.auth.reporter(Headers(scope=scope), body)
            else:
                with self.tracing.span("tokenpace.authenticate"):
                    caller = await self.auth.caller(rule, authorization)
                plan = caller.tenant
                if plan is not None and plan.max_body_bytes is not None:
                    limit = plan.max_body_bytes
                if with_body:
                    body = await _read_json(scope, receive, limit)
                if completion and body and plan is not None:
                    max_messages = plan.max_messages or self.limits.max_messages
                    check_shape(body, max_messages, self.limits.max_parts)
        except GatewayError as exc:
            if caller is not None:  # refused after authentication: the tenant's
                request_record(scope).authenticated(caller)
                if completion and caller.tenant is not None:
                    exc = await self.refused(caller.tenant, exc)
            await answer(exc, scope, receive, send)
            return
        except StoreUnavailable as exc:
            await answer(store_unavailable(exc), scope, receive, send)
            return
        except ClientGone:
            await Response(status_code=499)(scope, receive, send)  # counted; nobody reads it
            return
        if body is None:
            refusal = too_large(limit)
            if caller is not None:
                request_record(scope).authenticated(caller)
                if completion and caller.tenant is not None:
                    refusal = await self.refused(caller.tenant, refusal)
            await answer(refusal, scope, receive, send)
            return
        assert caller is not None  # authenticated, or answered above
        request_record(scope).authenticated(caller)
        if with_body:
            receive = _replay(body, receive)
            if rule is Access.TENANT:
                scope = _as_json(scope)
        await self.app(scope, receive, send)

    def _report_limit(self, scope: Scope) -> int:
        """A QoE report's body limit, or a reader signal's (much smaller)."""
        return self.max_signal if scope.get("path") == READER_PATH else self.max_report


def _announced(scope: Scope, limit: int) -> int:
    """The body's announced length, within ``limit`` (``limit`` when not announced)."""
    length = header(scope, b"content-length")
    with contextlib.suppress(ValueError):
        if length is not None and 0 <= int(length) <= limit:
            return int(length)
    return limit


async def _read_json(scope: Scope, receive: Receive, limit: int) -> bytes | None:
    """:func:`_read_body`, then a 400 for a body that is not UTF-8 or nests too deep for
    the parsers (:mod:`gateway.request.raw_json`), before any of them runs."""
    body = await _read_body(scope, receive, limit)
    if body is not None:
        check_raw_json(body)
    return body


async def _read_body(scope: Scope, receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None when it is (or announces being) larger than ``limit``;
    raises :class:`ClientGone` when the client went away before its end."""
    length = header(scope, b"content-length")
    if length is not None:
        with contextlib.suppress(ValueError):
            if int(length) > limit:
                return None
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        part = message.get("body", b"")
        size += len(part)
        if size > limit:
            return None
        chunks.append(part)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


_JSON = (b"content-type", b"application/json")


def _as_json(scope: Scope) -> Scope:
    """``scope`` with its body declared JSON, unless it already is (``...json``,
    ``...+json``; parameters such as a charset are kept)."""
    headers = scope.get("headers", [])
    for key, value in headers:
        if key == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
            if media == b"application/json" or media.endswith(b"+json"):
                return scope
    return {**scope, "headers": [*(h for h in headers if h[0] != b"content-type"), _JSON]}


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
