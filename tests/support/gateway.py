"""A running gateway for the tests (this module holds no tests of its own).

- :func:`make_config` and :func:`backend_entry`: a gateway configuration in front of
  given upstreams (two tenants: ``acme`` with :data:`KEY`, ``basic`` with
  :data:`KEY_BASIC`).
- :func:`gateway`: the gateway on a real uvicorn in the test's event loop, as
  ``tokenpace serve`` runs it (:func:`tests.support.servers.run_server`);
  :func:`gateway_in_thread`: with an upstream, in a thread of its own (for synchronous
  clients).
- :func:`sse_lines`, :func:`data_events`: an SSE response read back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.app import Gateway as GatewayComponents
from gateway.app import create_app
from gateway.backends import Backend
from gateway.config.loader import parse_config
from gateway.config.schema import GatewayConfig, hash_key
from tests.support.fake_upstream import MODEL, FakeUpstream, upstream
from tests.support.servers import run_server

KEY = "tp-test-key-acme-0001"  # tenant acme: every tier, custom (widest range), weight 2
KEY_BASIC = "tp-test-key-basic-0002"  # tenant basic: chat and batch only


def backend_entry(fake: FakeUpstream | str, name: str, **extra: Any) -> dict[str, Any]:
    url = fake if isinstance(fake, str) else fake.url
    models = list(fake.models) if isinstance(fake, FakeUpstream) else [MODEL]
    return {"name": name, "url": f"{url}/v1", "models": models, "health_path": "/health", **extra}


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def make_config(backends: list[dict[str, Any]], **overrides: Any) -> GatewayConfig:
    data: dict[str, Any] = {
        "tenants": [
            {
                "name": "acme",
                "api_keys": [KEY],
                "weight": 2.0,
                "allow_custom": True,
                "custom_tier_limits": {},  # the widest range (TTFT 0-600 s, TDS 0.1-1000)
            },
            {
                "name": "basic",
                "api_keys": [{"key_sha256": hash_key(KEY_BASIC)}],
                "tiers": ["chat", "batch"],
                "default_tier": "chat",
            },
        ],
        "backends": backends,
        "timeouts": {
            "connect_s": 1.0,
            "first_byte_s": 5.0,
            "idle_s": 5.0,
            "request_s": 10.0,
            "ping_interval_s": 5.0,
        },
        "health": {"interval_s": 30.0, "timeout_s": 0.5},
        "limits": {"max_body_bytes": 64 * 1024, "max_tokens": 4096, "max_n": 4},
    }
    return parse_config(_merge(data, overrides))


@dataclass
class Gateway:
    url: str
    app: Any

    @property
    def state(self) -> GatewayComponents:
        return self.app.state.gateway

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def client(self, key: str = KEY, **kwargs: Any) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        # verify=False: plain-HTTP loopback; skips loading the CA bundle (~30 ms a client)
        return httpx.AsyncClient(
            base_url=self.url, headers=headers, timeout=10.0, verify=False, **kwargs
        )


@asynccontextmanager
async def gateway(
    config: GatewayConfig, backends: list[Backend] | None = None
) -> AsyncIterator[Gateway]:
    app = create_app(config, backends=backends)
    async with run_server(app, config) as url:
        yield Gateway(url, app)


@contextlib.contextmanager
def gateway_in_thread(config_factory: Any) -> Iterator[tuple[Gateway, FakeUpstream]]:
    """Upstream and gateway in a thread of their own (for the synchronous openai client)."""
    ready = threading.Event()
    stop: dict[str, Any] = {}
    out: dict[str, Any] = {}

    async def main() -> None:
        async with upstream() as fake, gateway(config_factory(fake)) as gw:
            out["value"] = (gw, fake)
            stop["event"] = asyncio.Event()
            stop["loop"] = asyncio.get_running_loop()
            ready.set()
            await stop["event"].wait()

    def runner() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # surface start-up failures to the test
            out["error"] = exc
            ready.set()

    thread = threading.Thread(target=runner, daemon=True)
    thread.start()
    ready.wait(10)
    if "error" in out:
        raise out["error"]
    try:
        yield out["value"]
    finally:
        stop["loop"].call_soon_threadsafe(stop["event"].set)
        thread.join(10)


async def sse_lines(resp: httpx.Response) -> list[str]:
    """Every non-empty line of an SSE response."""
    return [line async for line in resp.aiter_lines() if line]


def data_events(lines: list[str]) -> list[Any]:
    out: list[Any] = []
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out
