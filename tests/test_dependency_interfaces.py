"""The private parts of dependencies that the code overrides still exist where it expects
them (pyproject.toml pins these dependencies; a version bump that moves them fails here,
not silently: an override of a method that is gone is never called)."""

from __future__ import annotations

import inspect

import openai
import pytest
from sse_starlette.sse import EventSourceResponse
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.completions import RelayResponse
from gateway.server import GuardedHttpToolsProtocol


def _overridden(cls: type, base: type) -> list[str]:
    """Methods ``cls`` defines itself that ``base`` also defines."""
    return [name for name in vars(cls) if callable(vars(cls)[name]) and hasattr(base, name)]


def test_relay_response_overrides_sse_starlettes_send() -> None:
    assert "_send_with_timeout" in _overridden(RelayResponse, EventSourceResponse)
    params = inspect.signature(EventSourceResponse._send_with_timeout).parameters
    assert list(params) == ["self", "send", "message"]


def test_guarded_protocol_overrides_uvicorns_methods() -> None:
    hooks = {
        "connection_made",
        "connection_lost",
        "data_received",
        "on_message_begin",
        "on_headers_complete",
        "on_body",
        "on_message_complete",
        "on_response_complete",
    }
    assert hooks <= set(_overridden(GuardedHttpToolsProtocol, HttpToolsProtocol))


@pytest.mark.parametrize("client", [openai.OpenAI, openai.AsyncOpenAI])
def test_openai_parts_the_drop_in_clients_use(client: type) -> None:
    assert callable(getattr(client, "_prepare_options", None))
    assert "_extra_kwargs" in inspect.signature(client.copy).parameters
    chat = client(api_key="k", base_url="http://127.0.0.1:9").chat.completions
    assert isinstance(chat._client, client)
