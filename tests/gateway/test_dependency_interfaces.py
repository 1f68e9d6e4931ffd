"""The private parts of dependencies that the code overrides still exist where it expects
them (pyproject.toml pins these dependencies; a version bump that moves them fails here,
not silently: an override of a method that is gone is never called)."""

from __future__ import annotations

import inspect

import openai
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.runtime.server import GuardedHttpToolsProtocol
from gateway.telemetry.metrics import observe_many


def _overridden(cls: type, base: type) -> list[str]:
    """Methods ``cls`` defines itself that ``base`` also defines."""
    return [name for name in vars(cls) if callable(vars(cls)[name]) and hasattr(base, name)]


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
        "_start_asgi_task",  # HTTP/1.0: a close-delimited body
        "shutdown",  # the drain begins
    }
    assert hooks <= set(_overridden(GuardedHttpToolsProtocol, HttpToolsProtocol))


@pytest.mark.parametrize("client", [openai.OpenAI, openai.AsyncOpenAI])
def test_openai_parts_the_drop_in_clients_use(client: type) -> None:
    assert callable(getattr(client, "_prepare_options", None))
    assert "_extra_kwargs" in inspect.signature(client.copy).parameters
    chat = client(api_key="k", base_url="http://127.0.0.1:9").chat.completions
    assert isinstance(chat._client, client)


def test_observe_many_matches_prometheus_observe() -> None:
    """The bulk update writes prometheus-client's private buckets: same exposition."""
    values = [0.0, 0.001, 0.0011, 0.04, 0.04, 0.5, 2.5, 2.6, 40.0, 0.0]
    exposed = []
    for bulk in (False, True):
        registry = CollectorRegistry()
        h = Histogram(
            "gap_seconds", "gaps", ["tier"], buckets=(0.001, 0.04, 2.5), registry=registry
        )
        child = h.labels("chat")
        if bulk:
            observe_many(child, values)
        else:
            for value in values:
                child.observe(value)
        exposed.append(
            [
                line
                for line in generate_latest(registry).decode().splitlines()
                if "created" not in line
            ]
        )
    assert exposed[0] == exposed[1]
    assert 'gap_seconds_bucket{le="0.04",tier="chat"} 6.0' in exposed[1]
