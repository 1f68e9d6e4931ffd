"""Shared parts of the client SDK's integration tests (this module holds no tests).

The gateway is the real one (gateway.app) on its embedded SIMULATED engine
(gateway/backends/embedded.py: qos.sim under Andes, placeholder text; no model runs), started by
the tests on a loopback port: in the test's event loop for the async tests
(:func:`tests.support.gateway.gateway`), or in a thread of its own for the sync client
(:func:`gateway_thread`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from gateway.backends.embedded import EmbeddedEngine
from gateway.config.schema import DEMO_MODEL, GatewayConfig
from tests.support.gateway import Gateway, gateway, make_config

SLOW = "tokenpace-sim-slow"  # an engine slower than the chat tier's 4.8 tokens/s
HELLO = [{"role": "user", "content": "Hello!"}]


def embedded_config(**overrides: Any) -> GatewayConfig:
    """Two embedded engines: ``tokenpace-sim`` (~5 ms a token) and a slow one (~500 ms)."""
    return make_config(
        [
            {"name": "sim", "kind": "embedded", "models": [DEMO_MODEL]},
            {
                "name": "slow",
                "kind": "embedded",
                "models": [SLOW],
                # opt-66b: 40 ms a token at batch 1, run at 0.08x: ~500 ms a token
                "options": {"profile": "opt-66b-4xa100", "time_scale": 0.08},
            },
        ],
        **overrides,
    )


def engine(gw: Gateway, name: str = "sim") -> EmbeddedEngine:
    backend = next(b for b in gw.state.backends if b.name == name)
    assert isinstance(backend, EmbeddedEngine)
    return backend


def sequences(gw: Gateway, name: str = "sim") -> int:
    """Sequences the engine is generating now (an aborted request leaves at once)."""
    return engine(gw, name).stats()["sequences"]


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.001) -> float:
    """Seconds until ``predicate`` held (polled from this thread), or ``inf`` at ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(interval)
    return float("inf")


class RecordingTransport(httpx.HTTPTransport):
    """httpx's network transport that keeps every request it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return super().handle_request(request)


class GatewayThread:
    """A gateway served from a thread's own event loop; :meth:`stop` takes it down."""

    def __init__(self, config: GatewayConfig) -> None:
        self._config = config
        self._ready = threading.Event()
        self._out: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._runner, daemon=True)

    def _runner(self) -> None:
        async def main() -> None:
            async with gateway(self._config) as gw:
                self._out["gw"] = gw
                self._out["stop"] = asyncio.Event()
                self._out["loop"] = asyncio.get_running_loop()
                self._ready.set()
                await self._out["stop"].wait()

        try:
            asyncio.run(main())
        except BaseException as exc:  # surface start-up failures to the test
            self._out["error"] = exc
            self._ready.set()

    def start(self) -> Gateway:
        self._thread.start()
        self._ready.wait(20)
        if "error" in self._out:
            raise self._out["error"]
        return self._out["gw"]

    def stop(self) -> None:
        if self._thread.is_alive():
            self._out["loop"].call_soon_threadsafe(self._out["stop"].set)
            self._thread.join(10)


@contextlib.contextmanager
def gateway_thread(config: GatewayConfig | None = None) -> Iterator[tuple[Gateway, GatewayThread]]:
    runner = GatewayThread(config or embedded_config())
    gw = runner.start()
    try:
        yield gw, runner
    finally:
        runner.stop()
