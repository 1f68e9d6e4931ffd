"""Drop-in replacements for openai's clients: change the import, get paced streams.

``tokenpace_client.OpenAI`` / ``AsyncOpenAI`` accept everything openai's clients accept,
plus ``tier=`` (the default tier, sent as ``tokenpace.tier`` in the body of every
completions request that names no tier of its own, by header or body) and the pacing
options of :func:`tokenpace_client.pace` (``unit``, ``end``, ``max_drain_s``,
``telemetry``).
``client.chat.completions.create(..., stream=True)`` returns a paced stream, and takes
``on_queued=`` (a callback for the gateway's queue notices, :func:`tokenpace_client.pace`)
besides openai's arguments; everything else (non-streaming calls, ``with_raw_response``,
other resources) is openai's, unchanged. The default tier goes through openai's
``_prepare_options`` hook, queue notices through a stream's SSE decoder (pinned: openai 3.x).
"""

from __future__ import annotations

import time
from functools import cached_property
from typing import Any

import openai
from openai.resources.chat import AsyncChat, AsyncCompletions, Chat, Completions

from tokenpace_client.headers import MAX_DRAIN_S, resolve
from tokenpace_client.stream import AsyncPacedStream, OnQueued, PacedStream, apace, pace

_TIER_HEADER = "x-tokenpace-tier"


def _with_default_tier(options: Any, tier: str | None) -> Any:
    """``options`` with ``tokenpace: {"tier": tier}`` added to a completions body naming no tier."""
    if tier is None or options.method.lower() != "post":
        return options
    if not options.url.rstrip("/").endswith("completions"):
        return options
    body, extra = options.json_data, options.extra_json or {}
    if not isinstance(body, dict) or "tokenpace" in body or "tokenpace" in extra:
        return options
    headers = options.headers if isinstance(options.headers, dict) else {}
    if any(str(k).lower() == _TIER_HEADER for k in headers):
        return options
    return options.model_copy(update={"extra_json": {**extra, "tokenpace": {"tier": tier}}})


def _pacing(client: object) -> dict[str, Any]:
    """The pacing options of the drop-in client that a resource belongs to."""
    if not isinstance(client, _TokenpaceOptions):
        raise TypeError(f"a paced resource of {type(client).__name__}, not a tokenpace client")
    return client._tokenpace_pacing


def _on_queued(kwargs: dict[str, Any]) -> OnQueued | None:
    """Take ``on_queued`` out of a create call's arguments; only a stream gets notices."""
    on_queued: OnQueued | None = kwargs.pop("on_queued", None)
    if on_queued is not None and kwargs.get("stream") is not True:
        raise TypeError("on_queued: queue notices come only with stream=True")
    if on_queued is not None and not callable(on_queued):
        raise TypeError(f"on_queued: expected a callable, got {type(on_queued).__name__}")
    return on_queued


class _PacedCompletions(Completions):
    def create(self, **kwargs: Any) -> Any:
        on_queued = _on_queued(kwargs)
        if kwargs.get("stream") is not True:
            return super().create(**kwargs)
        sent_at = time.monotonic()
        stream = super().create(**kwargs)
        if not isinstance(stream, openai.Stream):  # e.g. a raw response: unchanged
            return stream
        return pace(stream, sent_at=sent_at, on_queued=on_queued, **_pacing(self._client))


class _PacedChat(Chat):
    @cached_property
    def completions(self) -> _PacedCompletions:
        return _PacedCompletions(self._client)


class _AsyncPacedCompletions(AsyncCompletions):
    async def create(self, **kwargs: Any) -> Any:
        on_queued = _on_queued(kwargs)
        if kwargs.get("stream") is not True:
            return await super().create(**kwargs)
        sent_at = time.monotonic()
        stream = await super().create(**kwargs)
        if not isinstance(stream, openai.AsyncStream):
            return stream
        return apace(stream, sent_at=sent_at, on_queued=on_queued, **_pacing(self._client))


class _AsyncPacedChat(AsyncChat):
    @cached_property
    def completions(self) -> _AsyncPacedCompletions:
        return _AsyncPacedCompletions(self._client)


class _TokenpaceOptions:
    """What both drop-in clients add to openai's: ``tier=`` and the pacing options, kept
    across ``copy``/``with_options``. Placed before openai's client in the bases."""

    def __init__(
        self,
        *args: Any,
        tier: str | None = None,
        unit: str = "token",
        end: str = "drain",
        max_drain_s: float | None = MAX_DRAIN_S,
        telemetry: Any = True,
        **kwargs: Any,
    ) -> None:
        # ValueError naming a bad argument
        resolve({}, tds=None, ttft=None, unit=unit, end=end, max_drain_s=max_drain_s)
        self.tier = tier
        self._tokenpace_pacing: dict[str, Any] = {
            "unit": unit,
            "end": end,
            "max_drain_s": max_drain_s,
            "telemetry": telemetry,
        }
        super().__init__(*args, **kwargs)

    def copy(self, *args: Any, _extra_kwargs: Any = None, **kwargs: Any) -> Any:
        extra = {"tier": self.tier, **self._tokenpace_pacing, **(_extra_kwargs or {})}
        return super().copy(*args, _extra_kwargs=extra, **kwargs)  # type: ignore[misc]

    with_options = copy


class OpenAI(_TokenpaceOptions, openai.OpenAI):
    """``openai.OpenAI`` whose streaming chat completions are paced (:class:`PacedStream`)."""

    @cached_property
    def chat(self) -> _PacedChat:
        return _PacedChat(self)

    def _prepare_options(self, options: Any) -> Any:
        return _with_default_tier(super()._prepare_options(options), self.tier)


class AsyncOpenAI(_TokenpaceOptions, openai.AsyncOpenAI):
    """``openai.AsyncOpenAI`` whose streaming chat completions are paced (async)."""

    @cached_property
    def chat(self) -> _AsyncPacedChat:
        return _AsyncPacedChat(self)

    async def _prepare_options(self, options: Any) -> Any:
        return _with_default_tier(await super()._prepare_options(options), self.tier)


__all__ = ["AsyncOpenAI", "AsyncPacedStream", "OpenAI", "PacedStream"]
